// Out of memory in attention names the call and its shapes (qkv/out_of_memory.h): the
// allocations qkv checks (OutOfMemoryError over QKV_MAX_ALLOC_BYTES) and a bare
// std::bad_alloc from the reference's std::vectors, named where it is caught.
#include <gtest/gtest.h>

#include <new>
#include <string>

#include "common/expect.h"
#include "common/limit_guard.h"
#include "qkv/attention.h"
#include "qkv/out_of_memory.h"

namespace qkv {
namespace {

TEST(AttentionOutOfMemory, OverTheLimitNamesScaledDotProductAttentionAndItsShapes) {
  const Tensor q = Tensor::ones({1, 2, 64, 8}), k = Tensor::ones({1, 2, 32, 8}), v = Tensor::ones({1, 2, 32, 4});
  const Tensor mask = Tensor::ones({64, 32}, DType::b8);
  const LimitGuard limit(size_t{1} << 10);  // the [1, 2, 64, 4] f32 output alone needs 2 KiB
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, v), OutOfMemoryError,
                    "scaled_dot_product_attention (q [1, 2, 64, 8], k [1, 2, 32, 8], v [1, 2, 32, 4]): ");
  AttentionOptions o;
  o.attn_mask = mask;
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, v, o), OutOfMemoryError,
                    "(q [1, 2, 64, 8], k [1, 2, 32, 8], v [1, 2, 32, 4], attn_mask [64, 32]): ");
  EXPECT_THROW_WITH(attention_reference(q, k, v), OutOfMemoryError, "attention_reference (q [1, 2, 64, 8], ");
}

TEST(AttentionOutOfMemory, BadAllocOfTheReferenceIsNamedWhereItIsCaught) {
  // [2^20, 2^20] float64 scores: an 8 TiB std::vector the system refuses (bad_alloc).
  const Tensor q = Tensor::ones({1, 1, int64_t{1} << 20, 1}, DType::f64);
  std::string message;
  try {
    (void)attention_reference(q, q, q);
    ADD_FAILURE() << "8 TiB allocated";
  } catch (const std::bad_alloc&) {
    message = bad_alloc_message("caller");
  }
  EXPECT_EQ(message,
            "attention_reference (q [1, 1, 1048576, 1], k [1, 1, 1048576, 1], v [1, 1, 1048576, 1]): "
            "out of memory (std::bad_alloc)");
}

}  // namespace
}  // namespace qkv
