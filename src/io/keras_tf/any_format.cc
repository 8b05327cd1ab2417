// The by-extension entry points io::inspect/load/save (qkv/io.h) and
// load_weights/inspect_weights (qkv/io_keras.h): in qkv_io_keras because they reach
// every format, the TF and Keras ones included.
#include <string>

#include "io/io_internal.h"
#include "qkv/ascii.h"
#include "qkv/io.h"

namespace qkv::io {

namespace {

enum class Format { npy, safetensors, tf_checkpoint, keras_h5, keras_archive };

constexpr const char* kKnownFormats =
    "(qkv reads and writes .npy and .safetensors, reads and writes Keras .h5 weights, and reads "
    ".keras archives and TensorFlow checkpoints PREFIX / PREFIX.index)";

Format format_of(const std::filesystem::path& path, const char* op) {
  const std::string ext = lower_extension(path);
  if (ext == ".npy") return Format::npy;
  if (ext == ".safetensors") return Format::safetensors;
  if (ext == ".h5" || ext == ".hdf5") return Format::keras_h5;
  if (is_keras_archive(path)) return Format::keras_archive;
  if (ext == ".index" || path.filename().string().find(".data-") != std::string::npos) return Format::tf_checkpoint;
  if (!tf_checkpoint_prefix(path).empty()) return Format::tf_checkpoint;  // a prefix: PREFIX.index exists
  detail::fail_at(detail::Context{op, path.string()}, "unknown file extension '", path.extension().string(), "' ",
                  kKnownFormats);
}

// np.save's choice: Fortran order for an array that is F- but not C-contiguous (size-1
// dims ignored, as numpy's flags do), so that such an array gets np.save's bytes.
bool numpy_fortran_order(const Tensor& t) {
  if (t.is_contiguous()) return false;  // also every empty tensor
  int64_t expected = 1;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.size(d) == 1) continue;
    if (t.stride(d) != expected) return false;
    expected *= t.size(d);
  }
  return true;
}

}  // namespace

bool is_keras_archive(const std::filesystem::path& path) { return lower_extension(path) == ".keras"; }

std::vector<TensorInfo> inspect(const std::filesystem::path& path) {
  const detail::Context ctx{"inspect", path.string()};
  const AllocationScope scope(ctx.op, ctx.source);  // names the file in out-of-memory errors
  switch (format_of(path, ctx.op)) {
    case Format::npy: return detail::inspect_npy(path, ctx);
    case Format::safetensors: return detail::inspect_safetensors(path, ctx);
    default: return inspect_weights(path);
  }
}

std::map<std::string, Tensor> load(const std::filesystem::path& path) {
  const detail::Context ctx{"load", path.string()};
  const AllocationScope scope(ctx.op, ctx.source);  // names the file in out-of-memory errors
  switch (format_of(path, ctx.op)) {
    case Format::npy: return {{path.stem().string(), detail::npy_from_storage(detail::read_file(path, ctx), ctx)}};
    case Format::safetensors: return detail::safetensors_from_storage(detail::read_file(path, ctx), ctx).tensors;
    default: return load_weights(path).tensors;
  }
}

void save(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors) {
  const std::string source = path.string();
  const AllocationScope scope("save", source);  // names the file in out-of-memory errors
  // Before the extension: a directory 'out' was refused as "unknown file extension ''".
  if (std::error_code ec; std::filesystem::is_directory(path, ec)) {
    detail::fail_at<IOError>(detail::Context{"save", source}, "is a directory, not a file (give a file in it, e.g. ",
                             (path / "out.npy").string(), ")");
  }
  switch (format_of(path, "save")) {
    case Format::safetensors: save_safetensors(path, tensors); return;
    case Format::keras_h5: save_keras_weights_h5(path, tensors); return;
    case Format::npy: break;
    case Format::tf_checkpoint:
      if (path.extension() == ".index") {
        save_tf_checkpoint(tf_checkpoint_prefix(path), tensors);
        return;
      }
      [[fallthrough]];
    default:
      detail::fail_at(detail::Context{"save", path.string()},
                      "save writes .npy, .safetensors, .h5 and TF checkpoints "
                      "(PREFIX.index); `qkv convert` writes .keras archives and tf.keras .h5 layouts");
  }
  if (tensors.size() != 1) {
    detail::fail_at<ValueError>(detail::Context{"save", path.string()}, "an .npy file holds exactly one tensor, got ",
                                tensors.size());
  }
  const Tensor& t = tensors.begin()->second;
  save_npy(path, t, numpy_fortran_order(t));
}

namespace {

// load_weights under `op`'s name: a .keras archive whole, its JSON members too.
KerasArchive load_any_weights(const std::filesystem::path& path, const char* op) {
  const detail::Context ctx{op, path.string()};
  const AllocationScope scope(ctx.op, ctx.source);  // names the file in out-of-memory errors
  KerasArchive out;
  switch (format_of(path, ctx.op)) {
    case Format::tf_checkpoint: out.weights = load_tf_checkpoint(path); return out;
    case Format::keras_h5: out.weights = load_keras_h5(path); return out;
    case Format::keras_archive: return load_keras_archive(path);
    default: break;
  }
  out.weights.tensors = load(path);
  for (const auto& [name, t] : out.weights.tensors)
    out.weights.entries.push_back({name, name, std::string(dtype_name(t.dtype())), t.shape(), false});
  return out;
}

}  // namespace

WeightFile load_weights(const std::filesystem::path& path) { return load_any_weights(path, "load_weights").weights; }

KerasArchive load_weights_and_config(const std::filesystem::path& path) {
  return load_any_weights(path, "load_weights_and_config");
}

std::vector<TensorInfo> inspect_weights(const std::filesystem::path& path) {
  const detail::Context ctx{"inspect_weights", path.string()};
  const AllocationScope scope(ctx.op, ctx.source);  // names the file in out-of-memory errors
  switch (format_of(path, ctx.op)) {
    case Format::tf_checkpoint: return inspect_tf_checkpoint(path);
    case Format::keras_h5: return inspect_keras_h5(path);
    case Format::keras_archive: return inspect_keras_archive(path);
    default: return inspect(path);  // .npy / .safetensors: name = key
  }
}

}  // namespace qkv::io
