// Helpers shared by the file readers and writers of src/io (not public API).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/error.h"
#include "qkv/io_tensor_files.h"
#include "qkv/size.h"  // kMaxElements, checked_numel: the one size helper
#include "qkv/tensor.h"

namespace qkv::io::detail {

// Who reports a fault: every message starts "op: source: ", e.g.
// "load_npy: weights.npy: ...", so the user sees the call and the file.
struct Context {
  const char* op;
  std::string source;
};

template <class E = FormatError, class... Args>
[[noreturn]] void fail_at(const Context& ctx, Args&&... args) {
  fail<E>(ctx.op, ": ", ctx.source, ": ", std::forward<Args>(args)...);
}

// `text` in `quote` quotes for messages: at most `max_chars` bytes, non-printable
// bytes as \xNN, the quote and backslash escaped.
std::string quote_excerpt(std::string_view text, size_t max_chars = 96, char quote = '"');
// `text` with bytes outside printable ASCII as \xNN, so that a message quoting a
// file's bytes stays valid UTF-8 (Python decodes every message).
std::string printable(std::string_view text);
// A tensor name in messages: 'w'.
inline std::string quote_name(std::string_view name) { return quote_excerpt(name, 200, '\''); }

// Reverses the bytes of each `itemsize`-byte element in place.
void byteswap_inplace(std::byte* data, size_t nbytes, size_t itemsize);

// Bytes other than 0 and 1 in a bool tensor are not valid C++ bools; numpy reads any
// non-zero byte as True, so they become 1.
void normalize_bools(std::byte* data, size_t nbytes);

// ---- files ---------------------------------------------------------------------
// The whole file in one 64-byte aligned storage (IOError when it cannot be read).
std::shared_ptr<Storage> read_file(const std::filesystem::path& path, const Context& ctx);
// Up to `n` bytes of the file from `offset` (fewer when the file ends first).
std::vector<std::byte> read_range(const std::filesystem::path& path, uint64_t offset, size_t n, const Context& ctx);
uint64_t file_size(const std::filesystem::path& path, const Context& ctx);

// A file written whole or not at all; every writer of src/io and src/io/keras_tf goes
// through one (write_file below, the HDF5 writers, write_png). The constructor creates
// an empty temporary file beside `path`, in its directory so that rename(2) replaces
// `path` in one step: ".NAME.qkv-XXXXXXXXXXXX", with the mode of the file it replaces,
// else 0666 less the umask. The writer fills temp(); commit() renames it over `path`.
// Destroyed uncommitted (the writer threw, the disk filled up), it removes the
// temporary file, so `path` is as it was: absent, or the previous file whole. Writers
// wrote in place before: a failure left a partial file, over a good one truncated.
// `path` an existing directory is an IOError saying so. A symbolic link is followed
// (the file it names is replaced, the link stays). An existing file that is not a
// regular file (/dev/null, a FIFO) cannot be replaced: temp() is `path` itself,
// written in place, and commit() does nothing; so is an existing file that we may write
// in a directory where we may not create one. No fsync: whole across failures of the
// writer, not across a power loss.
class PendingFile {
 public:
  PendingFile(const std::filesystem::path& path, Context ctx);
  ~PendingFile();
  PendingFile(const PendingFile&) = delete;
  PendingFile& operator=(const PendingFile&) = delete;

  const std::filesystem::path& temp() const { return temp_; }
  void commit();  // IOError when the rename fails (the temporary file is removed)

 private:
  std::filesystem::path target_, temp_;
  Context ctx_;
  bool in_place_ = false, committed_ = false;
};

// Writes the chunks one after the other into file.temp() (IOError on failure).
void write_chunks(const PendingFile& file, std::span<const std::span<const std::byte>> chunks, const Context& ctx);
// The chunks as the whole new content of `path`, through a PendingFile.
void write_file(const std::filesystem::path& path, std::span<const std::span<const std::byte>> chunks,
                const Context& ctx);
// A storage holding a copy of `bytes` (what the parse_* entry points read from).
std::shared_ptr<Storage> copy_to_storage(std::span<const std::byte> bytes);

// A tensor over `byte_offset` of `file`: a view when the offset is a multiple of the
// itemsize (the storage itself is 64-byte aligned), else a copy of its bytes, so
// element access is always aligned. Empty tensors get their own (empty) storage.
Tensor view_or_copy(std::shared_ptr<Storage> file, size_t byte_offset, DType dtype, const Shape& shape,
                    const Strides& strides);

// The raw bytes of a contiguous tensor.
inline std::span<const std::byte> tensor_bytes(const Tensor& t) {
  return {static_cast<const std::byte*>(t.raw_data()), t.nbytes()};
}

// ---- .npy header ---------------------------------------------------------------------
struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  Shape shape;
};
// Parses the header text, a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
// strictly: exactly those three keys, string/bool/tuple-of-int values, no escapes.
// `allow_long_suffix` accepts Python 2's "3L" ints (versions 1.0 and 2.0, as numpy does).
NpyHeader parse_npy_header(std::string_view text, bool allow_long_suffix, const Context& ctx);

// ---- format back ends (npy.cc, safetensors.cc) on a storage holding the whole file ------
Tensor npy_from_storage(std::shared_ptr<Storage> file, const Context& ctx);
SafetensorsFile safetensors_from_storage(std::shared_ptr<Storage> file, const Context& ctx);
// Listings that read only the header (plus the file size).
std::vector<TensorInfo> inspect_npy(const std::filesystem::path& path, const Context& ctx);
std::vector<TensorInfo> inspect_safetensors(const std::filesystem::path& path, const Context& ctx);

}  // namespace qkv::io::detail
