// Against the long double oracle of tests/common/attention_oracle.h, which shares no code
// with qkv's attention: the float64 path of scaled_dot_product_attention, which is the fused
// CPU kernel computing in double (attention_cpu.cc, Types<double, double, double>; the float64
// reference no longer runs it), its output, weights and logsumexp; and the logsumexp of every
// path: the fused kernel on f32, f16 and bf16 inputs, attention_reference, and Dk == 0.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/attention_oracle.h"
#include "qkv/attention.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

using attention_oracle::oracle;
using attention_oracle::Oracle;
using attention_oracle::rel_error;

struct Case {
  Tensor q, k, v;
  AttentionOptions o;
  std::string str;
};

// Random small problems: Lq < Lk, Lq > Lk, causal, bool masks with fully masked
// rows, float masks with -inf, GQA, k/v batch broadcast, explicit scale.
Case random_case(std::mt19937_64& rng, int n, DType dtype) {
  auto pick = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng() % static_cast<uint64_t>(hi - lo + 1));
  };
  const int64_t B = pick(1, 2), Hk = pick(1, 2), Hq = Hk * (n % 3 == 0 ? 2 : 1), Lq = pick(1, 40), Lk = pick(1, 40);
  const int64_t Dk = pick(1, 20), Dv = pick(1, 12);
  const uint64_t seed = rng();
  Case c;
  c.q = Tensor::randn({B, Hq, Lq, Dk}, seed, dtype);
  c.k = Tensor::randn({n % 4 == 1 ? 1 : B, Hk, Lk, Dk}, seed + 1, dtype);
  c.v = Tensor::randn({c.k.size(0), Hk, Lk, Dv}, seed + 2, dtype);
  c.o.enable_gqa = Hq != Hk;
  c.o.return_weights = c.o.return_logsumexp = true;
  if (n % 5 == 2) c.o.scale = 0.3;
  switch (n % 4) {
    case 0: c.o.is_causal = true; break;
    case 1: {  // bool [B, 1, Lq, Lk], row 1 fully masked
      Tensor m = Tensor::uniform({B, 1, Lq, Lk}, seed + 3).to(DType::f64);
      std::vector<bool> keep;
      for (double x : m.to_vector<double>()) keep.push_back(x < 0.6);
      for (int64_t b = 0; b < B; ++b)
        for (int64_t j = 0; j < Lk && Lq > 1; ++j) keep[static_cast<size_t>((b * Lq + 1) * Lk + j)] = false;
      c.o.attn_mask = Tensor::from_vector(keep, {B, 1, Lq, Lk});
      break;
    }
    case 2: {  // float [Lq, Lk] (as 4-D [1, 1, Lq, Lk]) with -inf holes and a fully -inf last row
      std::vector<double> m = Tensor::randn({Lq, Lk}, seed + 3, DType::f64).to_vector<double>();
      for (size_t x = 0; x < m.size(); x += 3) m[x] = -INFINITY;
      for (int64_t j = 0; j < Lk; ++j) m[static_cast<size_t>((Lq - 1) * Lk + j)] = -INFINITY;
      c.o.attn_mask = Tensor::from_vector(m, {1, 1, Lq, Lk}).to(dtype);
      break;
    }
    default: break;
  }
  c.str = "case " + std::to_string(n) + " q " + shape_str(c.q.shape()) + " k " + shape_str(c.k.shape()) + " v " +
          shape_str(c.v.shape()) + " causal " + std::to_string(c.o.is_causal) + " mask " +
          (c.o.attn_mask ? shape_str(c.o.attn_mask->shape()) : "-");
  return c;
}

TEST(Float64Oracle, ScaledDotProductAttentionF64OutputWeightsAndLogsumexp) {
  std::mt19937_64 rng(64);
  int causal = 0, masked_rows = 0;
  for (int n = 0; n < 80; ++n) {
    const Case c = random_case(rng, n, DType::f64);
    const AttentionResult r = scaled_dot_product_attention(c.q, c.k, c.v, c.o);
    const Oracle want = oracle(c.q, c.k, c.v, c.o);
    ASSERT_EQ(r.output.dtype(), DType::f64) << c.str;
    ASSERT_EQ(r.logsumexp->dtype(), DType::f64) << c.str;
    EXPECT_LE(rel_error(r.output, want.out), 1e-13) << c.str;
    EXPECT_LE(rel_error(*r.weights, want.weights), 1e-13) << c.str;
    EXPECT_LE(rel_error(*r.logsumexp, want.lse), 1e-13) << c.str;
    causal += c.o.is_causal;
    for (long double x : want.lse) masked_rows += x == -INFINITY;
  }
  EXPECT_GE(causal, 15);
  EXPECT_GE(masked_rows, 20);
}

// Every path's logsumexp: the fused kernel (f32, f16, bf16 inputs), the reference
// (any dtype) and the Dk == 0 path, against the long double oracle on the same inputs.
TEST(Float64Oracle, LogsumexpOfEveryPath) {
  std::mt19937_64 rng(65);
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    for (int n = 0; n < 40; ++n) {
      const Case c = random_case(rng, n, dt);
      const Oracle want = oracle(c.q, c.k, c.v, c.o);  // on the stored (rounded) inputs
      const AttentionResult fused = scaled_dot_product_attention(c.q, c.k, c.v, c.o);
      const AttentionResult ref = attention_reference(c.q, c.k, c.v, c.o);
      ASSERT_EQ(fused.logsumexp->dtype(), DType::f32) << c.str;
      EXPECT_LE(rel_error(*fused.logsumexp, want.lse), 4e-6) << dtype_name(dt) << " fused " << c.str;
      EXPECT_LE(rel_error(*ref.logsumexp, want.lse), 4e-7) << dtype_name(dt) << " reference " << c.str;
    }
  }
  Case c = random_case(rng, 3, DType::f32);  // Dk == 0: every score 0, lse = log Lk
  c.q = Tensor::zeros({1, 2, 5, 0}), c.k = Tensor::zeros({1, 2, 9, 0});
  c.v = Tensor::randn({1, 2, 9, 3}, 7);
  const AttentionResult r = scaled_dot_product_attention(c.q, c.k, c.v, c.o);
  for (double x : r.logsumexp->to_vector<double>()) EXPECT_NEAR(x, std::log(9.0), 1e-6);
  EXPECT_LE(rel_error(r.output, oracle(c.q, c.k, c.v, c.o).out), 1e-6);
}

}  // namespace
}  // namespace qkv
