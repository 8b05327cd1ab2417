// scaled_dot_product_attention_varlen on the CPU: each packed sequence against the
// float64 reference of that sequence alone, and the checks of the packed layout.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "common/expect.h"
#include "common/relative_error.h"
#include "qkv/attention.h"
#include "qkv/cuda.h"

namespace qkv {
namespace {

using testing::max_abs_error;

Tensor starts(const std::vector<int32_t>& v) { return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}); }

// [1, H, L, D] float64 view of rows a..b of a packed [T, H, D] tensor.
Tensor sequence(const Tensor& t, int64_t a, int64_t b) {
  return t.slice(0, a, b).permute({1, 0, 2}).unsqueeze(0).to(DType::f64);
}

void check(DType dtype, bool causal, int64_t hq, int64_t hk, double tol) {
  const std::vector<int32_t> cq{0, 3, 3, 40, 41}, ck{0, 5, 9, 30, 31};  // an empty query sequence too
  const Tensor q = Tensor::randn({41, hq, 16}, 1, dtype), k = Tensor::randn({31, hk, 16}, 2, dtype);
  const Tensor v = Tensor::randn({31, hk, 8}, 3, dtype);
  AttentionOptions o;
  o.is_causal = causal;
  o.enable_gqa = hq != hk;
  o.return_logsumexp = true;
  o.scale = 0.3;
  const AttentionResult got = scaled_dot_product_attention_varlen(q, k, v, starts(cq), starts(ck), o);
  ASSERT_EQ(got.output.shape(), (Shape{41, hq, 8}));
  ASSERT_EQ(got.logsumexp->shape(), (Shape{hq, 41}));
  for (size_t s = 0; s + 1 < cq.size(); ++s) {
    if (cq[s + 1] == cq[s]) continue;
    const AttentionResult want = attention_reference(sequence(q, cq[s], cq[s + 1]), sequence(k, ck[s], ck[s + 1]),
                                                     sequence(v, ck[s], ck[s + 1]), o);
    EXPECT_LE(max_abs_error(sequence(got.output, cq[s], cq[s + 1]), want.output), tol) << s;
    EXPECT_LE(max_abs_error(got.logsumexp->slice(1, cq[s], cq[s + 1]).unsqueeze(0), *want.logsumexp), tol) << s;
  }
}

TEST(AttentionVarlen, EachSequenceMatchesTheReferenceAlone) {
  check(DType::f32, false, 2, 2, 1e-5);
  check(DType::f32, true, 4, 2, 1e-5);
  check(DType::f64, true, 3, 3, 1e-12);
  check(DType::bf16, false, 2, 1, 2e-2);
}

TEST(AttentionVarlen, BadPackingIsAClearError) {
  const Tensor q = Tensor::randn({6, 2, 8}, 1), k = Tensor::randn({5, 2, 8}, 2);
  const char* op = "scaled_dot_product_attention_varlen: ";
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q, k, k, starts({0, 6}), starts({0, 4})), ValueError,
                    "cu_seqlens_k must end at the packed length 5");
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q, k, k, starts({0, 4, 2, 6}), starts({0, 1, 2, 5})),
                    ValueError, "cu_seqlens_q must start at 0 and not decrease");
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q, k, k, starts({1, 6}), starts({0, 5})), ValueError, op);
  // An increasing start past the packed rows was reported as "must start at 0 and not decrease".
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q, k, k, starts({0, 7, 6}), starts({0, 2, 5})), ValueError,
                    "cu_seqlens_q must not pass the packed length 6 of [6, 2, 8], got 7 at index 1");
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q, k, k, starts({0, 6}), starts({0, 2, 5})), ShapeError,
                    "must have one length");
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q, k, k, Tensor::zeros({2}), starts({0, 5})), DTypeError,
                    "int32 or int64");
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q.unsqueeze(0), k, k, starts({0, 6}), starts({0, 5})),
                    ShapeError, "must be [T, H, D]");
  const Tensor k1 = Tensor::randn({5, 1, 8}, 2);
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q, k1, k1, starts({0, 6}), starts({0, 5})), ShapeError,
                    "with enable_gqa");
  AttentionOptions masked;
  masked.attn_mask = Tensor::ones({6, 5}, DType::b8);
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q, k, k, starts({0, 6}), starts({0, 5}), masked), ValueError,
                    "attn_mask, dropout_p, return_weights and mods are not supported");
}

// Errors name the varlen call (they named scaled_dot_product_attention, from a sequence's call, and
// a batch of empty sequences took mixed dtypes); Dk = 0 is the plain call's uniform average (the
// default scale 1/sqrt(0) = inf failed every sequence).
TEST(AttentionVarlen, DtypesScalesAndAnEmptyHeadSize) {
  const Tensor q = Tensor::randn({6, 2, 8}, 1), k = Tensor::randn({5, 2, 8}, 2);
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q.to(DType::f16), k, k, starts({0, 6}), starts({0, 5})),
                    DTypeError,
                    "scaled_dot_product_attention_varlen: q, k and v must share one floating dtype, got float16, "
                    "float32, float32");
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q.slice(0, 0, 0).to(DType::f64), k.slice(0, 0, 0),
                                                        k.slice(0, 0, 0), starts({0, 0}), starts({0, 0})),
                    DTypeError, "got float64, float32, float32");
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q.to(DType::i32), k.to(DType::i32), k.to(DType::i32),
                                                        starts({0, 6}), starts({0, 5})),
                    DTypeError, "must share one floating dtype, got int32");
  AttentionOptions nan;
  nan.scale = std::nan("");
  EXPECT_THROW_WITH(scaled_dot_product_attention_varlen(q, k, k, starts({0, 6}), starts({0, 5}), nan), ValueError,
                    "scaled_dot_product_attention_varlen: scale must be finite, got nan");
  const Tensor q0 = q.slice(2, 0, 0), k0 = k.slice(2, 0, 0), v = Tensor::randn({5, 2, 4}, 3);
  for (bool causal : {false, true}) {
    AttentionOptions o;
    o.is_causal = causal;
    const Tensor got = scaled_dot_product_attention_varlen(q0, k0, v, starts({0, 2, 6}), starts({0, 3, 5}), o).output;
    for (int64_t s = 0; s < 2; ++s) {  // the plain call over each sequence, itself against attention_reference
      const int64_t a = s == 0 ? 0 : 2, b = s == 0 ? 2 : 6, c = s == 0 ? 0 : 3, d = s == 0 ? 3 : 5;
      const AttentionResult want = attention_reference(sequence(q0, a, b), sequence(k0, c, d), sequence(v, c, d), o);
      EXPECT_LE(max_abs_error(sequence(got, a, b), want.output), 1e-6) << causal << s;
    }
  }
}

// Without a GPU (CI; this build may or may not have the CUDA backend): no devices, and
// a tensor on cuda:0 is a DeviceError naming the operation, never a crash. With one,
// the same calls work (tests/cuda cover the GPU itself).
TEST(Cuda, DevicesAreCountedAndAMissingOneIsAClearError) {
  if (cuda::device_count() > 0) {
    EXPECT_TRUE(cuda::built());
    EXPECT_EQ(Tensor::zeros({2}).to(Device::cuda()).device(), Device::cuda());
    return;
  }
  EXPECT_FALSE(cuda::available());
  EXPECT_EQ(cuda::current_stream(), nullptr);
  EXPECT_THROW_WITH(cuda::properties(0), DeviceError, "cuda:0");
  EXPECT_THROW_WITH(Tensor::zeros({2}).to(Device::cuda()), DeviceError, "to: no allocator for device cuda:0");
  EXPECT_THROW_WITH(Tensor::empty({2}, DType::f32, Device::cuda()), DeviceError,
                    cuda::built() ? "no such GPU: 0 visible" : "no CUDA backend");
  EXPECT_THROW_WITH(Tensor::empty({2}, DType::f32, Device::cuda(3)), DeviceError, "cuda:3");
}

}  // namespace
}  // namespace qkv
