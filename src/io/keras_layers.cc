// Weight files seen as layers: Keras 3 paths, tf.keras names and TF checkpoint
// names all become layer -> {"query/kernel", ..., "kernel", "bias"}; conversions
// between Keras' MultiHeadAttention / Dense layouts and PyTorch's.
#include <algorithm>

#include "io/io_internal.h"
#include "qkv/io_keras.h"

namespace qkv::io {
namespace {

constexpr std::string_view kValueSuffix = "/.ATTRIBUTES/VARIABLE_VALUE";
constexpr const char* kMhaParts[] = {"query", "key", "value", "attention_output"};

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == '/') out.emplace_back();
    else out.back() += c;
  }
  return out;
}

std::string join(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += (i ? "/" : "") + parts[i];
  return out;
}

// "query_dense" / "_query_dense" / "query" -> "query"; "" when not an MHA sublayer.
std::string mha_part(std::string s) {
  if (s.starts_with("_")) s.erase(0, 1);
  if (s == "output_dense") return "attention_output";
  if (s.ends_with("_dense")) s.resize(s.size() - 6);
  for (const char* p : kMhaParts) {
    if (s == p) return s;
  }
  return "";
}

// (layer, weight) of one variable name or path; weight "" when it is not a layer weight.
std::pair<std::string, std::string> layer_and_weight(std::string s) {
  if (s.ends_with(kValueSuffix)) s.resize(s.size() - kValueSuffix.size());
  if (s.ends_with(":0")) s.resize(s.size() - 2);
  std::vector<std::string> parts = split(s);
  if (parts.size() >= 3 && parts[parts.size() - 2] == "vars") {  // Keras 3: .../vars/<i>
    const std::string idx = parts.back();
    parts.resize(parts.size() - 2);
    std::erase(parts, std::string("layers"));
    const std::string weight = idx == "0" ? "kernel" : idx == "1" ? "bias" : "vars/" + idx;
    if (parts.size() >= 2 && !mha_part(parts.back()).empty()) {
      const std::string part = mha_part(parts.back());
      return {join(parts, parts.size() - 1), part + "/" + weight};
    }
    return {join(parts, parts.size()), weight};
  }
  if (parts.size() >= 3 && !mha_part(parts[parts.size() - 2]).empty()) {
    std::string last = parts.back();
    if (last.starts_with("_")) last.erase(0, 1);
    return {join(parts, parts.size() - 2), mha_part(parts[parts.size() - 2]) + "/" + last};
  }
  if (parts.size() >= 2) {
    std::string last = parts.back();
    if (last.starts_with("_")) last.erase(0, 1);
    return {join(parts, parts.size() - 1), last};
  }
  return {"", ""};
}

std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

Tensor make(const std::vector<double>& v, const Shape& shape, DType dtype) {
  return Tensor::from_vector<double>(v, shape).to(dtype);
}

const Tensor& need(const std::map<std::string, Tensor>& w, const std::string& layer, const std::string& name) {
  const auto it = w.find(name);
  if (it == w.end()) fail<ValueError>("keras_to_torch: layer '", layer, "' has no weight '", name, "'");
  return it->second;
}

// One MultiHeadAttention layer in PyTorch's layout (see io_keras.h for when there is one).
void mha_to_torch(const std::string& layer, const std::map<std::string, Tensor>& w, std::map<std::string, Tensor>& out) {
  const Tensor& qk = need(w, layer, "query/kernel");
  if (qk.dim() != 3) fail<ValueError>("keras_to_torch: layer '", layer, "': query kernel ", shape_str(qk.shape()), " is not [E, N, H]");
  const int64_t e = qk.size(0), n = qk.size(1), h = qk.size(2);
  if (n * h != e) {
    fail<ValueError>("keras_to_torch: layer '", layer, "': num_heads * key_dim = ", n, " * ", h, " != embed dim ", e,
                     "; torch.nn.MultiheadAttention has no such layout");
  }
  std::vector<double> in_w, in_b;
  for (const char* part : {"query", "key", "value"}) {
    const Tensor& k = need(w, layer, std::string(part) + "/kernel");
    const Tensor& b = need(w, layer, std::string(part) + "/bias");
    if (k.shape() != qk.shape() || b.shape() != Shape{n, h}) {
      fail<ValueError>("keras_to_torch: layer '", layer, "': ", part, " kernel ", shape_str(k.shape()), " / bias ",
                       shape_str(b.shape()), " do not match the query's [", e, ", ", n, ", ", h, "] (kdim/vdim/value_dim differ)");
    }
    const auto kv = values(k);  // [E_in, N*H] row-major; torch rows are output features
    for (int64_t o = 0; o < e; ++o) {
      for (int64_t i = 0; i < e; ++i) in_w.push_back(kv[static_cast<size_t>(i * e + o)]);
    }
    const auto bv = values(b);
    in_b.insert(in_b.end(), bv.begin(), bv.end());
  }
  const Tensor& ok = need(w, layer, "attention_output/kernel");
  const Tensor& ob = need(w, layer, "attention_output/bias");
  if (ok.shape() != Shape{n, h, e} || ob.shape() != Shape{e}) {
    fail<ValueError>("keras_to_torch: layer '", layer, "': output kernel ", shape_str(ok.shape()), " is not [", n, ", ", h,
                     ", ", e, "] (output_shape differs from the input)");
  }
  const auto okv = values(ok);  // [N*H, E]
  std::vector<double> out_w;
  for (int64_t o = 0; o < e; ++o) {
    for (int64_t i = 0; i < e; ++i) out_w.push_back(okv[static_cast<size_t>(i * e + o)]);
  }
  const DType dt = qk.dtype();
  out[layer + ".in_proj_weight"] = make(in_w, {3 * e, e}, dt);
  out[layer + ".in_proj_bias"] = make(in_b, {3 * e}, dt);
  out[layer + ".out_proj.weight"] = make(out_w, {e, e}, dt);
  out[layer + ".out_proj.bias"] = ob.contiguous();
}

}  // namespace

LayerWeights keras_layer_weights(const WeightFile& file) {
  LayerWeights out;
  for (const CheckpointEntry& e : file.entries) {
    const auto t = file.tensors.find(e.key);
    if (e.optimizer || t == file.tensors.end()) continue;
    const auto [layer, weight] = layer_and_weight(e.name);
    if (weight.empty()) continue;
    out[layer][weight] = t->second;
  }
  return out;
}

namespace {

// Optimizer state by key: Keras 3 (optimizer/vars/N), tf.keras .h5 (optimizer_weights/...),
// TF checkpoints (optimizer/..., .../.OPTIMIZER_SLOT/...).
bool optimizer_key(const std::string& key) {
  return key.starts_with("optimizer/") || key.starts_with("optimizer_weights/") ||
         key.find("/.OPTIMIZER_SLOT/") != std::string::npos;
}

// tf.keras .h5 keys repeat the layer: "model_weights/<l>/<l>/..." (model files), "<l>/<l>/..."
// (save_weights files): the layer is <l>.
std::string tf_keras_h5_layer(std::string layer) {
  if (layer.starts_with("model_weights/")) layer.erase(0, 14);
  const auto slash = layer.find('/');
  if (slash != std::string::npos && layer.compare(slash + 1, std::string::npos, layer, 0, slash) == 0) {
    layer.resize(slash);
  }
  return layer;
}

}  // namespace

LayerWeights keras_layer_weights(const std::map<std::string, Tensor>& tensors) {
  LayerWeights out;
  for (const auto& [key, t] : tensors) {
    if (optimizer_key(key)) continue;
    const auto [layer, weight] = layer_and_weight(key);
    if (!weight.empty()) out[tf_keras_h5_layer(layer)][weight] = t;
  }
  return out;
}

const std::map<std::string, Tensor>& layer_weights(const LayerWeights& layers, const std::string& layer,
                                                   const std::string& source) {
  const auto it = layers.find(layer);
  if (it != layers.end()) return it->second;
  std::string found;
  for (const auto& [name, weights] : layers) {
    found += (found.empty() ? "" : ", ") + name + " (";
    std::string ws;
    for (const auto& [w, t] : weights) ws += (ws.empty() ? "" : " ") + w + shape_str(t.shape());
    found += ws + ")";
  }
  fail<FormatError>("load weights: ", source, ": no layer named '", layer, "'; the file has: ",
                    found.empty() ? "no layer weights" : found);
}

std::map<std::string, Tensor> keras3_paths(const LayerWeights& layers) {
  std::map<std::string, Tensor> out;
  for (const auto& [layer, weights] : layers) {
    for (const auto& [w, t] : weights) {
      const auto slash = w.rfind('/');
      const std::string part = slash == std::string::npos ? "" : w.substr(0, slash);
      const std::string var = slash == std::string::npos ? w : w.substr(slash + 1);
      const std::string idx = var == "kernel" ? "0" : var == "bias" ? "1" : var;
      const std::string sub = part.empty() || part == "vars" ? ""
                            : part == "attention_output" ? "/output_dense" : "/" + part + "_dense";
      out["layers/" + layer + sub + "/vars/" + idx] = t;
    }
  }
  return out;
}

std::map<std::string, Tensor> keras_to_torch(const LayerWeights& layers) {
  std::map<std::string, Tensor> out;
  for (const auto& [layer, w] : layers) {
    if (w.count("query/kernel")) {
      mha_to_torch(layer, w, out);
      continue;
    }
    for (const auto& [name, t] : w) {
      if (name == "kernel" && t.dim() == 2) out[layer + ".weight"] = t.transpose(0, 1).contiguous();
      else if (name == "bias") out[layer + ".bias"] = t.contiguous();
      else fail<ValueError>("keras_to_torch: layer '", layer, "' weight '", name, "' ", shape_str(t.shape()),
                            " has no PyTorch equivalent qkv knows");
    }
  }
  return out;
}

LayerWeights torch_to_keras(const std::map<std::string, Tensor>& sd, int64_t num_heads) {
  LayerWeights out;
  std::vector<std::string> done;
  for (const auto& [key, w] : sd) {
    if (!key.ends_with("in_proj_weight")) continue;
    const std::string prefix = key.substr(0, key.size() - 14);
    std::string layer = prefix.ends_with(".") ? prefix.substr(0, prefix.size() - 1) : prefix;
    if (layer.empty()) layer = "multi_head_attention";
    auto get = [&](const std::string& n) -> const Tensor& {
      const auto it = sd.find(prefix + n);
      if (it == sd.end()) fail<ValueError>("torch_to_keras: '", prefix + n, "' is missing");
      done.push_back(prefix + n);
      return it->second;
    };
    const Tensor& b = get("in_proj_bias");
    const Tensor& ow = get("out_proj.weight");
    const Tensor& ob = get("out_proj.bias");
    done.push_back(key);
    if (w.dim() != 2 || w.size(0) != 3 * w.size(1)) fail<ValueError>("torch_to_keras: '", key, "' ", shape_str(w.shape()), " is not [3E, E]");
    const int64_t e = w.size(1);
    if (num_heads < 1 || e % num_heads != 0) fail<ValueError>("torch_to_keras: embed dim ", e, " is not divisible by --heads ", num_heads);
    const int64_t h = e / num_heads;
    const auto wv = values(w), bv = values(b), owv = values(ow);
    const char* parts[] = {"query", "key", "value"};
    for (int64_t p = 0; p < 3; ++p) {
      std::vector<double> k(static_cast<size_t>(e * e)), bias(bv.begin() + p * e, bv.begin() + (p + 1) * e);
      for (int64_t o = 0; o < e; ++o) {
        for (int64_t i = 0; i < e; ++i) k[static_cast<size_t>(i * e + o)] = wv[static_cast<size_t>((p * e + o) * e + i)];
      }
      out[layer][std::string(parts[p]) + "/kernel"] = make(k, {e, num_heads, h}, w.dtype());
      out[layer][std::string(parts[p]) + "/bias"] = make(bias, {num_heads, h}, w.dtype());
    }
    std::vector<double> ok(static_cast<size_t>(e * e));
    for (int64_t o = 0; o < e; ++o) {
      for (int64_t i = 0; i < e; ++i) ok[static_cast<size_t>(i * e + o)] = owv[static_cast<size_t>(o * e + i)];
    }
    out[layer]["attention_output/kernel"] = make(ok, {num_heads, h, e}, w.dtype());
    out[layer]["attention_output/bias"] = ob.contiguous();
  }
  for (const auto& [key, t] : sd) {
    if (std::find(done.begin(), done.end(), key) != done.end()) continue;
    if (key.ends_with("q_proj_weight")) fail<ValueError>("torch_to_keras: '", key, "': separate q/k/v projections (kdim/vdim) are not converted");
    if (key.ends_with(".weight") && t.dim() == 2) out[key.substr(0, key.size() - 7)]["kernel"] = t.transpose(0, 1).contiguous();
    else if (key.ends_with(".bias")) out[key.substr(0, key.size() - 5)]["bias"] = t.contiguous();
    else fail<ValueError>("torch_to_keras: '", key, "' ", shape_str(t.shape()), " has no Keras equivalent qkv knows");
  }
  return out;
}

}  // namespace qkv::io
