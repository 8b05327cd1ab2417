// qkv::nn::KerasMultiHeadAttention: Keras 3 keras.layers.MultiHeadAttention's semantics,
// forward and backward (KerasMultiHeadAttention::backward: the gradients Keras' autodiff gives).
//
// Weights (Keras' names and get_weights() order, use_bias = false drops the biases):
//   query/kernel [dim_q, N, key_dim], query/bias [N, key_dim]; key/kernel [dim_k, N, key_dim],
//   key/bias; value/kernel [dim_v, N, value_dim], value/bias [N, value_dim];
//   attention_output/kernel [N, value_dim, *output_shape], attention_output/bias [*output_shape];
//   with use_gate also gate/kernel [dim_q, N, value_dim], gate/bias [N, value_dim], which Keras
//   lists between key and value (keras_mha_weight_names).
// Inputs: query [B, T..., dim_q], value [B, S..., dim_v], key (default value) [B, S..., dim_k].
// attention_axes: the axes attended over (default: every axis but the batch and the last);
//   a negative axis a means rank + a of the inputs, as Keras 3 reads it (-2 is the last
//   token axis). Only token axes (1..rank-2) are taken: the batch axis, the feature axis, an
//   axis out of range or named twice is a ValueError (Keras raises for the last two and
//   computes something else for the first two; docs/nn.md);
//   several axes are flattened into one length (softmax jointly over them is then ordinary
//   softmax), the other axes are batch axes and must agree between query and value.
// Masks (bool, True = attend; float > 0.5 counts as True): query_mask [B, T...] -> [.., T, 1],
//   value_mask / key_mask [B, S...] -> [.., 1, S], use_causal_mask (row >= col over axis 1),
//   attention_mask [B, T, S] (for several axes [B.., T.., S..]), AND-ed as Keras does. A row
//   with no key left follows Keras 3.15: zeros where Keras takes its einsum path (scores
//   returned, dropout, or attention over several axes), the mean of the values where it
//   takes its fused dot_product_attention path (its -1e9 fill makes the softmax uniform).
// sliding_window w (Keras 3.15): the mask [1, T, S] |row - col| < w over axis 1, AND-ed with the
//   others (with use_causal_mask: a causal window of w keys); ValueError unless the attention
//   is over axis 1 alone (Keras builds it from axis 1's lengths: on other axes it raises or
//   masks the wrong axis).
// use_gate (Keras 3.15, Gated Attention): the attention output [.., N, value_dim] is multiplied
//   by sigmoid(gate(query)), a fourth EinsumDense like the query's, before the output dense.
// The query is scaled by 1/sqrt(key_dim) (as the score scale). Output [B, T..., *output_shape]
// (default output_shape = dim_q); scores [batch axes..., N, T..., S...] when asked for.
// Projections are nn::Linear (qkv::gemm), attention is qkv::scaled_dot_product_attention.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "qkv/nn/linear.h"
#include "qkv/nn/mha.h"
#include "qkv/tensor.h"

namespace qkv::nn {

// Keras' weight names in get_weights() order (no biases without use_bias) of a layer without
// use_gate (keras_mha_weight_names gives them with the gate).
inline constexpr const char* kKerasMhaWeightNames[8] = {"query/kernel",
                                                        "query/bias",
                                                        "key/kernel",
                                                        "key/bias",
                                                        "value/kernel",
                                                        "value/bias",
                                                        "attention_output/kernel",
                                                        "attention_output/bias"};

struct KerasMultiHeadAttentionConfig {
  int64_t num_heads = 1;
  int64_t key_dim = 1;
  std::optional<int64_t> value_dim;  // default key_dim
  bool use_bias = true;
  std::vector<int64_t> output_shape;    // empty: the query's feature size
  std::vector<int64_t> attention_axes;  // empty: Keras' None (all but batch and features)
  double dropout = 0.0;
  std::optional<int64_t> sliding_window;  // > 0; none: full attention
  bool use_gate = false;
};

// The weight names of a layer in get_weights() order: query, key, gate (use_gate), value,
// attention_output; "<part>/kernel" then "<part>/bias" (use_bias).
std::vector<std::string> keras_mha_weight_names(bool use_bias, bool use_gate = false);

struct KerasMultiHeadAttentionOptions {
  std::optional<Tensor> key;  // default: value
  std::optional<Tensor> query_mask, value_mask, key_mask, attention_mask;
  bool return_attention_scores = false;
  bool use_causal_mask = false;
  // Mask and score modifiers (qkv/attention_mods.h) over the query positions [0, T) and key
  // positions [0, S) of the attended axes (flattened when several), AND-ed with the masks
  // above; forward and backward (as MultiheadAttentionOptions::mods). A row they leave with no
  // key gives zeros.
  AttentionMods mods;
  // The attention between the projections (qkv/nn/layer_attention.h): softmax (default), linear
  // (elu + 1 or Performer FAVOR+, whose estimate is of the layer's exp(q . k / sqrt(key_dim)))
  // or lsh (the query projection is Reformer's shared query-key: self-attention only, key and
  // value the query itself). linear and lsh: forward only, no masks, sliding_window, mods,
  // return_attention_scores or dropout while training (ValueError); use_causal_mask makes
  // them causal.
  LayerAttention attention;
};

// Gradients of a loss through KerasMultiHeadAttention::forward (KerasMultiHeadAttention::backward),
// float32, each input's gradient the one of its role.
struct KerasMultiHeadAttentionGradients {
  Tensor query;                           // query's shape
  Tensor value;                           // value's shape; with no key given, the value's use as key added
  std::optional<Tensor> key;              // key's shape, when options.key is given
  std::map<std::string, Tensor> weights;  // by Keras name and shape ("query/kernel" [dim_q, N, key_dim], ...)
};

struct KerasMultiHeadAttentionResult {
  Tensor output;                 // [B, T..., *output_shape]
  std::optional<Tensor> scores;  // [batch axes..., N, T..., S...]
};

class KerasMultiHeadAttention {
 public:
  explicit KerasMultiHeadAttention(const KerasMultiHeadAttentionConfig& config);

  // Keras' get_weights() order (query kernel, bias, key kernel, bias, [gate kernel, bias,]
  // value kernel, bias, output kernel, bias; no biases without use_bias: keras_mha_weight_names).
  // Builds the layer. Every weight is checked before any is taken: on an error the layer is as
  // it was.
  void set_weights(const std::vector<Tensor>& weights);
  // By name: "query/kernel", "key/bias", "attention_output/kernel", ... under any prefix or
  // key scheme of a weight file (Keras 3 paths "layers/mha/query_dense/vars/0", variable paths
  // "mha/query/kernel", tf.keras and TF checkpoint keys): the tensors qkv::io::load returns.
  // `layer` picks one of several MultiHeadAttention layers (nn::keras_mha_weights in
  // qkv/nn/keras_weights.h). ValueError for a missing weight, listing those found, and for
  // gate weights on a layer without use_gate.
  void load_weights(const std::map<std::string, Tensor>& weights, const std::string& layer = "");
  std::vector<Tensor> get_weights() const;
  // Glorot-uniform kernels, zero biases (Keras' defaults), for the given input feature sizes.
  void build(int64_t query_dim, int64_t value_dim, int64_t key_dim, uint64_t seed = 0);
  bool built() const { return query_.defined(); }

  // One name for a call, as MultiheadAttention::forward (Python: layer(query, value, ...)).
  // On a layer that is not const, the first call builds it with seed 0 when no weights were
  // loaded (as Keras does); on a const layer it must be built (ValueError otherwise).
  KerasMultiHeadAttentionResult forward(const Tensor& query, const Tensor& value,
                                        const KerasMultiHeadAttentionOptions& options = {});
  KerasMultiHeadAttentionResult forward(const Tensor& query, const Tensor& value,
                                        const KerasMultiHeadAttentionOptions& options = {}) const;

  // Backward of forward(query, value, options): given grad_output = d loss / d output (the
  // output's shape, ShapeError otherwise), the gradients of query, value, key (when given) and
  // of every weight under its Keras name (keras_mha_weight_names). The sliding window is a
  // constant mask; the gate's kernel and bias get gradients and the query its share through it.
  // Every forward option: masks and use_causal_mask are constants, dropout (training) is
  // redrawn from dropout_seed, attention_axes (one or several), output_shape; a fully masked
  // row follows the forward (on Keras' fused path its output is the mean of the values, so
  // only the values get its gradient). When query and value are one tensor (self-attention)
  // its gradient is query + value (+ key when passed as key too), as in
  // MultiheadAttention::backward. The layer must be built. keras_mha_backward.cc.
  KerasMultiHeadAttentionGradients backward(const Tensor& query, const Tensor& value, const Tensor& grad_output,
                                            const KerasMultiHeadAttentionOptions& options = {}) const;

  // Dynamic int8 quantization (seed 002) of every projection (query, key, value, gate,
  // attention_output), as MultiheadAttention::quantize_dynamic: int8 weights per output channel,
  // activations per token at run time, int8 GEMMs; attention stays float32. get_weights() keeps
  // the float32 weights; set_weights / load_weights on it quantize the new ones with its bits
  // (as MultiheadAttention::load_state_dict; they made it float32 again); backward refuses (a
  // quantized Linear has none). ValueError for an unbuilt layer. keras_mha_quantized.cc.
  // weight_bits as MultiheadAttention::quantize_dynamic's.
  KerasMultiHeadAttention quantize_dynamic(int weight_bits = 0) const;
  bool quantized() const { return query_.defined() && query_.quantized(); }

  const KerasMultiHeadAttentionConfig& config() const { return config_; }
  bool training = false;
  uint64_t dropout_seed = 0;

 private:
  KerasMultiHeadAttentionConfig config_;
  std::vector<Tensor> weights_;                 // get_weights() order, f32
  Linear query_, key_, value_, output_, gate_;  // gate_ only with use_gate
};

// The PyTorch state_dict of the same layer (in_proj_weight = each kernel reshaped to
// [dim, N*key_dim] and transposed, ...; no biases without use_bias), through
// nn::keras_mha_to_torch (qkv/nn/keras_layers.h). ValueError unless the layouts coincide: a
// built layer, equal input sizes, N * key_dim == dim == N * value_dim, default output_shape,
// one attention axis over [B, T, E] inputs, no gate (PyTorch's layer has none; a sliding
// window is a call-time mask and converts as the weights do).
std::map<std::string, Tensor> keras_to_torch_state_dict(const KerasMultiHeadAttention& layer);
// The Keras weights (get_weights() order) of a PyTorch layer without bias_kv/zero_attn
// (nn::torch_mha_to_keras).
std::vector<Tensor> torch_to_keras_weights(const MultiheadAttention& layer);

}  // namespace qkv::nn
