// A scalar long double attention written from the definitions, sharing no code
// with qkv's attention (not make_problem, not batch_offset): the oracle of the
// float64 path and of every logsumexp (tests/attention/float64_oracle_test.cc,
// attention_cpu_test.cc). Inputs are read as plain row-major arrays:
//   s_ij = scale * sum_d q_id k_jd + mask_ij   (bool False: -inf; Dk == 0: the
//          empty sum 0 whatever the scale), keys j <= i when causal
//   lse_i = log sum_j exp(s_ij)               (-inf when every s_ij is -inf)
//   w_ij = exp(s_ij - lse_i)                   (0 when every s_ij is -inf)
//   o_i = sum_j w_ij v_j
// Finite inputs only (NaN and Inf: nonfinite_test.cc against PyTorch).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "qkv/attention.h"
#include "qkv/tensor.h"

namespace qkv::attention_oracle {

struct Oracle {
  std::vector<long double> out, weights, lse;  // [B, Hq, Lq, Dv], [B, Hq, Lq, Lk], [B, Hq, Lq]
};

// `shape` with leading 1s up to rank 4.
inline Shape rank4(Shape shape) {
  while (shape.size() < 4) shape.insert(shape.begin(), 1);
  return shape;
}

// Element (i0, i1, i2, i3) of a row-major array of 4-D `shape`, size-1 dims broadcast.
inline long double at(const std::vector<double>& x, const Shape& shape, int64_t i0, int64_t i1, int64_t i2,
                      int64_t i3) {
  const int64_t idx[4] = {i0, i1, i2, i3};
  int64_t flat = 0;
  for (size_t d = 0; d < 4; ++d) flat = flat * shape[d] + (shape[d] == 1 ? 0 : idx[d]);
  return x[static_cast<size_t>(flat)];
}

// q [B, Hq, Lq, Dk], k [Bk, Hk, Lk, Dk], v [Bk, Hk, Lk, Dv] (Bk in {1, B}; Hk == Hq,
// Hk == 1, or with gqa Hq / Hk q heads per k/v head), a mask broadcastable to
// [B, Hq, Lq, Lk] (any rank <= 4).
inline Oracle oracle(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  const Shape qs = q.shape(), ks = k.shape(), vs = v.shape();
  const int64_t B = qs[0], Hq = qs[1], Lq = qs[2], Dk = qs[3], Hk = ks[1], Lk = ks[2], Dv = vs[3];
  const std::vector<double> qx = q.to_vector<double>(), kx = k.to_vector<double>(), vx = v.to_vector<double>();
  std::vector<double> mx;
  Shape ms;
  if (o.attn_mask) mx = o.attn_mask->to_vector<double>(), ms = rank4(o.attn_mask->shape());
  const bool bool_mask = o.attn_mask && o.attn_mask->dtype() == DType::b8;
  const long double scale = o.scale ? *o.scale : 1.0L / std::sqrt(static_cast<long double>(Dk));
  Oracle r;
  r.out.assign(static_cast<size_t>(B * Hq * Lq * Dv), 0.0L);
  r.weights.assign(static_cast<size_t>(B * Hq * Lq * Lk), 0.0L);
  r.lse.assign(static_cast<size_t>(B * Hq * Lq), -INFINITY);
  std::vector<long double> s(static_cast<size_t>(Lk));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < Hq; ++h) {
      const int64_t hk = Hk == Hq ? h : Hk == 1 ? 0 : h / (Hq / Hk);
      for (int64_t i = 0; i < Lq; ++i) {
        const int64_t row = (b * Hq + h) * Lq + i, keys = o.is_causal ? std::min(Lk, i + 1) : Lk;
        long double m = -INFINITY;
        for (int64_t j = 0; j < keys; ++j) {
          long double dot = 0;
          for (int64_t d = 0; d < Dk; ++d) dot += at(qx, qs, b, h, i, d) * at(kx, ks, b, hk, j, d);
          long double bias = 0;
          if (o.attn_mask) bias = at(mx, ms, b, h, i, j);
          if (bool_mask) bias = bias != 0 ? 0.0L : -INFINITY;
          s[static_cast<size_t>(j)] = (Dk == 0 ? 0.0L : scale * dot) + bias;
          m = std::max(m, s[static_cast<size_t>(j)]);
        }
        if (m == -INFINITY) continue;  // every key masked: weights 0, output 0, lse -inf
        long double sum = 0;
        for (int64_t j = 0; j < keys; ++j) sum += std::exp(s[static_cast<size_t>(j)] - m);
        r.lse[static_cast<size_t>(row)] = m + std::log(sum);
        for (int64_t j = 0; j < keys; ++j) {
          const long double w = std::exp(s[static_cast<size_t>(j)] - m) / sum;
          r.weights[static_cast<size_t>(row * Lk + j)] = w;
          for (int64_t d = 0; d < Dv; ++d) r.out[static_cast<size_t>(row * Dv + d)] += w * at(vx, vs, b, hk, j, d);
        }
      }
    }
  }
  return r;
}

// max |got - want| / max(1, max |want|); equal infinities count as 0; +inf on a mismatch.
inline double rel_error(const Tensor& got, const std::vector<long double>& want) {
  const std::vector<double> g = got.to_vector<double>();
  EXPECT_EQ(g.size(), want.size());
  if (g.size() != want.size()) return INFINITY;
  long double scale = 1, err = 0;
  for (long double w : want) scale = std::isfinite(w) ? std::max(scale, std::fabs(w)) : scale;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isinf(want[i]) && g[i] == want[i]) continue;
    const long double e = std::fabs(g[i] - want[i]);
    err = std::isnan(e) ? INFINITY : std::max(err, e);
  }
  return static_cast<double>(err / scale);
}

}  // namespace qkv::attention_oracle
