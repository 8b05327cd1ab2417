// Repeat axes and list stacking whose results cannot be allocated: a qkv error with
// the pattern, the shapes and the bytes, never a wrapped size (a segfault before).
#include <gtest/gtest.h>

#include "common/expect.h"
#include "common/limit_guard.h"
#include "qkv/einops.h"
#include "qkv/size.h"

namespace qkv {
namespace {

TEST(EinopsSize, RepeatWhoseBytesOverflowIsOutOfMemory) {
  // 2 x 2 x 2^60 floats: 2^62 elements fit int64, their 2^64 bytes wrapped to 0 and
  // permuted_copy wrote through a 0-byte buffer.
  EXPECT_THROW_WITH(einops::repeat(Tensor::ones({2, 2}), "h w -> (h w c)", {{"c", int64_t{1} << 60}}), OutOfMemoryError,
                    "repeat: 'h w -> (h w c)' (input [2, 2]): output [2, 2, 1152921504606846976] float32 needs "
                    "2^64 bytes: the size overflows");
}

TEST(EinopsSize, RepeatAxesMultiplyingPast2To62AreShapeErrors) {
  EXPECT_THROW_WITH(einops::repeat(Tensor::ones({2, 2}), "h w -> (h w c)", {{"c", int64_t{1} << 62}}), ShapeError,
                    "Axis lengths multiply past 2^62: 4 * 4611686018427387904");
  EXPECT_THROW_WITH(einops::repeat(Tensor::ones({2, 2}), "h w -> h w c", {{"c", int64_t{1} << 61}}), ShapeError,
                    "Output shape [2, 2, 2305843009213693952] has more than 2^62 elements");
  EXPECT_THROW_WITH(einops::rearrange(Tensor::ones({4}), "(a b) -> a b", {{"b", int64_t{1} << 62}, {"a", 4}}),
                    ShapeError, "Error while processing rearrange-reduction pattern");
}

TEST(EinopsSize, RepeatOverTheLimitFailsBeforeCopying) {
  const LimitGuard limit(size_t{1} << 20);
  EXPECT_THROW_WITH(
      einops::repeat(Tensor::ones({2, 3}), "h w -> h (w c)", {{"c", 65536}}), OutOfMemoryError,
      "repeat: 'h w -> h (w c)' (input [2, 3]): output [2, 3, 65536] float32 needs 1572864 bytes (1.5 MiB), "
      "more than the limit of 1048576 bytes");
  EXPECT_EQ(einops::repeat(Tensor::ones({2, 3}), "h w -> h (w c)", {{"c", 4}}).shape(), (Shape{2, 12}));
}

TEST(EinopsSize, ListStackOverTheLimitNamesTheList) {
  const LimitGuard limit(size_t{8} << 10);
  const std::vector<Tensor> xs(3, Tensor::ones({1024}));
  EXPECT_THROW_WITH(einops::rearrange(xs, "n x -> x n"), OutOfMemoryError,
                    "rearrange (list of elements [1024]): output [3, 1024] float32 needs 12288 bytes");
}

}  // namespace
}  // namespace qkv
