// Inputs the atheris harness over the Python API (fuzz/python/api_fuzzer.py) found
// to crash attention, one test per finding; docs/testing.md lists the fuzz runs.
#include <gtest/gtest.h>

#include <vector>

#include "common/expect.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"

namespace qkv {
namespace {

// q with no heads under enable_gqa: the GQA group was 0 heads / 1 head = 0 and the
// k/v batch was divided by it (SIGFPE in make_problem). As torch, the output is
// empty: [1, 0, Lq, Dv], for any number of k/v heads: torch's
// pre_process_group_query_attention_input (aten/src/ATen/native/transformers/attention.cpp)
// only asks Hq % Hk == 0 and repeats each k/v head Hq / Hk = 0 times (torch 2.15 gives
// [1, 0, 3, 6] for q [1, 0, 3, 4], k [1, 2, 5, 4], v [1, 2, 5, 6], and zero k/v gradients);
// qkv refused 2 k/v heads. No k/v heads stays refused (Hq % 0).
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
  const Tensor q2 = Tensor::zeros({2, 0, 3, 4}, DType::f32);  // [B, Hq=0, Lq, Dk]
  const Tensor k2 = Tensor::ones({2, 2, 5, 4}, DType::f32);   // [B, Hk=2, Lk, Dk]
  const Tensor v2 = Tensor::ones({2, 2, 5, 6}, DType::f32);   // [B, Hk, Lk, Dv]
  AttentionOptions grad = o;
  grad.return_logsumexp = true;
  const AttentionResult r = scaled_dot_product_attention(q2, k2, v2, grad);
  EXPECT_EQ(r.output.shape(), (Shape{2, 0, 3, 6}));
  EXPECT_EQ(attention_reference(q2, k2, v2, o).output.shape(), (Shape{2, 0, 3, 6}));
  const AttentionGradients g =
      scaled_dot_product_attention_backward(q2, k2, v2, r.output, r.output, *r.logsumexp, grad);
  EXPECT_EQ(g.dq.shape(), q2.shape());
  EXPECT_EQ(g.dk.shape(), k2.shape());
  EXPECT_EQ(g.dv.shape(), v2.shape());
  EXPECT_EQ(g.dk.to_vector<float>(), std::vector<float>(80, 0.0f));
  EXPECT_EQ(g.dv.to_vector<float>(), std::vector<float>(120, 0.0f));
  const Tensor k0 = Tensor::ones({2, 0, 5, 4}, DType::f32), v0 = Tensor::ones({2, 0, 5, 6}, DType::f32);
  EXPECT_THROW_WITH(scaled_dot_product_attention(q2, k0, v0, o), ShapeError,
                    "scaled_dot_product_attention: with enable_gqa, q heads (0) must be a multiple of k/v heads (0)");
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
