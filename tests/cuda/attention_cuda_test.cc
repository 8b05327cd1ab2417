// The CUDA attention kernel against qkv's CPU float64 reference (ctest label cuda; runs
// only on a machine with a GPU: docs/cuda.md). The error criterion is FlashAttention's
// (its tests/test_flash_attn.py): the kernel's largest error against the float64
// result of the same rounded inputs may be at most twice that of attention computed
// step by step in the inputs' precision (scores, weights and output each rounded to
// bf16/f16, as PyTorch's math backend does in that dtype), plus a tiny absolute slack.
#include <gtest/gtest.h>

#include <optional>
#include <random>
#include <string>

#include "common/relative_error.h"
#include "cuda/cuda_oracle.h"
#include "qkv/attention.h"
#include "qkv/cuda.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

using cuda_test::Config;
using cuda_test::lowp_attention;
using cuda_test::make_mask;
using testing::max_abs_error;

class CudaAttention : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_FAIL() << "no GPU: run these tests only where one is (ctest -L cuda)";
  }
};

void check_config(const Config& c, uint64_t seed) {
  SCOPED_TRACE(c.name());
  const Tensor q = Tensor::randn({c.b, c.hq, c.lq, c.d}, seed, c.dtype);
  const Tensor k = Tensor::randn({c.b, c.hk, c.lk, c.d}, seed + 1, c.dtype);
  const Tensor v = Tensor::randn({c.b, c.hk, c.lk, c.d}, seed + 2, c.dtype);
  AttentionOptions o;
  o.is_causal = c.causal;
  o.enable_gqa = c.hq != c.hk;
  o.return_logsumexp = true;
  std::optional<Tensor> mask64;
  AttentionOptions dev = o;
  if (c.mask != 0) {
    const Tensor m = make_mask(c, seed + 3);
    dev.attn_mask = m.to(Device::cuda());
    mask64 = m.dtype() == DType::b8 ? std::optional<Tensor>() : m.to(DType::f64);
    o.attn_mask = c.mask == 1 ? m : *mask64;
  }
  const AttentionResult got =
      scaled_dot_product_attention(q.to(Device::cuda()), k.to(Device::cuda()), v.to(Device::cuda()), dev);
  const Tensor q64 = q.to(DType::f64), k64 = k.to(DType::f64), v64 = v.to(DType::f64);
  const AttentionResult want = attention_reference(q64, k64, v64, o);
  if (c.mask == 1) mask64 = o.attn_mask->to(DType::f64);  // bool True -> 1: rebuild as 0 / -inf below
  if (c.mask == 1) {
    Tensor additive = Tensor::empty(mask64->shape(), DType::f64);
    for (int64_t i = 0; i < additive.numel(); ++i)
      additive.data<double>()[i] = mask64->data<double>()[i] != 0 ? 0.0 : -INFINITY;
    mask64 = additive;
  }
  const Tensor yardstick = lowp_attention(q64, k64, v64, mask64, c);
  const Tensor out = got.output.to(Device::cpu());
  ASSERT_EQ(out.shape(), want.output.shape());
  const double err = max_abs_error(out, want.output), base = max_abs_error(yardstick, want.output);
  EXPECT_LE(err, 2 * base + 1e-5) << "kernel error " << err << ", step-by-step " << c.name() << " error " << base;
  const double lse_err = max_abs_error(got.logsumexp->to(Device::cpu()), *want.logsumexp);
  EXPECT_LE(lse_err, 2e-3) << "logsumexp";
}

TEST_F(CudaAttention, SmallEdgeShapes) {
  const Config configs[] = {
      {1, 1, 1, 1, 1, 64},
      {1, 1, 1, 1, 1, 128},
      {1, 2, 2, 127, 129, 64},
      {2, 3, 3, 128, 64, 128},
      {1, 1, 1, 200, 33, 128},
      {1, 2, 2, 33, 200, 64, DType::f16},
      {1, 4, 1, 130, 130, 128},
      {1, 4, 2, 257, 300, 64},
      {1, 1, 1, 300, 300, 128, DType::f16, true},
      {1, 2, 2, 129, 257, 64, DType::bf16, true},
  };
  uint64_t seed = 10;
  for (const Config& c : configs) check_config(c, seed += 10);
}

TEST_F(CudaAttention, CausalTopLeftWhenLqDiffersFromLk) {
  check_config({1, 2, 2, 300, 100, 128, DType::bf16, true}, 71);
  check_config({1, 2, 2, 100, 300, 64, DType::f16, true}, 72);
}

TEST_F(CudaAttention, Masks) {
  check_config({1, 2, 2, 150, 190, 128, DType::bf16, false, 1}, 81);
  check_config({2, 1, 1, 70, 260, 64, DType::f16, false, 2}, 82);
}

TEST_F(CudaAttention, LongKeys) { check_config({1, 2, 1, 256, 2000, 128, DType::bf16, false}, 91); }

// More batch entries than a grid's y dimension holds (65535): the grid's x runs over
// query tiles times entries.
TEST_F(CudaAttention, MoreThan65535BatchEntries) { check_config({66000, 1, 1, 8, 8, 64}, 95); }

// A long causal problem (16384 rows: 128 query tiles a head, heaviest first; with
// QKV_CUDA_FLASH_GROUP=3 in groups of 3 heads, the last one partial): sampled rows
// against the float64 reference of row i over keys 0..i.
TEST_F(CudaAttention, LongCausalRowsSampled) {
  const int64_t h = 7, l = 16384, d = 64;
  const Tensor q = Tensor::randn({1, h, l, d}, 97, DType::bf16);
  const Tensor k = Tensor::randn({1, h, l, d}, 98, DType::bf16);
  const Tensor v = Tensor::randn({1, h, l, d}, 99, DType::bf16);
  AttentionOptions causal;
  causal.is_causal = true;
  const Tensor out =
      scaled_dot_product_attention(q.to(Device::cuda()), k.to(Device::cuda()), v.to(Device::cuda()), causal)
          .output.to(Device::cpu());
  for (int64_t head = 0; head < h; ++head) {
    for (const int64_t i : {int64_t{0}, int64_t{127}, int64_t{128}, 5000 + head, int64_t{12345}, l - 1}) {
      SCOPED_TRACE("head " + std::to_string(head) + " row " + std::to_string(i));
      const Config c{1, 1, 1, 1, i + 1, d};
      const Tensor qi = q.slice(1, head, head + 1).slice(2, i, i + 1).to(DType::f64);  // [1, 1, 1, D]
      const Tensor ki = k.slice(1, head, head + 1).slice(2, 0, i + 1).to(DType::f64);  // [1, 1, i + 1, D]
      const Tensor vi = v.slice(1, head, head + 1).slice(2, 0, i + 1).to(DType::f64);
      const Tensor want = attention_reference(qi, ki, vi, {}).output;
      const Tensor got = out.slice(1, head, head + 1).slice(2, i, i + 1).contiguous();
      const double err = max_abs_error(got, want), base = max_abs_error(lowp_attention(qi, ki, vi, {}, c), want);
      EXPECT_LE(err, 2 * base + 1e-5) << "kernel error " << err << ", step-by-step error " << base;
    }
  }
}

TEST_F(CudaAttention, RandomConfigs) {
  std::mt19937_64 rng(2026);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int t = 0; t < 24; ++t) {
    Config c;
    c.b = pick(1, 2);
    c.hk = pick(1, 2);
    c.hq = c.hk * pick(1, 3);
    c.lq = pick(1, 260);
    c.lk = pick(1, 260);
    c.d = pick(0, 1) ? 64 : 128;
    c.dtype = pick(0, 1) ? DType::bf16 : DType::f16;
    c.causal = pick(0, 2) == 0;
    c.mask = c.causal ? 0 : static_cast<int>(pick(0, 2));
    check_config(c, 1000 + static_cast<uint64_t>(t) * 7);
  }
}

}  // namespace
}  // namespace qkv
