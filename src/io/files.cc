// Reading and writing whole files, and the by-extension entry points inspect/load/save.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "io/io_internal.h"
#include "qkv/io_keras.h"
#include "qkv/io_tf.h"

namespace qkv::io {
namespace detail {
namespace {

// Closes a FILE* when the reader or writer is done, whichever way it leaves.
struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

FilePtr open_file(const std::filesystem::path& path, const char* mode, const Context& ctx) {
  std::FILE* f = std::fopen(path.c_str(), mode);
  if (f == nullptr) {
    const char* verb = mode[0] == 'r' ? "cannot open for reading: " : "cannot open for writing: ";
    fail_at<IOError>(ctx, verb, std::strerror(errno));
  }
  return FilePtr(f);
}

}  // namespace

uint64_t file_size(const std::filesystem::path& path, const Context& ctx) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    const bool exists = std::filesystem::exists(path, ec);
    fail_at<IOError>(ctx, exists ? "not a regular file" : "cannot open for reading: no such file");
  }
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) fail_at<IOError>(ctx, "cannot read the file size: ", ec.message());
  return size;
}

std::shared_ptr<Storage> read_file(const std::filesystem::path& path, const Context& ctx) {
  const uint64_t size = file_size(path, ctx);
  const AllocationScope scope(ctx.op, ctx.source);  // names the file if it does not fit in memory
  auto storage = Storage::allocate(static_cast<size_t>(size), "its contents");
  FilePtr f = open_file(path, "rb", ctx);
  if (size > 0 && std::fread(storage->data(), 1, size, f.get()) != size) {
    fail_at<IOError>(ctx, "read error after fewer than ", size, " bytes");
  }
  return storage;
}

std::vector<std::byte> read_range(const std::filesystem::path& path, uint64_t offset, size_t n,
                                  const Context& ctx) {
  FilePtr f = open_file(path, "rb", ctx);
  std::vector<std::byte> out(n);
  if (offset > static_cast<uint64_t>(INT64_MAX) ||
      std::fseek(f.get(), static_cast<long>(offset), SEEK_SET) != 0) {
    fail_at<IOError>(ctx, "cannot seek to byte ", offset);
  }
  out.resize(std::fread(out.data(), 1, n, f.get()));
  if (std::ferror(f.get())) fail_at<IOError>(ctx, "read error");
  return out;
}

void write_file(const std::filesystem::path& path, std::span<const std::span<const std::byte>> chunks,
                const Context& ctx) {
  FilePtr f = open_file(path, "wb", ctx);
  for (const auto& chunk : chunks) {
    if (!chunk.empty() && std::fwrite(chunk.data(), 1, chunk.size(), f.get()) != chunk.size()) {
      fail_at<IOError>(ctx, "write error: ", std::strerror(errno));
    }
  }
  std::FILE* raw = f.release();
  if (std::fclose(raw) != 0) fail_at<IOError>(ctx, "write error on close: ", std::strerror(errno));
}

}  // namespace detail

namespace {

enum class Format { npy, safetensors, tf_checkpoint, keras_h5, keras_archive };

constexpr const char* kKnownFormats =
    "(qkv reads and writes .npy and .safetensors, reads and writes Keras .h5 weights, and reads "
    ".keras archives and TensorFlow checkpoints PREFIX / PREFIX.index)";

Format format_of(const std::filesystem::path& path, const char* op) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".npy") return Format::npy;
  if (ext == ".safetensors") return Format::safetensors;
  if (ext == ".h5" || ext == ".hdf5") return Format::keras_h5;
  if (ext == ".keras") return Format::keras_archive;
  if (ext == ".index" || path.filename().string().find(".data-") != std::string::npos) return Format::tf_checkpoint;
  if (!tf_checkpoint_prefix(path).empty()) return Format::tf_checkpoint;  // a prefix: PREFIX.index exists
  detail::fail_at(detail::Context{op, path.string()}, "unknown file extension '", path.extension().string(), "' ",
                  kKnownFormats);
}

}  // namespace

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
    case Format::npy:
      return {{path.stem().string(), detail::npy_from_storage(detail::read_file(path, ctx), ctx)}};
    case Format::safetensors: return detail::safetensors_from_storage(detail::read_file(path, ctx), ctx).tensors;
    default: return load_weights(path).tensors;
  }
}

void save(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors) {
  const std::string source = path.string();
  const AllocationScope scope("save", source);  // names the file in out-of-memory errors
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
      detail::fail_at(detail::Context{"save", path.string()}, "save writes .npy, .safetensors, .h5 and TF checkpoints "
                      "(PREFIX.index); `qkv convert` writes .keras archives and tf.keras .h5 layouts");
  }
  if (tensors.size() != 1) {
    detail::fail_at<ValueError>(detail::Context{"save", path.string()}, "an .npy file holds exactly one tensor, got ",
                                tensors.size());
  }
  save_npy(path, tensors.begin()->second);
}

WeightFile load_weights(const std::filesystem::path& path) {
  const detail::Context ctx{"load_weights", path.string()};
  const AllocationScope scope(ctx.op, ctx.source);  // names the file in out-of-memory errors
  switch (format_of(path, ctx.op)) {
    case Format::tf_checkpoint: return load_tf_checkpoint(path);
    case Format::keras_h5: return load_keras_h5(path);
    case Format::keras_archive: return load_keras_archive(path).weights;
    default: break;
  }
  WeightFile w;
  w.tensors = load(path);
  for (const auto& [name, t] : w.tensors) w.entries.push_back({name, name, std::string(dtype_name(t.dtype())), t.shape(), false});
  return w;
}

std::vector<TensorInfo> inspect_weights(const std::filesystem::path& path) {
  const detail::Context ctx{"inspect_weights", path.string()};
  const AllocationScope scope(ctx.op, ctx.source);  // names the file in out-of-memory errors
  switch (format_of(path, ctx.op)) {
    case Format::tf_checkpoint: return inspect_tf_checkpoint(path);
    case Format::keras_h5: return inspect_keras_h5(path);
    case Format::keras_archive: return load_keras_archive(path).weights.entries;
    default: return inspect(path);  // .npy / .safetensors: name = key
  }
}

}  // namespace qkv::io
