// Tensor files of every format qkv reads and writes, chosen by the file's extension:
// .npy and .safetensors (qkv/io_tensor_files.h), Keras .h5 / .weights.h5 and .keras
// (qkv/io_keras.h) and TensorFlow checkpoints (qkv/io_tf.h). Part of the target
// qkv_io_keras, since it reaches every format; a program that needs only .npy and
// .safetensors includes qkv/io_tensor_files.h and links qkv::io (no HDF5, no zlib).
// Errors: FormatError (malformed file, unknown extension), IOError, DTypeError, as
// the format's own reader raises them. docs/formats.md has the full rules.
#pragma once

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "qkv/io_keras.h"
#include "qkv/io_tensor_files.h"
#include "qkv/io_tf.h"
#include "qkv/tensor.h"

namespace qkv::io {

// ---- any format, by extension ---------------------------------------------------------
// Lists a file's tensors without reading their data (.npy: one entry named after
// the file stem), validating the header against the file size. Dtypes qkv cannot
// hold are listed too. safetensors entries come in data_offsets order.
// Also reads Keras .h5 / .weights.h5, .keras archives and TensorFlow checkpoints
// (PREFIX, PREFIX.index; qkv/io_tf.h, qkv/io_keras.h): keys and names as inspect_weights.
std::vector<TensorInfo> inspect(const std::filesystem::path& path);
// All tensors of a file: a .npy holds one, named after the file stem; the other
// formats name theirs by their keys. A .npy or .safetensors tensor of a dtype qkv
// cannot hold is a DTypeError; a Keras or TensorFlow file's such entries (uint8,
// strings: counters and metadata, never weights) are left out (load_weights; inspect
// lists them).
std::map<std::string, Tensor> load(const std::filesystem::path& path);
// .npy takes exactly one tensor (ValueError otherwise); .safetensors, .h5 (a
// Keras 3 style weights file, datasets at the names' paths) and PREFIX.index (a TF
// checkpoint, tensors under their names as keys; qkv/io_tf.h) any number.
// Any other extension: FormatError naming the path.
void save(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors);
// Whether inspect / load (and load_weights, inspect_weights, load_weights_and_config,
// qkv/io_keras.h) read `path` as a .keras archive: by its name alone, the file is not
// opened. True when its extension is .keras in any case ("m.keras", "M.KERAS"); not for a
// file named ".keras" alone, which has no extension.
bool is_keras_archive(const std::filesystem::path& path);

}  // namespace qkv::io
