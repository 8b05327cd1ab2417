// Outputs and intermediates too large for QKV_MAX_ALLOC_BYTES fail before any step
// runs, with the equation, the operand shapes and the bytes in the message.
#include <gtest/gtest.h>

#include "common/expect.h"
#include "common/limit_guard.h"
#include "einsum/contract.h"
#include "qkv/einsum.h"
#include "qkv/size.h"

namespace qkv {
namespace {

TEST(EinsumSize, OutputOverTheLimitNamesEquationShapesAndBytes) {
  const LimitGuard limit(size_t{1} << 30);
  const Tensor a = Tensor::ones({131072, 1}), b = Tensor::ones({1, 32768});
  EXPECT_THROW_WITH(einsum("ij,jk->ik", {a, b}), OutOfMemoryError,
                    "einsum: 'ij,jk->ik' (operands [131072, 1], [1, 32768]): output [131072, 32768] float32 needs "
                    "17179869184 bytes (16.0 GiB), more than the limit of 1073741824 bytes");
}

TEST(EinsumSize, OutputWhoseBytesOverflowIsOutOfMemory) {
  const Tensor a = Tensor::ones({1}).expand({int64_t{1} << 31});  // zero stride: no memory
  EXPECT_THROW_WITH(einsum("i,j->ij", {a, a}), OutOfMemoryError,
                    "einsum: 'i,j->ij' (operands [2147483648], [2147483648]): output [2147483648, 2147483648] float32 "
                    "needs 2^64 bytes: the size overflows");
}

TEST(EinsumSize, LargeLaterStepFailsBeforeTheFirstStepRuns) {
  const LimitGuard limit(size_t{1} << 30);
  const std::vector<Tensor> ops = {Tensor::ones({256, 256}), Tensor::ones({256, 256}), Tensor::ones({1 << 20})};
  const std::vector<Shape> shapes = einsum_detail::shapes_of(ops);
  const einsum_detail::Spec spec = einsum_detail::parse("ij,jk,l->ikl", shapes);
  einsum_detail::ExecTrace trace;
  // Step 1 (a GEMM) fits; step 2's output of 256 GiB does not.
  EXPECT_THROW_WITH(einsum_detail::execute(spec, ops, {{0, 1}, {0, 1}}, &trace), OutOfMemoryError,
                    "output [256, 256, 1048576] float32 needs 274877906944 bytes");
  EXPECT_TRUE(trace.kernels.empty()) << "step 1 ran before the size check: " << trace.kernels.size();
}

TEST(EinsumSize, IntermediateOverTheLimitIsNamedAsSuch) {
  const LimitGuard limit(size_t{1} << 30);
  const Tensor a = Tensor::ones({256, 256}), b = Tensor::ones({256, 256}), c = Tensor::ones({1, 1, 1, 1});
  EinsumOptions options;
  options.path = std::vector<std::vector<int>>{{0, 1}, {0, 1}};  // the outer product abcd first
  EXPECT_THROW_WITH(einsum("ab,cd,abcd->", {a, b, c}, options), OutOfMemoryError,
                    "intermediate [256, 256, 256, 256] float32 needs 17179869184 bytes");
  options.path = std::nullopt;
  // One step of three, contracted pairwise from the last operand: ab with cd first,
  // keeping abcd for the broadcast operand.
  options.optimize = EinsumOptimize::none;
  EXPECT_THROW_WITH(einsum("abcd,cd,ab->", {c, b, a}, options), OutOfMemoryError,
                    "intermediate [256, 256, 256, 256] float32 needs 17179869184 bytes");
  // Small enough once the limit allows it: a real result (sum of ones over 2^32 terms).
  EXPECT_EQ(einsum("ab,cd,abcd->", {Tensor::ones({4, 4}), Tensor::ones({4, 4}), c}).item(), 256.0);
}

}  // namespace
}  // namespace qkv
