// Reading and writing whole files (the by-extension entry points inspect/load/save
// are in keras_tf/any_format.cc: they reach every format).
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
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

namespace {

namespace fs = std::filesystem;

// `path` with its symbolic links followed, as open(2) would (40 links at most, its
// limit); a dangling link gives the path it points to, which the rename creates.
fs::path follow_links(fs::path path) {
  std::error_code ec;
  for (int i = 0; i < 40 && fs::is_symlink(path, ec); ++i) {
    const fs::path next = fs::read_symlink(path, ec);
    if (ec) break;
    path = next.is_absolute() ? next : path.parent_path() / next;
  }
  return path;
}

// ".NAME.qkv-" and 12 hex digits: pid, a counter and the clock, so that two writers
// (threads or processes) of one file do not meet; O_EXCL settles the rest.
fs::path temp_name(const fs::path& target, uint64_t attempt) {
  static std::atomic<uint64_t> counter{0};
  const auto now = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  const uint64_t mix =
      (static_cast<uint64_t>(::getpid()) << 24) ^ (counter++ << 4) ^ now ^ (attempt * 0x9e3779b97f4a7c15u);
  char hex[16];
  std::snprintf(hex, sizeof hex, "%012llx", static_cast<unsigned long long>(mix & 0xffffffffffffu));
  std::string name = ".";  // appended piece by piece: GCC 12 -O3 warns (-Wrestrict) on "." + s + ...
  name += target.filename().string();
  name += ".qkv-";
  name += hex;
  return target.parent_path() / name;
}

}  // namespace

PendingFile::PendingFile(const fs::path& path, Context ctx) : target_(follow_links(path)), ctx_(std::move(ctx)) {
  struct stat st {};
  const bool exists = ::stat(target_.c_str(), &st) == 0;
  if (exists && S_ISDIR(st.st_mode)) fail_at<IOError>(ctx_, "is a directory, not a file");
  // A file we may not write stays refused (rename would replace it, as mv does).
  if (exists && ::access(target_.c_str(), W_OK) != 0) {
    fail_at<IOError>(ctx_, "cannot open for writing: ", std::strerror(errno));
  }
  if (exists && !S_ISREG(st.st_mode)) {  // /dev/null, a FIFO: written in place
    temp_ = target_;
    in_place_ = true;
    return;
  }
  for (uint64_t attempt = 0;; ++attempt) {
    temp_ = temp_name(target_, attempt);
    const int fd = ::open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd >= 0) {
      if (exists) (void)::fchmod(fd, st.st_mode & 07777);  // keep the replaced file's mode
      ::close(fd);
      return;
    }
    if (errno == EACCES && exists) {  // a file we may write in a directory we may not: in place, as before
      temp_ = target_;
      in_place_ = true;
      return;
    }
    if (errno != EEXIST || attempt == 100) fail_at<IOError>(ctx_, "cannot open for writing: ", std::strerror(errno));
  }
}

PendingFile::~PendingFile() {
  if (in_place_ || committed_) return;
  std::error_code ec;
  fs::remove(temp_, ec);
}

void PendingFile::commit() {
  if (in_place_ || committed_) return;
  if (std::rename(temp_.c_str(), target_.c_str()) != 0) {
    fail_at<IOError>(ctx_, "cannot replace the file: ", std::strerror(errno));  // ~PendingFile removes temp_
  }
  committed_ = true;
}

void write_chunks(const PendingFile& file, std::span<const std::span<const std::byte>> chunks, const Context& ctx) {
  FilePtr f = open_file(file.temp(), "wb", ctx);
  for (const auto& chunk : chunks) {
    if (!chunk.empty() && std::fwrite(chunk.data(), 1, chunk.size(), f.get()) != chunk.size()) {
      fail_at<IOError>(ctx, "write error: ", std::strerror(errno));
    }
  }
  std::FILE* raw = f.release();
  if (std::fclose(raw) != 0) fail_at<IOError>(ctx, "write error on close: ", std::strerror(errno));
}

void write_file(const std::filesystem::path& path, std::span<const std::span<const std::byte>> chunks,
                const Context& ctx) {
  PendingFile file(path, ctx);
  write_chunks(file, chunks, ctx);
  file.commit();
}

}  // namespace detail

}  // namespace qkv::io
