// The one conversion between Keras' MultiHeadAttention / Dense weights and PyTorch's
// (qkv/nn/keras_layers.h, qkv/nn/keras_mha.h): a reshape + transpose per kernel (heads
// flatten head-major in both, so no head permutation), dtypes kept. The file-level
// conversions (qkv convert) and the layer objects' run through keras_mha_to_torch /
// torch_mha_to_keras, so one set of checks and messages covers both.
#include <algorithm>
#include <vector>

#include "qkv/nn/keras_layers.h"
#include "qkv/nn/keras_mha.h"
#include "qkv/nn/mha.h"

namespace qkv::nn {

namespace {

// "layer 'mha'" in messages, or "the layer" for a lone layer's weights.
std::string label(const std::string& layer) { return layer.empty() ? "the layer" : "layer '" + layer + "'"; }

const Tensor& need(const std::map<std::string, Tensor>& w, const std::string& layer, const std::string& name) {
  const auto it = w.find(name);
  if (it == w.end()) fail<ValueError>("keras_to_torch: ", label(layer), " has no weight '", name, "'");
  return it->second;
}

// Row blocks stacked into one new tensor of `dtype` ([r0 + r1 + ..., rest...]).
Tensor cat_rows(const std::vector<Tensor>& parts, DType dtype) {
  int64_t rows = 0;
  for (const Tensor& p : parts) rows += p.size(0);
  Shape shape = parts[0].shape();
  shape[0] = rows;
  Tensor out = Tensor::empty(shape, dtype);
  int64_t r = 0;
  for (const Tensor& p : parts) {
    out.slice(0, r, r + p.size(0)).copy_from(p);
    r += p.size(0);
  }
  return out;
}

constexpr const char* kQkv[] = {"query", "key", "value"};

// The biases are all there or none is (use_bias = false).
bool keras_has_biases(const std::map<std::string, Tensor>& w, const std::string& layer) {
  int found = 0;
  for (const char* part : kKerasMhaParts) found += w.count(std::string(part) + "/bias") ? 1 : 0;
  if (found == 0) return false;
  for (const char* part : kKerasMhaParts) need(w, layer, std::string(part) + "/bias");
  return true;
}

}  // namespace

std::map<std::string, Tensor> keras_mha_to_torch(const std::map<std::string, Tensor>& w, const std::string& layer) {
  if (w.count(std::string(kKerasMhaGatePart) + "/kernel")) {
    fail<ValueError>("keras_to_torch: ", label(layer),
                     " has a gate (Keras' use_gate); torch.nn.MultiheadAttention has no such layer");
  }
  const Tensor& qk = need(w, layer, "query/kernel");  // [E, N, H]
  if (qk.dim() != 3)
    fail<ValueError>("keras_to_torch: ", label(layer), ": query kernel ", shape_str(qk.shape()), " is not [E, N, H]");
  const int64_t e = qk.size(0), n = qk.size(1), h = qk.size(2);
  if (n * h != e) {
    fail<ValueError>("keras_to_torch: ", label(layer), ": num_heads * key_dim = ", n, " * ", h, " != embed dim ", e,
                     "; torch.nn.MultiheadAttention has no such layout (it needs num_heads * key_dim == dim == "
                     "num_heads * value_dim, equal input sizes and output_shape == dim)");
  }
  const bool bias = keras_has_biases(w, layer);
  std::vector<Tensor> in_w, in_b;
  for (const char* part : kQkv) {
    const Tensor& k = need(w, layer, std::string(part) + "/kernel");  // [E_in, N, H]
    const Shape bias_shape = bias ? w.at(std::string(part) + "/bias").shape() : Shape{n, h};
    if (k.shape() != qk.shape() || bias_shape != Shape{n, h}) {
      fail<ValueError>("keras_to_torch: ", label(layer), ": ", part, " kernel ", shape_str(k.shape()), " / bias ",
                       shape_str(bias_shape), " do not match the query's [", e, ", ", n, ", ", h,
                       "] (kdim/vdim/value_dim differ)");
    }
    in_w.push_back(k.reshape({e, e}).transpose(0, 1));  // [E_out, E_in]: torch rows are output features
    if (bias) in_b.push_back(w.at(std::string(part) + "/bias").reshape({e}));
  }
  const Tensor& ok = need(w, layer, "attention_output/kernel");  // [N, H, E]
  const Shape ob_shape = bias ? w.at("attention_output/bias").shape() : Shape{e};
  if (ok.shape() != Shape{n, h, e} || ob_shape != Shape{e}) {
    fail<ValueError>("keras_to_torch: ", label(layer), ": output kernel ", shape_str(ok.shape()), " is not [", n, ", ",
                     h, ", ", e, "] (output_shape differs from the input)");
  }
  std::map<std::string, Tensor> sd;
  sd["in_proj_weight"] = cat_rows(in_w, qk.dtype());                                       // [3E, E] rows q | k | v
  sd["out_proj.weight"] = ok.reshape({e, e}).transpose(0, 1).contiguous().to(qk.dtype());  // [E_out, N*H]
  if (bias) {
    sd["in_proj_bias"] = cat_rows(in_b, qk.dtype());  // [3E]
    sd["out_proj.bias"] = w.at("attention_output/bias").contiguous();
  }
  return sd;
}

namespace {

const Tensor& need_torch(const std::map<std::string, Tensor>& sd, const std::string& prefix, const std::string& name) {
  const auto it = sd.find(name);
  if (it == sd.end()) fail<ValueError>("torch_to_keras: '", prefix + name, "' is missing");
  return it->second;
}

// The q, k, v projection weights [E, E_in] of a packed or separate state dict.
std::vector<Tensor> torch_projections(const std::map<std::string, Tensor>& sd, const std::string& prefix) {
  if (sd.count("in_proj_weight")) {
    const Tensor& w = sd.at("in_proj_weight");  // [3E, E]
    if (w.dim() != 2 || w.size(0) != 3 * w.size(1)) {
      fail<ValueError>("torch_to_keras: '", prefix, "in_proj_weight' ", shape_str(w.shape()), " is not [3E, E]");
    }
    const int64_t e = w.size(1);
    return {w.slice(0, 0, e), w.slice(0, e, 2 * e), w.slice(0, 2 * e, 3 * e)};
  }
  std::vector<Tensor> proj;
  for (const char* name : {"q_proj_weight", "k_proj_weight", "v_proj_weight"}) {
    const Tensor& p = need_torch(sd, prefix, name);
    if (p.dim() != 2 || p.size(0) != (proj.empty() ? p.size(1) : proj[0].size(0))) {
      fail<ValueError>("torch_to_keras: '", prefix, name, "' ", shape_str(p.shape()), " is not [E, ",
                       proj.empty() ? "E" : "kdim/vdim", "]");
    }
    proj.push_back(p);
  }
  return proj;
}

}  // namespace

std::map<std::string, Tensor> torch_mha_to_keras(const std::map<std::string, Tensor>& sd, int64_t num_heads,
                                                 const std::string& prefix) {
  for (const char* kv : {"bias_k", "bias_v"}) {
    if (sd.count(kv)) fail<ValueError>("torch_to_keras: '", prefix, kv, "': Keras has no add_bias_kv / add_zero_attn");
  }
  const std::vector<Tensor> proj = torch_projections(sd, prefix);  // 3 x [E, E_in]
  const int64_t e = proj[0].size(0);
  if (num_heads < 1 || e % num_heads != 0) {
    fail<ValueError>("torch_to_keras: embed dim ", e, " is not divisible by num_heads ", num_heads);
  }
  const int64_t n = num_heads, d = e / num_heads;
  const bool bias = sd.count("in_proj_bias") || sd.count("out_proj.bias");
  const Tensor& ow = need_torch(sd, prefix, "out_proj.weight");                  // [E, E]
  const Tensor in_b = bias ? need_torch(sd, prefix, "in_proj_bias") : Tensor();  // [3E]
  const Tensor ob = bias ? need_torch(sd, prefix, "out_proj.bias") : Tensor();   // [E]
  if (ow.shape() != Shape{e, e} || (bias && (in_b.shape() != Shape{3 * e} || ob.shape() != Shape{e}))) {
    fail<ValueError>(
        "torch_to_keras: '", prefix, "out_proj.weight' ", shape_str(ow.shape()),
        bias ? " / in_proj_bias " + shape_str(in_b.shape()) + " / out_proj.bias " + shape_str(ob.shape()) : "",
        " do not match embed dim ", e);
  }
  std::map<std::string, Tensor> out;
  for (int64_t p = 0; p < 3; ++p) {
    const Tensor& w = proj[static_cast<size_t>(p)];  // [E, E_in]
    const std::string part = kQkv[p];
    out[part + "/kernel"] = w.transpose(0, 1).contiguous().view({w.size(1), n, d});  // [E_in, N, H]
    if (bias) out[part + "/bias"] = in_b.slice(0, p * e, (p + 1) * e).contiguous().view({n, d});
  }
  out["attention_output/kernel"] = ow.transpose(0, 1).contiguous().view({n, d, e});  // [N, H, E]
  if (bias) out["attention_output/bias"] = ob.contiguous();
  return out;
}

std::map<std::string, Tensor> keras_to_torch(const LayerWeights& layers) {
  std::map<std::string, Tensor> out;
  for (const auto& [layer, w] : layers) {
    if (w.count("query/kernel")) {
      for (auto& [name, t] : keras_mha_to_torch(w, layer)) out[layer + "." + name] = std::move(t);
      continue;
    }
    for (const auto& [name, t] : w) {
      if (name == "kernel" && t.dim() == 2)
        out[layer + ".weight"] = t.transpose(0, 1).contiguous();
      else if (name == "bias")
        out[layer + ".bias"] = t.contiguous();
      else
        fail<ValueError>("keras_to_torch: layer '", layer, "' weight '", name, "' ", shape_str(t.shape()),
                         " has no PyTorch equivalent qkv knows");
    }
  }
  return out;
}

namespace {

constexpr const char* kTorchMhaNames[] = {"in_proj_weight", "q_proj_weight", "k_proj_weight",
                                          "v_proj_weight",  "in_proj_bias",  "out_proj.weight",
                                          "out_proj.bias",  "bias_k",        "bias_v"};

// The prefixes ("mha.", "") of the MultiheadAttention layers in a state dict.
std::vector<std::string> torch_mha_prefixes(const std::map<std::string, Tensor>& sd) {
  std::vector<std::string> out;
  for (const auto& [key, t] : sd) {
    for (const std::string_view name : {"in_proj_weight", "q_proj_weight"}) {
      if (key.ends_with(name)) out.push_back(key.substr(0, key.size() - name.size()));
    }
  }
  return out;
}

}  // namespace

LayerWeights torch_to_keras(const std::map<std::string, Tensor>& sd, int64_t num_heads) {
  LayerWeights out;
  std::vector<std::string> done;
  for (const std::string& prefix : torch_mha_prefixes(sd)) {
    std::map<std::string, Tensor> layer_sd;  // this layer's keys without the prefix
    for (const char* name : kTorchMhaNames) {
      const auto it = sd.find(prefix + name);
      if (it == sd.end()) continue;
      layer_sd[name] = it->second;
      done.push_back(it->first);
    }
    std::string layer = prefix.ends_with(".") ? prefix.substr(0, prefix.size() - 1) : prefix;
    if (layer.empty()) layer = "multi_head_attention";
    out[layer] = torch_mha_to_keras(layer_sd, num_heads, prefix);
  }
  for (const auto& [key, t] : sd) {
    if (std::find(done.begin(), done.end(), key) != done.end()) continue;
    if (key.ends_with(".weight") && t.dim() == 2)
      out[key.substr(0, key.size() - 7)]["kernel"] = t.transpose(0, 1).contiguous();
    else if (key.ends_with(".bias"))
      out[key.substr(0, key.size() - 5)]["bias"] = t.contiguous();
    else
      fail<ValueError>("torch_to_keras: '", key, "' ", shape_str(t.shape()), " has no Keras equivalent qkv knows");
  }
  return out;
}

std::map<std::string, Tensor> keras_to_torch_state_dict(const KerasMultiHeadAttention& layer) {
  const KerasMultiHeadAttentionConfig& c = layer.config();
  if (!layer.built()) fail<ValueError>("keras_to_torch_state_dict: needs a built layer");
  if (c.attention_axes.size() > 1) {
    fail<ValueError>("keras_to_torch_state_dict: PyTorch's layout attends over one axis; got ", c.attention_axes.size(),
                     " attention_axes");
  }
  const std::vector<Tensor> w = layer.get_weights();  // get_weights() order, biases only with use_bias
  const std::vector<std::string> names = keras_mha_weight_names(c.use_bias, c.use_gate);
  std::map<std::string, Tensor> named;
  for (size_t i = 0; i < w.size(); ++i) named[names[i]] = w[i];  // a gate: ValueError in keras_mha_to_torch
  return keras_mha_to_torch(named, "");
}

std::vector<Tensor> torch_to_keras_weights(const MultiheadAttention& layer) {
  const MultiheadAttentionConfig& c = layer.config();
  if (c.add_bias_kv || c.add_zero_attn) {
    fail<ValueError>("torch_to_keras_weights: Keras has no add_bias_kv / add_zero_attn");
  }
  const std::map<std::string, Tensor> w = torch_mha_to_keras(layer.state_dict(), c.num_heads, "");
  std::vector<Tensor> out;
  for (const char* name : kKerasMhaWeightNames) {
    if (w.count(name)) out.push_back(w.at(name));
  }
  return out;
}

}  // namespace qkv::nn
