// Shared by the decode kernel tests (decode_int8_test.cc, decode_half_test.cc): a cache of the
// given layout filled by two ragged appends, decoded on every Highway SIMD target against the
// float64 reference on the cache's widened / dequantized values.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "attention/decode_rows.h"  // kInt8ValueKeys

#include "attention/attention_test_configs.h"
#include "common/simd_targets.h"
#include "qkv/kv_cache.h"

namespace qkv::test {

// How far an int8 cache's step may move from the float64 reference by the value path's
// rounding (attention/decode_rows.h, AVX2 / AVX-512, Dv a multiple of 64), per output [B, Hq,
// Lq, Dv]. Key j's weight p_j s_(j,g) is rounded to a step tau = max_(i in b) p_i S_i / 32767 of
// its block b (S_i = max_g s_(i,g), its value scales; p relative to the item's largest score),
// so the block's products move by at most sum_(j in b) tau / 2 |v^_(j,c)| (v^ the stored int8
// values), and after the merge's division by L out[c] = sum_j pi_j v_(j,c) (pi the softmax
// probabilities, p e^(m - M) / L) by at most sum_j |v^_(j,c)| max_(i in b) pi_i S_i / 65534. A
// block is kInt8ValueKeys consecutive keys at most, so the max over the keys within
// kInt8ValueKeys - 1 of j bounds that of j's block whatever the chunks and pages. pi: float64
// scores on the dequantized keys, 1.01 times (the kernel's query is rounded to int16: ~1e-4 of
// a score). Default options only (causal, no window, no rotary, scale 1 / sqrt(D)): query t
// of a sequence of n keys sees keys [0, n - Lq + t].
inline std::vector<double> int8_rounding_bound(const KVCache& cache, const Tensor& q) {
  const int64_t nb = q.size(0), hq = q.size(1), lq = q.size(2), d = q.size(3), dv = cache.values().size(3);
  const int64_t groups = cache.value_scales().size(3), per_kv = hq / cache.config().kv_heads;
  const std::vector<float> qf = q.to_vector<float>(), kf = cache.keys_f32().to_vector<float>();
  const std::vector<float> vs = cache.value_scales().to_vector<float>();  // [rows, groups]
  const int8_t* v = cache.values().data<int8_t>();                        // [rows, Dv]
  std::vector<double> bound(static_cast<size_t>(nb * hq * lq * dv), 0.0);
  for (int64_t b = 0; b < nb; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t t = 0; t < lq; ++t) {
        const int64_t keys = cache.length(b) - lq + t + 1, row = (b * hq + h) * lq + t;
        std::vector<double> w(static_cast<size_t>(keys));  // pi_j S_j
        double big = -1e300, total = 0.0;
        for (int64_t j = 0; j < keys; ++j) {
          double dot = 0.0;
          const int64_t at = cache.row(b, h / per_kv, j);
          for (int64_t c = 0; c < d; ++c) dot += static_cast<double>(qf[row * d + c]) * kf[at * d + c];
          w[j] = dot / std::sqrt(static_cast<double>(d)), big = std::max(big, w[j]);
        }
        for (double& x : w) total += (x = std::exp(x - big));
        for (int64_t j = 0; j < keys; ++j) {
          const int64_t at = cache.row(b, h / per_kv, j);
          w[j] *= 1.01 / total * *std::max_element(vs.begin() + at * groups, vs.begin() + (at + 1) * groups);
        }
        for (int64_t j = 0; j < keys; ++j) {
          const int64_t lo = std::max<int64_t>(0, j - attention::kInt8ValueKeys + 1);
          const int64_t hi = std::min(keys, j + attention::kInt8ValueKeys);
          const double wmax = *std::max_element(w.begin() + lo, w.begin() + hi);
          const int8_t* vj = v + cache.row(b, h / per_kv, j) * dv;
          for (int64_t c = 0; c < dv; ++c) bound[row * dv + c] += wmax * std::abs(vj[c]) / 65534.0;
        }
      }
    }
  }
  return bound;
}

// Two appends ([2, 2, 300 / 290, D] keys, lengths {300, 45} then {290, 1}: B = 2, Hk = 2) into a
// cache of config c, q [2, hq, lq, D]; on every target the step with 128-key chunks (several per
// sequence: the merge too) and with automatic chunks within 2e-6 of the reference, and the
// targets within 2e-6 of each other; int8 caches with Dv a multiple of 64 within 2e-6 plus
// their rounding's bound (int8_rounding_bound) of each output, the targets within 2e-6 plus twice it.
inline void expect_every_target_matches_the_reference(const KVCacheConfig& c, int64_t hq, int64_t lq) {
  KVCache cache(c);
  const int64_t d = c.head_dim, dv = c.value_dim > 0 ? c.value_dim : c.head_dim;
  cache.append(Tensor::randn({2, 2, 300, d}, 1), Tensor::randn({2, 2, 300, dv}, 2), {300, 45});
  cache.append(Tensor::randn({2, 2, 290, d}, 3), Tensor::randn({2, 2, 290, dv}, 4), {290, 1});
  const Tensor q = Tensor::randn({2, hq, lq, d}, 5);
  const Tensor ref = decode_attention_reference(q, cache).output;
  const std::vector<double> rounding = c.dtype == DType::i8 && dv % 64 == 0
                                           ? int8_rounding_bound(cache, q)
                                           : std::vector<double>(static_cast<size_t>(ref.numel()), 0.0);
  // the largest excess of |a - b| over 2e-6 + `times` rounding of an output: <= 0 expected
  const auto excess = [&](const Tensor& a, const Tensor& b, double times) {
    const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
    double worst = -1.0;
    for (size_t i = 0; i < x.size(); ++i)
      worst = std::max(worst, std::fabs(x[i] - y[i]) - (2e-6 + times * rounding[i]));
    return worst;
  };
  std::vector<Tensor> outs;
  for_each_target([&] {
    DecodeOptions o;
    o.chunk = 128;
    outs.push_back(decode_attention(q, cache, o).output);
    EXPECT_LE(excess(outs.back(), ref, 1.0), 0.0);
    EXPECT_LE(excess(decode_attention(q, cache).output, ref, 1.0), 0.0);  // automatic chunks
  });
  ASSERT_GE(outs.size(), 1u);
  for (const Tensor& out : outs) EXPECT_LE(excess(out, outs.front(), 2.0), 0.0);
}

}  // namespace qkv::test
