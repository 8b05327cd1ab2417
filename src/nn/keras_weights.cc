// Keras layers from weight files by layer name (qkv/nn/keras_weights.h).
#include "qkv/nn/keras_weights.h"

#include "qkv/error.h"

namespace qkv::nn {

namespace {
const Tensor* find(const std::map<std::string, Tensor>& w, const std::string& name) {
  const auto it = w.find(name);
  return it == w.end() ? nullptr : &it->second;
}
}  // namespace

KerasMhaConfig keras_mha_config(const std::map<std::string, Tensor>& w) {
  const Tensor* q = find(w, "query/kernel");
  const Tensor* v = find(w, "value/kernel");
  const Tensor* o = find(w, "attention_output/kernel");
  if (q == nullptr || v == nullptr || o == nullptr || q->dim() != 3 || v->dim() != 3 || o->dim() < 3) {
    std::string names;
    for (const auto& [n, t] : w) names += (names.empty() ? "" : ", ") + n + shape_str(t.shape());
    fail<FormatError>("keras_mha_config: not MultiHeadAttention weights (need query/kernel [dim, N, key_dim], "
                      "value/kernel, attention_output/kernel); got: ", names);
  }
  KerasMhaConfig c;
  c.num_heads = q->size(1);
  c.key_dim = q->size(2);
  if (v->size(2) != c.key_dim) c.value_dim = v->size(2);
  c.use_bias = find(w, "query/bias") != nullptr;
  const Shape out(o->shape().begin() + 2, o->shape().end());
  if (out != Shape{q->size(0)}) c.output_shape = out;
  return c;
}

KerasMultiHeadAttention load_keras_mha(const io::LayerWeights& layers, const std::string& name,
                                       const std::string& source) {
  const auto& w = io::layer_weights(layers, name, source);
  KerasMultiHeadAttention layer(keras_mha_config(w));
  layer.load_weights(w);
  return layer;
}

Linear load_keras_dense(const io::LayerWeights& layers, const std::string& name, const std::string& source) {
  const auto& w = io::layer_weights(layers, name, source);
  const Tensor* kernel = find(w, "kernel");
  if (kernel == nullptr || kernel->dim() != 2) {
    fail<FormatError>("load_keras_dense: ", source, ": layer '", name, "' has no 2-D kernel");
  }
  const Tensor* bias = find(w, "bias");
  return Linear::keras(kernel->to(DType::f32), bias ? std::optional(bias->to(DType::f32)) : std::nullopt, 1);
}

Tensor KerasMhaDense::forward(const Tensor& x) const {
  return dense.forward(attention.forward(x, x).output);  // [B, T, dim] -> [B, T, units]
}

KerasMhaDense load_keras_mha_dense(const std::filesystem::path& file, const std::string& mha_name,
                                   const std::string& dense_name) {
  const io::LayerWeights layers = io::keras_layer_weights(io::load_weights(file));
  return KerasMhaDense{load_keras_mha(layers, mha_name, file.string()), load_keras_dense(layers, dense_name, file.string())};
}

}  // namespace qkv::nn
