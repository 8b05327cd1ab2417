// Checked sizes (qkv/size.h): element and byte counts, the allocation limit, and the
// messages of OutOfMemoryError, through Tensor, Storage and the buffer pool.
#include "qkv/size.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <limits>
#include <new>

#include "common/expect.h"
#include "common/limit_guard.h"
#include "qkv/out_of_memory.h"
#include "qkv/tensor.h"
#include "tensor/buffer_pool.h"

// An allocation the system refuses must come back as null (and so as an
// OutOfMemoryError) under ASan too, instead of ASan's allocation-size-too-big abort.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1"; }

namespace qkv {
namespace {

constexpr int64_t k2to60 = int64_t{1} << 60;

TEST(Size, CheckedNumelBoundsTheProductOfTheNonZeroDims) {
  EXPECT_EQ(checked_numel(Shape{}), 1);
  EXPECT_EQ(checked_numel(Shape{2, 3, 4}), 24);
  EXPECT_EQ(checked_numel(Shape{int64_t{1} << 31, int64_t{1} << 30}), kMaxElements / 2);
  EXPECT_EQ(checked_numel(Shape{4, k2to60}), kMaxElements);  // exactly 2^62 is allowed
  EXPECT_EQ(checked_numel(Shape{8, k2to60}), std::nullopt);
  EXPECT_EQ(checked_numel(Shape{int64_t{1} << 32, int64_t{1} << 32}), std::nullopt);  // 2^64 wraps to 0
  // A zero dim does not excuse the others: contiguous strides are their product.
  EXPECT_EQ(checked_numel(Shape{0, 3}), 0);
  EXPECT_EQ(checked_numel(Shape{0, k2to60, 16}), std::nullopt);
  EXPECT_EQ(checked_numel(Shape{2, -1}), std::nullopt);
}

TEST(Size, CheckedMulAndBytes) {
  EXPECT_EQ(checked_mul(3, 5), 15);
  EXPECT_EQ(checked_mul(-1, 5), std::nullopt);
  EXPECT_EQ(checked_mul(INT64_MAX, 2), std::nullopt);
  EXPECT_EQ(checked_nbytes(kMaxElements, 4), std::nullopt);  // 2^64
  EXPECT_EQ(checked_nbytes(kMaxElements / 4, 4), size_t{1} << 62);
}

TEST(Size, ShapeNumelAndReshapeRejectOverflowingProducts) {
  EXPECT_THROW_WITH(shape_numel({int64_t{1} << 32, int64_t{1} << 32}), ShapeError, "more than 2^62 elements");
  const Tensor t = Tensor::zeros({4});
  // -1 with the other dims multiplying past 2^62 (known used to wrap to 0 or negative).
  EXPECT_THROW_WITH(t.reshape({int64_t{1} << 32, int64_t{1} << 32, -1}), ShapeError,
                    "reshape: shape [4294967296, 4294967296, -1] has more than 2^62 elements");
  EXPECT_THROW_WITH(t.expand({int64_t{1} << 32, int64_t{1} << 32, 4}), ShapeError, "more than 2^62");
}

TEST(Size, EmptyWhoseBytesOverflowIsOutOfMemoryNotAZeroByteTensor) {
  // Before: 2^62 floats are 2^64 bytes, which wrapped to a 0-byte storage.
  EXPECT_THROW_WITH(Tensor::empty({int64_t{1} << 62}, DType::f32), OutOfMemoryError,
                    "Tensor::empty: output [4611686018427387904] float32 needs 2^64 bytes: the size overflows");
  EXPECT_THROW_WITH(Tensor::zeros({3, k2to60}, DType::f64), OutOfMemoryError, "needs 2^64.6 bytes");
  EXPECT_THROW_WITH(kernels::empty_pooled({2, 2, k2to60}, DType::f32), OutOfMemoryError,
                    "output [2, 2, 1152921504606846976] float32 needs 2^64 bytes: the size overflows");
}

TEST(Size, StorageRoundingDoesNotWrap) {
  const LimitGuard unlimited(std::numeric_limits<size_t>::max());
  EXPECT_THROW_WITH(Storage::allocate(std::numeric_limits<size_t>::max() - 3), OutOfMemoryError,
                    "Storage::allocate: out of memory allocating buffer (18446744073709551612 bytes");
}

TEST(Size, LimitFailsBeforeAllocatingAndNamesTheBytes) {
  const LimitGuard limit(size_t{1} << 20);
  EXPECT_EQ(max_alloc_bytes(), size_t{1} << 20);
  EXPECT_EQ(Tensor::empty({512, 512}, DType::f32).numel(), 512 * 512);  // exactly the limit
  EXPECT_THROW_WITH(Tensor::empty({512, 513}, DType::f32), OutOfMemoryError,
                    "Tensor::empty: output [512, 513] float32 needs 1050624 bytes (1.0 MiB), more than the limit "
                    "of 1048576 bytes set by set_max_alloc_bytes");
  EXPECT_THROW_WITH(Storage::allocate((size_t{1} << 20) + 1), OutOfMemoryError,
                    "Storage::allocate: buffer needs 1048577 bytes");
  EXPECT_THROW_WITH(kernels::empty_pooled({1, 1 << 20}, DType::f64, "intermediate"), OutOfMemoryError,
                    "intermediate [1, 1048576] float64 needs 8388608 bytes (8.0 MiB), more than");
  EXPECT_THROW_WITH(set_max_alloc_bytes(0), ValueError, "a limit of 0 bytes");
}

TEST(Size, DefaultLimitIsTheEnvironmentOrThePhysicalMemory) {
  if (const char* env = std::getenv("QKV_MAX_ALLOC_BYTES")) {
    EXPECT_EQ(max_alloc_bytes(), std::strtoull(env, nullptr, 10)) << "QKV_MAX_ALLOC_BYTES=" << env;
  } else {
    const size_t physical = static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGE_SIZE));
    EXPECT_LE(max_alloc_bytes(), physical);  // lower only under a container limit
    EXPECT_GT(max_alloc_bytes(), size_t{64} << 20);
  }
}

TEST(Size, ScopesNameTheOperationInnermostFirst) {
  const LimitGuard limit(size_t{1} << 10);
  const std::vector<Shape> inputs = {{2, 3}, {3, 4}};
  {
    const AllocationScope outer("outer_op", "pattern", inputs);
    EXPECT_THROW_WITH(Tensor::empty({1024}), OutOfMemoryError,
                      "outer_op: 'pattern' (operands [2, 3], [3, 4]): output [1024] float32 needs 4096 bytes");
    {
      const AllocationScope inner("inner_op");
      EXPECT_THROW_WITH(Tensor::empty({1024}), OutOfMemoryError, "inner_op: output [1024] float32");
    }
    EXPECT_EQ(AllocationScope::describe("none"), "outer_op: 'pattern' (operands [2, 3], [3, 4])");
  }
  EXPECT_EQ(AllocationScope::describe("none"), "none");
}

TEST(Size, BadAllocInAScopeBecomesOutOfMemoryWithItsContext) {
  const Shape shape = {2, 2};
  const AllocationScope scope("repeat", "h w -> (h w c)", std::span<const Shape>(&shape, 1), "input");
  try {
    throw std::bad_alloc();
  } catch (const std::bad_alloc&) {
    EXPECT_THROW_WITH(scope.fail_bad_alloc(), OutOfMemoryError,
                      "repeat: 'h w -> (h w c)' (input [2, 2]): out of memory (std::bad_alloc)");
  }
}

TEST(Size, BadAllocLeavingItsScopesIsNamedByTheInnermostOne) {
  const std::vector<Shape> inputs = {{2, 3}, {3, 4}};
  std::string message;
  try {
    const AllocationScope outer("outer_op");
    const AllocationScope inner("inner_op", "pattern", inputs, "a, b");
    std::vector<double> huge;
    huge.reserve(size_t{1} << 50);  // 8 PiB: refused by the system, a bare std::bad_alloc
  } catch (const std::bad_alloc&) {
    message = bad_alloc_message("fallback");  // outside every scope, as the Python translator and the CLI
  }
  EXPECT_EQ(message, "inner_op: 'pattern' (a [2, 3], b [3, 4]): out of memory (std::bad_alloc)");
  EXPECT_EQ(bad_alloc_message("fallback"), "fallback: out of memory (std::bad_alloc)");  // taken once
}

TEST(Size, AnUnwoundScopeNamesNoLaterBadAlloc) {
  try {
    const AllocationScope failed("failed_op");
    fail<ShapeError>("failed_op: bad shape");
  } catch (const ShapeError&) {
  }
  {
    const AllocationScope next("next_op");  // a new call: the old scope is forgotten
    EXPECT_EQ(bad_alloc_message("fallback"), "next_op: out of memory (std::bad_alloc)");
  }
  try {
    const AllocationScope failed("failed_op");
    throw std::bad_alloc();
  } catch (const std::bad_alloc&) {
    forget_unwound_scope();  // what the Python translator does for any exception it handled
  }
  EXPECT_EQ(bad_alloc_message("fallback"), "fallback: out of memory (std::bad_alloc)");
}

TEST(Size, NamedInputsPairWithTheirShapes) {
  const std::vector<Shape> three = {{1}, {2}, {3}}, two = {{1}, {2}};
  const AllocationScope scope("op", {}, three, "q, k, v");
  EXPECT_EQ(AllocationScope::describe(""), "op (q [1], k [2], v [3])");
  const AllocationScope unnamed("op2", {}, two, "operands");  // one word for all: listed after it
  EXPECT_EQ(AllocationScope::describe(""), "op2 (operands [1], [2])");
}

TEST(Size, AllocationTheSystemRefusesIsOutOfMemory) {
  const LimitGuard unlimited(std::numeric_limits<size_t>::max());
  // 2^50 floats (4 PiB): past the address space, so aligned_alloc returns null.
  EXPECT_THROW_WITH(
      Tensor::empty({int64_t{1} << 50}, DType::f32), OutOfMemoryError,
      "Tensor::empty: out of memory allocating output [1125899906842624] float32 (4503599627370496 bytes");
  EXPECT_THROW_WITH(kernels::empty_pooled({int64_t{1} << 50}, DType::f32), OutOfMemoryError,
                    "out of memory allocating output [1125899906842624] float32");
}

TEST(Size, FromBlobAndViewOfRejectOverflowingExtents) {
  float x[4] = {};
  EXPECT_THROW_WITH(Tensor::from_blob(x, {2, 2}, DType::f32, {kMaxElements, 1}), ShapeError,
                    "address more than 2^62 float32 elements");
  const Tensor t = Tensor::zeros({4});
  EXPECT_THROW_WITH(Tensor::view_of(t.storage(), DType::f32, {3}, {INT64_MAX / 2 + 1}, 0), IndexError,
                    "outside storage of 4 elements");
}

}  // namespace
}  // namespace qkv
