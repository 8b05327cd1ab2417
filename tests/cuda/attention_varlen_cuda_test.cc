// scaled_dot_product_attention_varlen on a GPU (ctest label cuda): one launch for
// sequences of different lengths (an empty one too), each checked against the CPU
// float64 reference of that sequence alone by the FlashAttention criterion
// (cuda_oracle.h).
#include <gtest/gtest.h>

#include <vector>

#include "common/relative_error.h"
#include "cuda/cuda_oracle.h"
#include "qkv/attention.h"
#include "qkv/cuda.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

using cuda_test::Config;
using cuda_test::lowp_attention;
using testing::max_abs_error;

void check_varlen(const std::vector<int32_t>& lq, const std::vector<int32_t>& lk, int64_t hq, int64_t hk, int64_t d,
                  DType dtype, bool causal) {
  std::vector<int32_t> cq{0}, ck{0};
  for (size_t s = 0; s < lq.size(); ++s) {
    cq.push_back(cq.back() + lq[s]);
    ck.push_back(ck.back() + lk[s]);
  }
  const Tensor q = Tensor::randn({cq.back(), hq, d}, 11, dtype);  // [Tq, Hq, D]
  const Tensor k = Tensor::randn({ck.back(), hk, d}, 12, dtype);
  const Tensor v = Tensor::randn({ck.back(), hk, d}, 13, dtype);
  AttentionOptions o;
  o.is_causal = causal;
  o.enable_gqa = hq != hk;
  o.return_logsumexp = true;
  const Tensor cu_q = Tensor::from_vector(cq, {static_cast<int64_t>(cq.size())});
  const Tensor cu_k = Tensor::from_vector(ck, {static_cast<int64_t>(ck.size())}).to(Device::cuda());
  const AttentionResult got = scaled_dot_product_attention_varlen(q.to(Device::cuda()), k.to(Device::cuda()),
                                                                  v.to(Device::cuda()), cu_q, cu_k, o);
  const Tensor out = got.output.to(Device::cpu()), lse = got.logsumexp->to(Device::cpu());
  for (size_t s = 0; s < lq.size(); ++s) {
    SCOPED_TRACE("sequence " + std::to_string(s));
    if (lq[s] == 0) continue;
    const auto seq = [](const Tensor& t, int32_t a, int32_t b) {
      return t.slice(0, a, b).permute({1, 0, 2}).unsqueeze(0).to(DType::f64).contiguous();  // [1, H, L, D]
    };
    const Tensor qs = seq(q, cq[s], cq[s + 1]), ks = seq(k, ck[s], ck[s + 1]), vs = seq(v, ck[s], ck[s + 1]);
    const AttentionResult want = attention_reference(qs, ks, vs, o);
    const Config c{1, hq, hk, lq[s], lk[s], d, dtype, causal};
    const Tensor yardstick = lowp_attention(qs, ks, vs, std::nullopt, c);
    const Tensor mine = out.slice(0, cq[s], cq[s + 1]).permute({1, 0, 2}).unsqueeze(0);
    const double err = max_abs_error(mine, want.output), base = max_abs_error(yardstick, want.output);
    EXPECT_LE(err, 2 * base + 1e-5) << "kernel " << err << ", step-by-step " << base;
    EXPECT_LE(max_abs_error(lse.slice(1, cq[s], cq[s + 1]).unsqueeze(0), *want.logsumexp), 2e-3);
  }
}

TEST(CudaAttentionVarlen, SequencesOfDifferentLengths) {
  if (!cuda::available()) GTEST_FAIL() << "no GPU: run these tests only where one is (ctest -L cuda)";
  check_varlen({5, 130, 0, 64, 257}, {9, 100, 3, 64, 257}, 4, 4, 128, DType::bf16, false);
  check_varlen({5, 130, 1, 64, 257}, {5, 130, 1, 64, 257}, 4, 2, 64, DType::f16, true);
  check_varlen({300}, {20}, 2, 1, 128, DType::bf16, true);
}

}  // namespace
}  // namespace qkv
