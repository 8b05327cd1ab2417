// Errors thrown by qkv. Every message names the operation, and where shapes or
// patterns are involved it quotes them, e.g.
//   "permute: expected 3 dims, got dims (0, 1) for tensor of shape [2, 3, 4]".
#pragma once

#include <cstdint>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace qkv {

// Base class of every qkv error.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Shapes that do not fit the operation (Python: ValueError).
class ShapeError : public Error {
 public:
  using Error::Error;
};

// An argument value that is out of its domain (Python: ValueError).
class ValueError : public Error {
 public:
  using Error::Error;
};

// A dtype the operation does not support (Python: TypeError).
class DTypeError : public Error {
 public:
  using Error::Error;
};

// An index or dimension out of range (Python: IndexError).
class IndexError : public Error {
 public:
  using Error::Error;
};

// A malformed file or pattern (Python: ValueError).
class FormatError : public Error {
 public:
  using Error::Error;
};

// A file that cannot be opened, read or written (Python: OSError).
class IOError : public Error {
 public:
  using Error::Error;
};

// A tensor larger than QKV_MAX_ALLOC_BYTES, whose byte size overflows, or that the
// system cannot allocate; the message names the operation, the shapes and the
// bytes (Python: MemoryError). See qkv/size.h.
class OutOfMemoryError : public Error {
 public:
  using Error::Error;
};

// Tensors on a device the operation has no kernel or allocator for, or on
// different devices (Python: RuntimeError, as torch). See qkv/device.h.
class DeviceError : public Error {
 public:
  using Error::Error;
};

// A collective or point-to-point transfer between processes failed or timed out (a peer
// died, mismatched sizes between ranks); the message names the operation, the ranks and
// the shapes (Python: RuntimeError). See qkv/dist/communicator.h.
class CommunicationError : public Error {
 public:
  using Error::Error;
};

// "[2, 3, 4]"; "[]" for a scalar. Every message that quotes a shape uses it.
std::string shape_str(std::span<const int64_t> shape);
// "[[2, 3], [4]]": a list of shapes (einops.pack's packed_shapes).
std::string shapes_str(std::span<const std::vector<int64_t>> shapes);

namespace detail {
template <class... Args>
std::string concat(Args&&... args) {
  std::ostringstream out;
  (out << ... << std::forward<Args>(args));
  return out.str();
}
}  // namespace detail

// Throws E with the streamed arguments as message: fail<ShapeError>("op: ", ...).
template <class E = Error, class... Args>
[[noreturn]] void fail(Args&&... args) {
  throw E(detail::concat(std::forward<Args>(args)...));
}

// Work stopped by an interrupt (Ctrl-C; qkv::request_interrupt in qkv/parallel.h).
// Python: KeyboardInterrupt; the CLI exits 130.
class Interrupted : public Error {
 public:
  using Error::Error;
};

}  // namespace qkv
