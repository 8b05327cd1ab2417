// Reading and writing whole files, and the by-extension entry points inspect/load/save.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "io/io_internal.h"

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
  auto storage = Storage::allocate(static_cast<size_t>(size));
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

enum class Format { npy, safetensors };

Format format_of(const std::filesystem::path& path, const char* op) {
  std::string ext = path.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (ext == ".npy") return Format::npy;
  if (ext == ".safetensors") return Format::safetensors;
  detail::fail_at(detail::Context{op, path.string()}, "unknown file extension '", path.extension().string(),
                  "' (qkv reads and writes .npy and .safetensors)");
}

}  // namespace

std::vector<TensorInfo> inspect(const std::filesystem::path& path) {
  const detail::Context ctx{"inspect", path.string()};
  return format_of(path, ctx.op) == Format::npy ? detail::inspect_npy(path, ctx)
                                                 : detail::inspect_safetensors(path, ctx);
}

std::map<std::string, Tensor> load(const std::filesystem::path& path) {
  const detail::Context ctx{"load", path.string()};
  if (format_of(path, ctx.op) == Format::npy) {
    return {{path.stem().string(), detail::npy_from_storage(detail::read_file(path, ctx), ctx)}};
  }
  return detail::safetensors_from_storage(detail::read_file(path, ctx), ctx).tensors;
}

void save(const std::filesystem::path& path, const std::map<std::string, Tensor>& tensors) {
  if (format_of(path, "save") == Format::safetensors) {
    save_safetensors(path, tensors);
    return;
  }
  if (tensors.size() != 1) {
    detail::fail_at<ValueError>(detail::Context{"save", path.string()}, "an .npy file holds exactly one tensor, got ",
                                tensors.size());
  }
  save_npy(path, tensors.begin()->second);
}

}  // namespace qkv::io
