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

KerasMultiHeadAttentionConfig keras_mha_config(const std::map<std::string, Tensor>& w) {
  const Tensor* q = find(w, "query/kernel");
  const Tensor* v = find(w, "value/kernel");
  const Tensor* o = find(w, "attention_output/kernel");
  if (q == nullptr || v == nullptr || o == nullptr || q->dim() != 3 || v->dim() != 3 || o->dim() < 3) {
    std::string names;
    for (const auto& [n, t] : w) names += (names.empty() ? "" : ", ") + n + shape_str(t.shape());
    fail<FormatError>(
        "keras_mha_config: not MultiHeadAttention weights (need query/kernel [dim, N, key_dim], "
        "value/kernel, attention_output/kernel); got: ",
        names);
  }
  KerasMultiHeadAttentionConfig c;
  c.num_heads = q->size(1);
  c.key_dim = q->size(2);
  if (v->size(2) != c.key_dim) c.value_dim = v->size(2);
  c.use_bias = find(w, "query/bias") != nullptr;
  c.use_gate = find(w, "gate/kernel") != nullptr;  // Keras 3.15's use_gate
  const Shape out(o->shape().begin() + 2, o->shape().end());
  if (out != Shape{q->size(0)}) c.output_shape = out;
  return c;
}

namespace {

// "a [2, 3], b [4]" for at most 40 tensors, then how many more.
std::string listing(const std::map<std::string, Tensor>& tensors) {
  std::string out;
  size_t n = 0;
  for (const auto& [name, t] : tensors) {
    if (n++ == 40) return out + ", ... (" + std::to_string(tensors.size() - 40) + " more)";
    out += (out.empty() ? "" : ", ") + name + " " + shape_str(t.shape());
  }
  return out.empty() ? "no tensors" : out;
}

}  // namespace

std::map<std::string, Tensor> keras_mha_weights(const std::map<std::string, Tensor>& tensors,
                                                const std::string& layer) {
  LayerWeights layers = keras_layer_weights(tensors);
  for (const std::string& n : keras_mha_weight_names(true, true)) {  // one layer's weights by name: layer ""
    if (tensors.count(n)) layers[""][n] = tensors.at(n);
  }
  std::vector<std::string> hits;
  std::string names;
  for (const auto& [name, w] : layers) {
    if (!w.count("query/kernel")) continue;
    names += (names.empty() ? "'" : ", '") + name + "'";
    if (layer.empty() || name == layer || name.ends_with("/" + layer)) hits.push_back(name);
  }
  if (hits.size() == 1) return layers.at(hits.front());
  const std::string what = layer.empty() ? "" : " named '" + layer + "'";
  if (hits.empty()) {
    fail<ValueError>("KerasMultiHeadAttention weights: no MultiHeadAttention layer", what, " (with a query/kernel)",
                     names.empty() ? "" : "; its layers: " + names, "; the tensors: ", listing(tensors));
  }
  fail<ValueError>("KerasMultiHeadAttention weights: ", hits.size(), " MultiHeadAttention layers (", names,
                   "); choose one by name (layer=)");
}

KerasMultiHeadAttention keras_mha_from_weights(const std::map<std::string, Tensor>& tensors, const std::string& layer,
                                               const std::vector<int64_t>& attention_axes) {
  const auto w = keras_mha_weights(tensors, layer);
  KerasMultiHeadAttentionConfig config = keras_mha_config(w);
  config.attention_axes = attention_axes;
  KerasMultiHeadAttention mha(config);
  mha.load_weights(w);
  return mha;
}

KerasMultiHeadAttention load_keras_mha(const LayerWeights& layers, const std::string& name, const std::string& source) {
  const auto& w = layer_weights(layers, name, source);
  KerasMultiHeadAttention layer(keras_mha_config(w));
  layer.load_weights(w);
  return layer;
}

Linear load_keras_dense(const LayerWeights& layers, const std::string& name, const std::string& source) {
  const auto& w = layer_weights(layers, name, source);
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
  const LayerWeights layers = keras_layer_weights(io::load_weights(file));
  return KerasMhaDense{load_keras_mha(layers, mha_name, file.string()),
                       load_keras_dense(layers, dense_name, file.string())};
}

}  // namespace qkv::nn
