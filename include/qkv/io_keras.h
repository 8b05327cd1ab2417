// Keras weight files: Keras 3 `.weights.h5` (datasets such as
// layers/multi_head_attention/query_dense/vars/0), tf.keras 2.x `.h5` (model files
// with model_weights/<layer>/<layer>/query/kernel:0 and weights-only files, both
// listed through their layer_names / weight_names attributes), and the `.keras`
// zip (config.json, metadata.json, model.weights.h5). HDF5 is read through libhdf5
// from an in-memory image in a fork()ed reader process: libhdf5 1.10.8 crashes or
// hangs on hostile files, which then ends in a FormatError, not in the caller's
// process (deadline QKV_HDF5_TIMEOUT_S, default 120 s; docs/formats.md). Zips are
// parsed here with full bounds checks.
// Errors: FormatError (malformed file, naming the file and the fault), IOError,
// DTypeError (a dataset dtype qkv cannot hold, raised only when its data is read).
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "qkv/io_tf.h"
#include "qkv/tensor.h"

namespace qkv::io {

// The variables of a weight file, in the form the TF checkpoint reader returns:
// entries[i].key is the HDF5 dataset path ("layers/dense/vars/0",
// "model_weights/dense/dense/kernel:0"); .name is the Keras weight name where
// the file records one ("dense/kernel"), else the path; .optimizer marks
// optimizer state (optimizer/..., optimizer_weights/...). tensors[key] for every
// dataset of a qkv dtype.
using WeightFile = TfCheckpoint;

// Keras 3 .weights.h5 or tf.keras .h5 (told apart by their content).
WeightFile load_keras_h5(const std::filesystem::path& path);
WeightFile parse_keras_h5(std::span<const std::byte> bytes, const std::string& source);
std::vector<CheckpointEntry> inspect_keras_h5(const std::filesystem::path& path);

// Writes a Keras 3 style .weights.h5: one little-endian dataset per tensor at its
// key's path (groups created as needed), dtypes as h5py writes them (bool as
// h5py's int8 enum). DTypeError for bfloat16 (HDF5/h5py have no such type).
void save_keras_weights_h5(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors);
// The same file's bytes, built in memory (what save_keras_archive stores).
std::vector<std::byte> serialize_keras_weights_h5(const std::map<std::string, Tensor>& tensors);

// A .keras archive: the JSON members as text and the weights.
struct KerasArchive {
  std::string config_json;    // config.json
  std::string metadata_json;  // metadata.json ("" when absent)
  WeightFile weights;         // model.weights.h5
};
KerasArchive load_keras_archive(const std::filesystem::path& path);
// Writes a .keras zip (members stored, uncompressed, as Keras 3 writes them): metadata.json
// (`metadata_json`, or {"keras_version": "3.15.1", "date_saved": ...} when empty),
// config.json and model.weights.h5 holding `weights` at their Keras 3 paths
// (keras3_paths). ValueError when config_json is not valid JSON.
void save_keras_archive(const std::filesystem::path& path, const std::map<std::string, Tensor>& weights,
                        const std::string& config_json, const std::string& metadata_json = "");
KerasArchive parse_keras_archive(std::span<const std::byte> bytes, const std::string& source);

// One zip member by name (stored or deflated; sizes and crc32 checked).
std::vector<std::byte> zip_member(std::span<const std::byte> zip, const std::string& name, const std::string& source);

// ---- any weight format -----------------------------------------------------------------
// By extension as io::load: .index / PREFIX (TF checkpoint), .h5, .keras, and also
// .safetensors / .npy (entries named by their keys, nothing marked optimizer).
WeightFile load_weights(const std::filesystem::path& path);
std::vector<CheckpointEntry> inspect_weights(const std::filesystem::path& path);

// ---- layers -----------------------------------------------------------------------------
// The model variables of a weight file grouped by layer: layer name -> weight ->
// tensor, weights named as tf.keras names them: "kernel", "bias" (Dense,
// EinsumDense), and for MultiHeadAttention "query/kernel", "query/bias", "key/...",
// "value/...", "attention_output/kernel", "attention_output/bias". Read from
// Keras 3 paths (layers/<layer>/query_dense/vars/0: vars 0 = kernel, 1 = bias),
// tf.keras names (<layer>/query/kernel), TF checkpoints' variable names or keys
// (layer_with_weights-0/_query_dense/kernel). Optimizer state is skipped.
using LayerWeights = std::map<std::string, std::map<std::string, Tensor>>;
LayerWeights keras_layer_weights(const WeightFile& file);
// The same grouping from keys alone, for the tensors qkv::io::load returns (any weight file's
// keys: Keras 3 paths, tf.keras .h5 paths "[model_weights/]<l>/<l>/query/kernel:0" (layer
// <l>), TF checkpoint keys "layer_with_weights-0/_query_dense/kernel/.ATTRIBUTES/..." (layer
// "layer_with_weights-0"), names "<l>/query/kernel"). Optimizer keys are skipped.
LayerWeights keras_layer_weights(const std::map<std::string, Tensor>& tensors);
// One layer's weights; FormatError listing the layers found when `layer` is missing.
const std::map<std::string, Tensor>& layer_weights(const LayerWeights& layers, const std::string& layer,
                                                   const std::string& source);

// Keras 3 .weights.h5 paths for `layers` (layers/<layer>/query_dense/vars/0, ...,
// layers/<layer>/vars/0 for a Dense): what save_keras_weights_h5 takes.
std::map<std::string, Tensor> keras3_paths(const LayerWeights& layers);
// ---- writing for Keras -------------------------------------------------------------------
// tf.keras .h5 files and TF checkpoints match layers by position, so the writers take the
// model order: the layers named in `order` first, the others after them by name.
std::vector<std::string> ordered_layers(const LayerWeights& layers, const std::vector<std::string>& order);
// The order in which a weight file lists its layers (model order for TF checkpoints and
// tf.keras .h5 files; name order for Keras 3 .weights.h5, whose paths carry no order).
std::vector<std::string> keras_layer_order(const WeightFile& file);
// The layer names of a Keras config.json (config.layers[].name) in model order; empty
// when the JSON has no such list.
std::vector<std::string> keras_config_layer_order(const std::string& config_json);
// A layer's weights in Keras' order: query kernel, query bias, key..., value...,
// attention_output..., kernel, bias, then any others by name.
std::vector<std::string> keras_weight_order(const std::map<std::string, Tensor>& weights);
// Writes `layers` as tf.keras 2.x model.save_weights("x.h5") does: root attributes
// layer_names, backend, keras_version; a group per layer with attribute weight_names
// ("<layer>/query/kernel:0", fixed-length strings) and datasets at
// <layer>/<layer>/query/kernel:0; an empty top_level_model_weights group.
void save_keras_legacy_h5(const std::filesystem::path& path, const LayerWeights& layers,
                          const std::vector<std::string>& order = {});
// The keys and variable names tf.keras model.save_weights(prefix) writes for `layers`:
// layer_with_weights-<i>/_query_dense/kernel/.ATTRIBUTES/VARIABLE_VALUE (MHA),
// layer_with_weights-<i>/kernel/... (Dense), i counting layers in model order; full
// names "<layer>/query/kernel". What save_tf_checkpoint takes.
struct TfKerasCheckpoint {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> full_names;
};
TfKerasCheckpoint tf_keras_checkpoint_keys(const LayerWeights& layers, const std::vector<std::string>& order = {});
// A Keras 3 config.json for a Functional model chaining `layers` in order on one
// input [batch, seq, features]: InputLayer, then each MultiHeadAttention as
// self-attention (query = value = the previous output) and each Dense on the last
// axis. Head counts and sizes come from the kernels. ValueError for other layers.
std::string keras_model_config(const LayerWeights& layers, const std::vector<std::string>& order = {});

// Keras MultiHeadAttention weights -> torch.nn.MultiheadAttention's state dict
// ("<layer>.in_proj_weight" [3E, E] rows q|k|v, "in_proj_bias", "out_proj.weight",
// "out_proj.bias"); Dense kernels [in, out] -> "<layer>.weight" [out, in], "<layer>.bias".
// ValueError when an MHA layer has no PyTorch equivalent (heads * key_dim != E,
// value_dim != key_dim, key/value input sizes != E, or a missing bias).
std::map<std::string, Tensor> keras_to_torch(const LayerWeights& layers);
// The inverse: "<prefix>in_proj_weight" etc. become MHA layer "<prefix>" (without
// its trailing '.'; "multi_head_attention" when empty) with `num_heads` heads;
// "<p>.weight" [out, in] + "<p>.bias" become Dense layer "<p>".
LayerWeights torch_to_keras(const std::map<std::string, Tensor>& state_dict, int64_t num_heads);

}  // namespace qkv::io
