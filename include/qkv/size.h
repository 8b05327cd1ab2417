// Checked sizes: the one place that turns shapes into element counts and byte
// counts, and the allocation limit every qkv allocation is checked against.
//
// A qkv tensor has at most kMaxElements = 2^62 elements (the product of its
// non-zero dims), so element counts, strides and offsets fit int64_t. Byte counts
// are size_t products checked with __builtin_mul_overflow.
//
// One allocation may take at most max_alloc_bytes(): the environment variable
// QKV_MAX_ALLOC_BYTES (bytes, or with a K/M/G/T suffix for powers of 1024; read
// once, at the first allocation), by default the machine's physical memory (or the
// container's cgroup memory limit when lower). A
// tensor whose bytes pass it, or overflow size_t, is an OutOfMemoryError raised
// before the operation does any work; so is an allocation the system refuses
// (a failed aligned_alloc, std::bad_alloc). The message names the operation (from
// the innermost AllocationScope of the thread), the shapes and the bytes:
//   "einsum: 'ij,jk->ik' (operands [131072, 1], [1, 32768]): output [131072, 32768]
//    float32 needs 17179869184 bytes (16.0 GiB), more than QKV_MAX_ALLOC_BYTES=8589934592"
#pragma once

#include <cstddef>
#include <cstdint>
#include <new>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/dtype.h"
#include "qkv/error.h"

namespace qkv {

// The largest element count (and extent) of a qkv tensor.
inline constexpr int64_t kMaxElements = int64_t{1} << 62;

// a * b for a, b >= 0; nullopt when the product passes kMaxElements.
std::optional<int64_t> checked_mul(int64_t a, int64_t b);
// Element count of `shape`; nullopt on a negative dim or when the product of the
// non-zero dims passes kMaxElements (zero dims do not excuse the others: strides
// are still their products).
std::optional<int64_t> checked_numel(std::span<const int64_t> shape);
// numel * itemsize in bytes; nullopt when it overflows size_t.
std::optional<size_t> checked_nbytes(int64_t numel, size_t itemsize);

// The largest single allocation (see above).
size_t max_alloc_bytes();
// Overrides the limit for this process (embedders, tests); nullopt goes back to
// QKV_MAX_ALLOC_BYTES or the default. ValueError for a limit of 0.
void set_max_alloc_bytes(std::optional<size_t> limit);

// Names the operation that allocations on this thread are made for, in size and
// out-of-memory errors. Scopes nest (the innermost names the error); `subject`
// (a pattern, a file) and `inputs` must outlive the scope.
class AllocationScope {
 public:
  explicit AllocationScope(std::string_view op, std::string_view subject = {},
                           std::span<const std::vector<int64_t>> inputs = {}, const char* inputs_name = "operands");
  ~AllocationScope();
  AllocationScope(const AllocationScope&) = delete;
  AllocationScope& operator=(const AllocationScope&) = delete;

  // "einsum: 'ij,jk->ik' (operands [2, 3], [3, 4])" for the innermost scope,
  // `fallback` when the thread has none.
  static std::string describe(std::string_view fallback);
  // OutOfMemoryError "<scope>: out of memory (std::bad_alloc)"; for a catch of std::bad_alloc.
  [[noreturn]] void fail_bad_alloc() const;

 private:
  std::string text() const;
  std::string_view op_, subject_;
  std::span<const std::vector<int64_t>> inputs_;
  const char* inputs_name_;
  const AllocationScope* outer_;
};

// Bytes of a new tensor of `shape` and `dtype`, checked against overflow and
// max_alloc_bytes() (OutOfMemoryError; ShapeError for a negative dim or more than
// kMaxElements elements). `role` ("output", "intermediate") and `fallback_op` (the
// name used outside any AllocationScope) go into the message.
size_t checked_alloc_bytes(std::span<const int64_t> shape, DType dtype, const char* role = "output",
                           std::string_view fallback_op = "Tensor::empty");
// The same check for a raw buffer of `nbytes` ("<op>: <what> of N bytes ...").
void check_alloc_bytes(size_t nbytes, std::string_view what, std::string_view fallback_op);
// OutOfMemoryError for an allocation the system refused; `what` as in the checks
// above ("output [2, 3] float32").
[[noreturn]] void fail_out_of_memory(size_t nbytes, std::string_view what, std::string_view fallback_op);

// "output [2, 3] float32": what a tensor allocation is, in messages.
std::string allocation_what(std::span<const int64_t> shape, DType dtype, const char* role);

}  // namespace qkv
