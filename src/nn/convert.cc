// PyTorch <-> Keras MultiHeadAttention weights: a reshape + transpose per kernel (heads
// flatten head-major in both, so no head permutation).
#include <vector>

#include "qkv/nn/keras_mha.h"
#include "qkv/nn/mha.h"

namespace qkv::nn {

namespace {

Tensor cat_rows(const std::vector<Tensor>& parts) {
  int64_t rows = 0;
  for (const Tensor& p : parts) rows += p.size(0);
  Shape shape = parts[0].shape();
  shape[0] = rows;
  Tensor out = Tensor::empty(shape);
  int64_t r = 0;
  for (const Tensor& p : parts) {
    out.slice(0, r, r + p.size(0)).copy_from(p);
    r += p.size(0);
  }
  return out;
}

}  // namespace

std::map<std::string, Tensor> keras_to_torch_state_dict(const KerasMultiHeadAttention& layer) {
  const KerasMhaConfig& c = layer.config();
  const std::vector<Tensor> w = layer.get_weights();
  if (w.size() != 8) fail<ValueError>("keras_to_torch_state_dict: needs a built layer with use_bias");
  const int64_t e = w[0].size(0), n = c.num_heads, kd = c.key_dim, vd = c.value_dim.value_or(kd);
  const bool fits = n * kd == e && vd == kd && w[2].size(0) == e && w[4].size(0) == e &&
                    c.output_shape == Shape{e} && c.attention_axes.size() <= 1;
  if (!fits) {
    fail<ValueError>("keras_to_torch_state_dict: PyTorch's layout needs num_heads * key_dim == dim == "
                     "num_heads * value_dim, equal input sizes and output_shape == dim; got num_heads ",
                     n, ", key_dim ", kd, ", value_dim ", vd, ", dims ", e, "/", w[2].size(0), "/", w[4].size(0));
  }
  auto weight = [&](const Tensor& kernel) { return kernel.reshape({e, e}).transpose(0, 1); };  // [out, in]
  std::map<std::string, Tensor> sd;
  sd["in_proj_weight"] = cat_rows({weight(w[0]), weight(w[2]), weight(w[4])});  // [3E, E]
  sd["in_proj_bias"] = cat_rows({w[1].reshape({e}), w[3].reshape({e}), w[5].reshape({e})});
  sd["out_proj.weight"] = w[6].reshape({e, e}).transpose(0, 1).contiguous();
  sd["out_proj.bias"] = w[7].contiguous();
  return sd;
}

std::vector<Tensor> torch_to_keras_weights(const MultiheadAttention& layer) {
  const MultiheadAttentionConfig& c = layer.config();
  if (c.add_bias_kv || c.add_zero_attn) {
    fail<ValueError>("torch_to_keras_weights: Keras has no add_bias_kv / add_zero_attn");
  }
  const auto sd = layer.state_dict();
  const int64_t e = c.embed_dim, n = c.num_heads, d = layer.head_dim();
  std::vector<Tensor> proj;
  if (sd.count("in_proj_weight")) {
    const Tensor& w = sd.at("in_proj_weight");
    proj = {w.slice(0, 0, e), w.slice(0, e, 2 * e), w.slice(0, 2 * e, 3 * e)};
  } else {
    proj = {sd.at("q_proj_weight"), sd.at("k_proj_weight"), sd.at("v_proj_weight")};
  }
  std::vector<Tensor> out;
  for (int i = 0; i < 3; ++i) {
    const Tensor& w = proj[static_cast<size_t>(i)];  // [E, dim]
    out.push_back(w.transpose(0, 1).contiguous().view({w.size(1), n, d}));
    if (c.bias) out.push_back(sd.at("in_proj_bias").slice(0, i * e, (i + 1) * e).contiguous().view({n, d}));
  }
  out.push_back(sd.at("out_proj.weight").transpose(0, 1).contiguous().view({n, d, e}));
  if (c.bias) out.push_back(sd.at("out_proj.bias").contiguous());
  return out;
}

}  // namespace qkv::nn
