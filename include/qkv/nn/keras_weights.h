// Keras layers with their trained weights straight from a weight file: TF
// checkpoints, Keras 3 .weights.h5, tf.keras .h5 and .keras archives (any format
// io::load_weights reads), by layer name. A missing layer is a FormatError that
// lists the layers (and their weights) the file has.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "qkv/nn/keras_layers.h"
#include "qkv/nn/keras_mha.h"
#include "qkv/nn/linear.h"
#include "qkv/tensor.h"

namespace qkv::nn {

// The MultiHeadAttention config the weights imply: num_heads and key_dim from the
// query kernel [dim, N, key_dim], value_dim from the value kernel, output_shape from
// the output kernel's trailing axes when they differ from the query's dim, use_bias
// from the presence of biases. (attention_axes and dropout are not in weight files.)
KerasMultiHeadAttentionConfig keras_mha_config(const std::map<std::string, Tensor>& weights);

// The weights of one MultiHeadAttention layer ("query/kernel", ..., "attention_output/bias")
// among `tensors`: what qkv::io::load returns for any weight file qkv reads or writes (Keras 3
// .weights.h5 / .keras paths, tf.keras .h5 paths, TF checkpoint keys, safetensors), a dict of
// variable paths ("mha/query/kernel") or one layer's bare names ("query/kernel"). `layer`
// chooses the layer by name or by the end of its path ("multi_head_attention",
// "layer_with_weights-0"); empty: the only MultiHeadAttention layer there is. ValueError
// naming the layers and listing the keys found when there is none, or several and no `layer`.
std::map<std::string, Tensor> keras_mha_weights(const std::map<std::string, Tensor>& tensors,
                                                const std::string& layer = "");
// A layer with those weights and the config they imply (keras_mha_config), attending over
// `attention_axes` (not in weight files).
KerasMultiHeadAttention keras_mha_from_weights(const std::map<std::string, Tensor>& tensors,
                                               const std::string& layer = "",
                                               const std::vector<int64_t>& attention_axes = {});

// The layer `name` of `layers` as a KerasMultiHeadAttention (config from keras_mha_config).
KerasMultiHeadAttention load_keras_mha(const LayerWeights& layers, const std::string& name, const std::string& source);
// The Dense layer `name`: kernel [in, out] (+ bias [out]).
Linear load_keras_dense(const LayerWeights& layers, const std::string& name, const std::string& source);

// Seed 001's model shape: MultiHeadAttention self-attention followed by a Dense layer.
struct KerasMhaDense {
  KerasMultiHeadAttention attention{KerasMultiHeadAttentionConfig{}};
  Linear dense;
  // x [B, T, dim] -> dense(attention(x, x)) [B, T, units].
  Tensor forward(const Tensor& x) const;
};
// Loads both layers from `file` by name (seed 001: "multi_head_attention", "dense").
KerasMhaDense load_keras_mha_dense(const std::filesystem::path& file,
                                   const std::string& mha_name = "multi_head_attention",
                                   const std::string& dense_name = "dense");

}  // namespace qkv::nn
