// Keras weight files: Keras 3 `.weights.h5` (datasets such as
// layers/multi_head_attention/query_dense/vars/0), tf.keras 2.x `.h5` (model files
// with model_weights/<layer>/<layer>/query/kernel:0 and weights-only files, both
// listed through their layer_names / weight_names attributes), and the `.keras`
// zip (config.json, metadata.json, model.weights.h5). HDF5 is read through libhdf5
// from an in-memory image in a fork()ed reader process: libhdf5 1.10.8 crashes or
// hangs on hostile files, which then ends in a FormatError, not in the caller's
// process (deadline QKV_HDF5_TIMEOUT_S, default 120 s; docs/formats-keras-tf.md). Zips are
// parsed here with full bounds checks.
// Errors: FormatError (malformed file, naming the file and the fault), IOError,
// DTypeError (a dataset dtype qkv cannot hold, raised only when its data is read).
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qkv/io_tf.h"
#include "qkv/tensor.h"

namespace qkv::io {

// A Keras file loads as an io::WeightFile (qkv/io_tensor_files.h): entries[i].key is the HDF5 dataset path
// ("layers/dense/vars/0", "model_weights/dense/dense/kernel:0"); .name is the Keras weight
// name where the file records one ("dense/kernel"), else the path; .optimizer marks
// optimizer state (optimizer/..., optimizer_weights/...). tensors[key] for every dataset of a
// qkv dtype.

// Keras 3 .weights.h5 or tf.keras .h5 (told apart by their content).
WeightFile load_keras_h5(const std::filesystem::path& path);
WeightFile parse_keras_h5(std::span<const std::byte> bytes, const std::string& source);
std::vector<TensorInfo> inspect_keras_h5(const std::filesystem::path& path);

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
// load_keras_archive(path).weights.entries (same keys, names, order, dtypes, shapes) without
// reading the tensors' data: model.weights.h5 is listed as inspect_keras_h5 lists a file, read
// in place when stored (as Keras writes it); config.json is checked as load_keras_archive
// checks it. What inspect / inspect_weights give for a .keras.
std::vector<TensorInfo> inspect_keras_archive(const std::filesystem::path& path);
// How deep a Keras config.json may nest (objects and arrays, the outermost counted):
// load_keras_archive and check_keras_config refuse deeper ones, save_keras_archive too, and
// so do nn::keras_config_layer_order and qkv convert --config (nn::kMaxKerasConfigLevels is
// this one). Keras reads config.json with Python's json, which refuses about 1000 levels at
// Python's default recursion limit (994 arrays at the top of Python 3.11); Keras 3.15 writes
// 10 for seed 001's model (tests/fixtures/seed001/model.keras).
inline constexpr int kMaxKerasConfigLevels = 1000;
// Checks `config_json` as load_keras_archive checks an archive's config.json, building
// nothing: valid JSON nested at most kMaxKerasConfigLevels. FormatError as the reader's, naming
// `source`: "check_keras_config: deep.json: config.json nests JSON 1001 levels deep, more
// than the 1000 qkv reads (...)", "check_keras_config: bad.json: config.json is not valid JSON: ...".
void check_keras_config(std::string_view config_json, const std::string& source);
// Writes a .keras zip (members stored, uncompressed, as Keras 3 writes them): metadata.json
// (`metadata_json`, or {"keras_version": "3.15.1", "date_saved": ...} when empty),
// config.json and model.weights.h5 holding `weights` at their Keras 3 paths
// (nn::keras3_paths). ValueError, before the file is touched, when config_json or
// metadata_json is not valid JSON or nests deeper than check_keras_config allows (kMaxKerasConfigLevels).
void save_keras_archive(const std::filesystem::path& path, const std::map<std::string, Tensor>& weights,
                        const std::string& config_json, const std::string& metadata_json = "");
KerasArchive parse_keras_archive(std::span<const std::byte> bytes, const std::string& source);

// One zip member by name (stored or deflated; sizes and crc32 checked).
std::vector<std::byte> zip_member(std::span<const std::byte> zip, const std::string& name, const std::string& source);

// ---- any weight format -----------------------------------------------------------------
// By extension as io::load: .index / PREFIX (TF checkpoint), .h5, .keras, and also
// .safetensors / .npy (entries named by their keys, nothing marked optimizer).
WeightFile load_weights(const std::filesystem::path& path);
// load_weights, and of a .keras archive its config.json and metadata.json too, from one
// read of the file ("" for the other formats).
KerasArchive load_weights_and_config(const std::filesystem::path& path);
std::vector<TensorInfo> inspect_weights(const std::filesystem::path& path);

// ---- tf.keras 2.x .h5 -----------------------------------------------------------------
// One layer of a tf.keras .h5 file: its name and its weights ("query/kernel", "kernel", ...)
// in the order the file lists them. Which weights a layer has and in which order is the
// layer's business (qkv/nn/keras_layers.h: nn::save_keras_legacy_h5 orders them as Keras).
struct LegacyH5Layer {
  std::string name;
  std::vector<std::pair<std::string, Tensor>> weights;
};
// Writes `layers` in this order as tf.keras 2.x model.save_weights("x.h5") does: root
// attributes layer_names, backend, keras_version; a group per layer with attribute
// weight_names ("<layer>/query/kernel:0", fixed-length strings) and datasets at
// <layer>/<layer>/query/kernel:0; an empty top_level_model_weights group. ValueError for a
// layer name that is empty, has a '/' or is top_level_model_weights.
void save_keras_legacy_h5(const std::filesystem::path& path, const std::vector<LegacyH5Layer>& layers);

}  // namespace qkv::io
