// Tensor files: NumPy .npy and Hugging Face .safetensors (target qkv_io, which
// needs no HDF5 or zlib; qkv/io.h adds every other format, by extension).
//
// Readers validate everything they read (as the reference implementations do)
// and throw FormatError naming the file and the fault; they never crash on a
// malformed file. Parsers also take an in-memory buffer, which the fuzz targets use.
// Errors: FormatError (malformed file), IOError (cannot open/read/write),
// DTypeError (a well-formed file holding a dtype qkv has no type for).
// docs/formats.md has the full rules.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::io {

// ---- .npy ---------------------------------------------------------------------
// Reads format versions 1.0, 2.0 and 3.0, either byte order ('>' data is swapped
// on load) and fortran_order (loaded as a column-major strided view). Dtypes:
// every qkv dtype. bfloat16, which numpy lacks, is descr '<V2' (a 2-byte void),
// exactly what np.save writes for an ml_dtypes.bfloat16 array; on load '<V2',
// '|V2' and '>V2' are read as bfloat16 (see docs/formats.md).
// The tensor is a view into one buffer holding the file when its data is aligned.
Tensor load_npy(const std::filesystem::path& path);
// Rows [start, stop) along `dim` of the array in a .npy file, reading only their bytes (one
// read per contiguous run: prod(shape[:dim]) runs) after validating the header as load_npy
// does: what each rank of a distributed job reads of a shared file (qkv attention --parallel).
// A new contiguous tensor; a Fortran-order file is read whole and sliced. IndexError for a
// dim or range outside the array.
Tensor load_npy_slice(const std::filesystem::path& path, int64_t dim, int64_t start, int64_t stop);
// `source` names the buffer in error messages. The bytes are copied.
Tensor parse_npy(std::span<const std::byte> bytes, const std::string& source);
// Writes C order, or Fortran order when `fortran_order` (numpy's layout for order='F').
// The bytes are those np.save writes for the same array (version 1.0 header,
// 64-byte aligned data, little endian).
void save_npy(const std::filesystem::path& path, const Tensor& tensor, bool fortran_order = false);
std::vector<std::byte> serialize_npy(const Tensor& tensor, bool fortran_order = false);

// ---- .safetensors -----------------------------------------------------------------
// Validated as safetensors/src/tensor.rs does. Tensors are views into one buffer
// holding the file where their data is aligned to the itemsize, copies elsewhere.
struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;  // the optional "__metadata__" entry
};
SafetensorsFile load_safetensors(const std::filesystem::path& path);
SafetensorsFile parse_safetensors(std::span<const std::byte> bytes, const std::string& source);
// Same bytes as the reference writer: tensors ordered by dtype (widest first) then
// name, "__metadata__" (written only when not empty) first, header padded with
// spaces to a multiple of 8. ValueError for a name that is not UTF-8 or is "__metadata__".
void save_safetensors(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});
std::vector<std::byte> serialize_safetensors(const std::map<std::string, Tensor>& tensors,
                                             const std::map<std::string, std::string>& metadata = {});

// ---- listings, shared by every format (qkv/io.h, qkv/io_tf.h, qkv/io_keras.h) ------------
// One tensor of a file's listing, the same for every format (io::inspect, inspect_weights,
// inspect_tf_checkpoint, inspect_keras_h5, WeightFile::entries). The file's own dtype string
// (e.g. "F32", "<f4") is mapped to numpy's name where qkv knows it, kept as is otherwise.
struct TensorInfo {
  std::string key;   // what load() returns the tensor under: safetensors name, .npy stem,
                     // TF checkpoint key, HDF5 dataset path
  std::string name;  // the variable's own name where the file records one (TF object graph,
                     // tf.keras weight_names: "multi_head_attention/query/kernel"), else the key
  std::string dtype;
  Shape shape;
  bool optimizer = false;  // optimizer state (TF checkpoints and Keras files; see qkv/io_keras.h)
};
// A weight file read whole: the listing and the tensors (TF checkpoints, Keras .h5 and
// .keras files, and .safetensors / .npy through io::load_weights; qkv/io_tf.h,
// qkv/io_keras.h say what key and name are for each).
struct WeightFile {
  std::vector<TensorInfo> entries;        // every variable, those of dtypes qkv cannot hold included
  std::map<std::string, Tensor> tensors;  // by key: every entry of a qkv dtype (strings are not tensors)
};

}  // namespace qkv::io
