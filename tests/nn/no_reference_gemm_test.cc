// The attention paths users reach never run a GEMM on oneDNN 2.6's reference matmul
// (`ref:any`, 100x slower or more: 15 s for one (8, 12, 512, 64) attention call on the MHA
// layer's head views before gemm_panels staged non-dense rows, 9.9 s for (1, 8, 1024, 64)
// with oneDNN capped at AVX2 before attention stopped packing K there; docs/kernels.md).
// detail::gemm_reference_runs counts such calls; each case below must leave it as it was.
// The ctest avx2.machine runs this file with oneDNN capped at AVX2 as well.
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/gemm_internal.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/attention_mods.h"
#include "qkv/nn/layer_attention.h"
#include "qkv/nn/mha.h"

namespace qkv {
namespace {

void expect_no_reference_gemm(const std::string& what, const std::function<void()>& run) {
  const int64_t before = detail::gemm_reference_runs();
  run();
  EXPECT_EQ(detail::gemm_reference_runs(), before) << what << " ran a GEMM on oneDNN's reference matmul";
}

// q, k, v [B, H, L, D] as views of one [B, L, 3, H, D] projection (rows 3 H D apart), as the
// MHA layers make them.
struct HeadViews {
  Tensor qkv, q, k, v;
  HeadViews(int64_t b, int64_t l, int64_t h, int64_t d, DType dt)
      : qkv(Tensor::randn({b, l, 3, h, d}, 1).to(dt)),
        q(qkv.select(2, 0).permute({0, 2, 1, 3})),
        k(qkv.select(2, 1).permute({0, 2, 1, 3})),
        v(qkv.select(2, 2).permute({0, 2, 1, 3})) {}
};

TEST(NoReferenceGemm, AttentionOnHeadViewsAndContiguousHeads) {
  for (const DType dt : {DType::f32, DType::bf16, DType::f16, DType::f64}) {
    const HeadViews x(2, 512, 2, 64, dt);
    const std::string name(dtype_name(dt));
    for (const bool causal : {false, true}) {
      AttentionOptions o;
      o.is_causal = causal;
      o.return_logsumexp = true;
      expect_no_reference_gemm(name + (causal ? " causal" : "") + " head views", [&] {
        const AttentionResult r = scaled_dot_product_attention(x.q, x.k, x.v, o);
        const Tensor g = Tensor::randn(r.output.shape(), 2).to(dt);
        (void)scaled_dot_product_attention_backward(x.q, x.k, x.v, r.output, g, *r.logsumexp, o);
      });
      expect_no_reference_gemm(name + (causal ? " causal" : "") + " contiguous", [&] {
        (void)scaled_dot_product_attention(x.q.contiguous(), x.k.contiguous(), x.v.contiguous(), o);
      });
    }
  }
}

TEST(NoReferenceGemm, AttentionOptionsAndModifiers) {
  const HeadViews x(1, 1024, 2, 64, DType::f32);
  std::vector<std::pair<std::string, AttentionOptions>> cases(5);
  cases[0].first = "matmul_precision medium", cases[0].second.matmul_precision = MatmulPrecision::medium;
  cases[1].first = "int8 Q K^T", cases[1].second.qk_quantization = QKQuantization::int8;
  cases[2].first = "sliding window", cases[2].second.mods = AttentionMods::sliding_window(256, 0);
  cases[3].first = "BigBird", cases[3].second.mods = AttentionMods::bigbird(64, 1, 2, 5, 1024);
  cases[4].first = "weights", cases[4].second.return_weights = true;
  for (const auto& [name, o] : cases) {
    expect_no_reference_gemm(name, [&] { (void)scaled_dot_product_attention(x.q, x.k, x.v, o); });
  }
}

TEST(NoReferenceGemm, MultiheadAttentionLayersFloatAndInt8) {
  nn::MultiheadAttentionConfig c;
  c.embed_dim = 128, c.num_heads = 2, c.batch_first = true;
  const nn::MultiheadAttention m(c, 3);
  const nn::MultiheadAttention q8 = m.quantize_dynamic();
  const Tensor x = Tensor::randn({2, 512, 128}, 4);
  nn::MultiheadAttentionOptions o;
  o.need_weights = false;
  expect_no_reference_gemm("MultiheadAttention forward and backward", [&] {
    const nn::MultiheadAttentionResult r = m.forward(x, x, x, o);
    (void)m.backward(x, x, x, Tensor::randn(r.output.shape(), 5), o);
  });
  expect_no_reference_gemm("quantized MultiheadAttention", [&] { (void)q8.forward(x, x, x, o); });
  o.attention = nn::LayerAttention::softmax(MatmulPrecision::medium);
  expect_no_reference_gemm("quantized MultiheadAttention, bf16 attention", [&] { (void)q8.forward(x, x, x, o); });
}

}  // namespace
}  // namespace qkv
