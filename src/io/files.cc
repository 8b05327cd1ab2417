// Reading and writing whole files (the by-extension entry points inspect/load/save
// are in keras_tf/any_format.cc: they reach every format).
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
  const AllocationScope scope(ctx.op, ctx.source);  // names the file if it does not fit in memory
  auto storage = Storage::allocate(static_cast<size_t>(size), "its contents");
  FilePtr f = open_file(path, "rb", ctx);
  if (size > 0 && std::fread(storage->data(), 1, size, f.get()) != size) {
    fail_at<IOError>(ctx, "read error after fewer than ", size, " bytes");
  }
  return storage;
}

std::vector<std::byte> read_range(const std::filesystem::path& path, uint64_t offset, size_t n, const Context& ctx) {
  FilePtr f = open_file(path, "rb", ctx);
  std::vector<std::byte> out(n);
  if (offset > static_cast<uint64_t>(INT64_MAX) || std::fseek(f.get(), static_cast<long>(offset), SEEK_SET) != 0) {
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

}  // namespace qkv::io
