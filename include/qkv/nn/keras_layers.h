// Weight files seen as Keras layers, and the one conversion between Keras' MultiHeadAttention /
// Dense layouts and PyTorch's (torch.nn.MultiheadAttention / nn.Linear). The file formats
// themselves (bytes, keys) are qkv::io's (qkv/io_keras.h, qkv/io_tf.h); which weights a layer
// has, how Keras names and orders them and how they map to PyTorch's is the layers' business,
// here. The layer objects' own conversions (nn::keras_to_torch_state_dict,
// nn::torch_to_keras_weights in qkv/nn/keras_mha.h) run through the same per-layer functions.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "qkv/io_keras.h"
#include "qkv/tensor.h"

namespace qkv::nn {

// ---- layers -----------------------------------------------------------------------------
// The sublayers of a Keras MultiHeadAttention layer, in Keras' weight order; its weights are
// "<part>/kernel" and "<part>/bias".
inline constexpr const char* kKerasMhaParts[] = {"query", "key", "value", "attention_output"};
// Keras 3.15's optional sublayer (use_gate): "gate/kernel", "gate/bias", listed between key and
// value (Keras 3 paths layers/<layer>/_gate_dense/vars/0). PyTorch's layer has no such part.
inline constexpr const char* kKerasMhaGatePart = "gate";

// The model variables of a weight file grouped by layer: layer name -> weight ->
// tensor, weights named as tf.keras names them: "kernel", "bias" (Dense,
// EinsumDense), and for MultiHeadAttention "query/kernel", "query/bias", "key/...",
// "value/...", "attention_output/kernel", "attention_output/bias". Read from
// Keras 3 paths (layers/<layer>/query_dense/vars/0: vars 0 = kernel, 1 = bias),
// tf.keras names (<layer>/query/kernel), TF checkpoints' variable names or keys
// (layer_with_weights-0/_query_dense/kernel). Optimizer state is skipped.
using LayerWeights = std::map<std::string, std::map<std::string, Tensor>>;
LayerWeights keras_layer_weights(const io::WeightFile& file);
// The same grouping from keys alone, for the tensors qkv::io::load returns (any weight file's
// keys: Keras 3 paths, tf.keras .h5 paths "[model_weights/]<l>/<l>/query/kernel:0" (layer
// <l>), TF checkpoint keys "layer_with_weights-0/_query_dense/kernel/.ATTRIBUTES/..." (layer
// "layer_with_weights-0"), names "<l>/query/kernel"). Optimizer keys are skipped.
LayerWeights keras_layer_weights(const std::map<std::string, Tensor>& tensors);
// One layer's weights; FormatError listing the layers found when `layer` is missing.
const std::map<std::string, Tensor>& layer_weights(const LayerWeights& layers, const std::string& layer,
                                                   const std::string& source);

// Keras 3 .weights.h5 paths for `layers` (layers/<layer>/query_dense/vars/0, ...,
// layers/<layer>/vars/0 for a Dense): what io::save_keras_weights_h5 takes.
std::map<std::string, Tensor> keras3_paths(const LayerWeights& layers);

// ---- writing for Keras -------------------------------------------------------------------
// tf.keras .h5 files and TF checkpoints match layers by position, so the writers take the
// model order: the layers named in `order` first, the others after them by name.
std::vector<std::string> ordered_layers(const LayerWeights& layers, const std::vector<std::string>& order);
// The order in which a weight file lists its layers (model order for TF checkpoints and
// tf.keras .h5 files; name order for Keras 3 .weights.h5, whose paths carry no order).
std::vector<std::string> keras_layer_order(const io::WeightFile& file);
// How deep a Keras config.json may nest (objects and arrays, the outermost counted):
// load_keras_archive and keras_config_layer_order refuse deeper ones, save_keras_archive
// and qkv convert --config too (Python's json, which Keras reads it with, refuses about 1000).
// The io layer's limit itself (qkv/io_keras.h), here under nn:: too.
using io::kMaxKerasConfigLevels;
// The layer names of a Keras config.json (config.layers[].name) in model order; empty
// when the JSON has no such list. FormatError when it is not valid JSON or nests more
// than kMaxKerasConfigLevels deep (as load_keras_archive). Reads the names alone (no tree
// of the config is built): a wide config costs its text.
std::vector<std::string> keras_config_layer_order(const std::string& config_json);
// A layer's weights in Keras' order: query kernel, query bias, key..., value...,
// attention_output..., kernel, bias, then any others by name.
std::vector<std::string> keras_weight_order(const std::map<std::string, Tensor>& weights);
// Writes `layers` (in model order, ordered_layers; each layer's weights in keras_weight_order)
// as tf.keras 2.x model.save_weights("x.h5") does (io::save_keras_legacy_h5).
void save_keras_legacy_h5(const std::filesystem::path& path, const LayerWeights& layers,
                          const std::vector<std::string>& order = {});
// The keys and variable names tf.keras model.save_weights(prefix) writes for `layers`:
// layer_with_weights-<i>/_query_dense/kernel/.ATTRIBUTES/VARIABLE_VALUE (MHA),
// layer_with_weights-<i>/kernel/... (Dense), i counting layers in model order; full
// names "<layer>/query/kernel". What io::save_tf_checkpoint takes.
struct TfKerasCheckpoint {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> full_names;
};
TfKerasCheckpoint tf_keras_checkpoint_keys(const LayerWeights& layers, const std::vector<std::string>& order = {});
// A Keras 3 config.json for a Functional model chaining `layers` in order on one
// input [batch, seq, features]: InputLayer, then each MultiHeadAttention as
// self-attention (query = value = the previous output) and each Dense on the last
// axis. Head counts and sizes come from the kernels. ValueError for other layers, and for
// layers whose sizes do not chain (then the order is wrong: pass the model order, or write
// the model's own config.json instead).
std::string keras_model_config(const LayerWeights& layers, const std::vector<std::string>& order = {});

// ---- Keras <-> PyTorch -------------------------------------------------------------------
// One MultiHeadAttention layer's Keras weights ("query/kernel" [E, N, H], ...,
// "attention_output/bias" [E]) -> torch.nn.MultiheadAttention's state dict without prefix
// ("in_proj_weight" [3E, E] rows q|k|v, "in_proj_bias" [3E], "out_proj.weight" [E, E],
// "out_proj.bias" [E]); dtypes kept. `layer` names the layer in errors. ValueError when the
// layer has no PyTorch equivalent: N * key_dim != E, value_dim != key_dim, key/value input
// sizes != E, output_shape != E, or a missing weight (biases included).
std::map<std::string, Tensor> keras_mha_to_torch(const std::map<std::string, Tensor>& keras, const std::string& layer);
// The inverse for one layer's state dict without prefix, with `num_heads` heads: packed
// in_proj_weight [3E, E] or separate q_proj_weight [E, E], k_proj_weight [E, kdim],
// v_proj_weight [E, vdim]; biases when the state dict has them (in_proj_bias and
// out_proj.bias both, or neither: use_bias = false). ValueError for bias_k / bias_v, a
// missing weight, E not divisible by num_heads, or shapes that are not PyTorch's.
std::map<std::string, Tensor> torch_mha_to_keras(const std::map<std::string, Tensor>& state_dict, int64_t num_heads,
                                                 const std::string& layer);
// Every layer of `layers`: MultiHeadAttention weights -> "<layer>.in_proj_weight", ...
// (keras_mha_to_torch); Dense kernels [in, out] -> "<layer>.weight" [out, in], "<layer>.bias".
// ValueError for a weight with no PyTorch equivalent.
std::map<std::string, Tensor> keras_to_torch(const LayerWeights& layers);
// The inverse: "<prefix>in_proj_weight" (or "<prefix>q_proj_weight") etc. become MHA layer
// "<prefix>" (without its trailing '.'; "multi_head_attention" when empty) with `num_heads`
// heads (torch_mha_to_keras); "<p>.weight" [out, in] + "<p>.bias" become Dense layer "<p>".
LayerWeights torch_to_keras(const std::map<std::string, Tensor>& state_dict, int64_t num_heads);

}  // namespace qkv::nn
