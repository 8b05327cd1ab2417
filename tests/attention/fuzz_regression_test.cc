// Inputs the atheris harness over the Python API (fuzz/python/api_fuzzer.py) found
// to crash attention, one test per finding; docs/testing.md lists the fuzz runs.
#include <gtest/gtest.h>

#include "common/expect.h"
#include "qkv/attention.h"

namespace qkv {
namespace {

// q with no heads under enable_gqa: the GQA group was 0 heads / 1 head = 0 and the
// k/v batch was divided by it (SIGFPE in make_problem). As torch, the output is
// empty: [1, 0, Lq, Dv]; with 2 k/v heads the shapes are refused instead.
TEST(AttentionFuzzRegression, GqaWithZeroQueryHeads) {
  AttentionOptions o;
  o.enable_gqa = true;
  o.is_causal = true;
  const Tensor q = Tensor::zeros({1, 0, 0, 1}, DType::f64);  // [B, Hq=0, Lq, Dk]
  const Tensor k = Tensor::ones({1, 1, 1, 1}, DType::f64);   // [B, Hk=1, Lk, Dk]
  const Tensor v = Tensor::ones({1, 1, 1, 2}, DType::f64);   // [B, Hk=1, Lk, Dv]
  for (const Tensor& qq : {q, q.to(DType::f32)}) {
    const auto kk = k.to(qq.dtype()), vv = v.to(qq.dtype());
    EXPECT_EQ(scaled_dot_product_attention(qq, kk, vv, o).output.shape(), (Shape{1, 0, 0, 2}));
    EXPECT_EQ(attention_reference(qq, kk, vv, o).output.shape(), (Shape{1, 0, 0, 2}));
  }
  const Tensor k2 = Tensor::ones({1, 2, 1, 1}, DType::f64), v2 = Tensor::ones({1, 2, 1, 2}, DType::f64);
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k2, v2, o), ShapeError, "scaled_dot_product_attention");
}

// No keys (Lk == 0) and a batch of 2: the float64 reference added the second batch's
// offset to the null data() of the empty k and v copies, undefined behaviour that
// UBSan reports (build/asan; the release build computes the same numbers either way).
TEST(AttentionFuzzRegression, NoKeysWithABatch) {
  const Tensor q = Tensor::ones({2, 1, 2, 0}, DType::f64);  // [B, H, Lq, Dk=0]
  const Tensor k = Tensor::ones({2, 1, 0, 0}, DType::f64);  // [B, H, Lk=0, Dk]
  const Tensor v = Tensor::ones({2, 1, 0, 1}, DType::f64);  // [B, H, Lk, Dv]
  const Tensor ref = attention_reference(q, k, v).output;
  EXPECT_EQ(ref.shape(), (Shape{2, 1, 2, 1}));
  const Tensor out = scaled_dot_product_attention(q, k, v).output;  // f64: the reference
  EXPECT_EQ(out.shape(), (Shape{2, 1, 2, 1}));
}

}  // namespace
}  // namespace qkv
