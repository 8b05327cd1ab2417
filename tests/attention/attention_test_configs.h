// Random attention configurations and error measures shared by the fused-kernel
// tests (attention_cpu_test.cc, attention_cpu_mixed_test.cc): lengths around and
// between tile sizes, every mask kind, GQA, broadcast batches, large logits.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/tensor.h"

namespace qkv::test {

// ---- random configurations ------------------------------------------------------

enum class MaskKind { none, bool_full, bool_broadcast, bool_masked_rows, float_full, float_row };

struct Config {
  int64_t b = 1, hq = 1, hk = 1, lq = 1, lk = 1, dk = 1, dv = 1;
  bool kv_batch_one = false;  // k/v of batch 1, broadcast over q's batch
  MaskKind mask = MaskKind::none;
  bool causal = false, gqa = false, big = false;  // big: q and k scaled x1000 (seed 001)
  double dropout = 0.0;
  std::optional<double> scale;
  uint64_t seed = 1;
  std::string str() const {
    return "B=" + std::to_string(b) + " Hq=" + std::to_string(hq) + " Hk=" + std::to_string(hk) +
           " Lq=" + std::to_string(lq) + " Lk=" + std::to_string(lk) + " Dk=" + std::to_string(dk) +
           " Dv=" + std::to_string(dv) + " mask=" + std::to_string(static_cast<int>(mask)) +
           " causal=" + std::to_string(causal) + " gqa=" + std::to_string(gqa) + " big=" + std::to_string(big) +
           " dropout=" + std::to_string(dropout) + " seed=" + std::to_string(seed);
  }
};

template <class T>
inline T pick(std::mt19937_64& rng, std::initializer_list<T> values) {
  return values.begin()[rng() % values.size()];
}

// Configuration i: lengths around and between tile sizes, odd head dims, every
// mask kind, GQA, broadcast batches; every 8th has Lq = 1, Lk = 1, or causal with Lq != Lk.
inline Config random_config(std::mt19937_64& rng, int i) {
  Config c;
  c.seed = rng();
  const std::initializer_list<int64_t> lengths = {1, 2, 3, 7, 16, 31, 64, 65, 100, 127, 129, 200, 256, 257, 300};
  c.lq = pick(rng, lengths);
  c.lk = pick(rng, lengths);
  c.dk = pick<int64_t>(rng, {1, 3, 8, 16, 32, 33, 64, 80, 128});
  c.dv = rng() % 2 ? c.dk : pick<int64_t>(rng, {1, 5, 16, 64, 96});
  c.b = pick<int64_t>(rng, {1, 2});
  c.hk = pick<int64_t>(rng, {1, 2});
  c.gqa = rng() % 3 == 0;
  c.hq = c.gqa ? c.hk * pick<int64_t>(rng, {1, 2, 4}) : c.hk;
  c.kv_batch_one = c.b > 1 && rng() % 4 == 0;
  c.mask = pick(rng, {MaskKind::none, MaskKind::none, MaskKind::bool_full, MaskKind::bool_broadcast,
                      MaskKind::bool_masked_rows, MaskKind::float_full, MaskKind::float_row});
  c.causal = c.mask == MaskKind::none && rng() % 2 == 0;
  c.big = rng() % 8 == 0;
  if (rng() % 10 == 0) c.dropout = 0.2;
  if (rng() % 10 == 0) c.scale = 0.3;
  switch (i % 8) {
    case 0: c.lq = 1; break;
    case 1: c.lk = 1; break;
    case 2:
      c.mask = MaskKind::none, c.causal = true;
      if (c.lq == c.lk) c.lk = c.lq + 37;
      break;
    default: break;
  }
  const int64_t work = c.b * c.hq * c.lq * c.lk * (c.dk + c.dv);  // keeps the suite fast
  if (work > 600'000) c.b = 1, c.hq = c.hk = 1, c.gqa = false, c.kv_batch_one = false;
  if (c.lq * c.lk * (c.dk + c.dv) > 1'000'000) c.dk = std::min<int64_t>(c.dk, 12), c.dv = std::min<int64_t>(c.dv, 8);
  return c;
}

inline Tensor scaled(const Tensor& t, double f) {
  std::vector<float> x = t.to_vector<float>();
  for (float& e : x) e = static_cast<float>(e * f);
  return Tensor::from_vector(x, t.shape());
}

inline Tensor bool_tensor(const Shape& s, uint64_t seed, double p_attend, int64_t masked_row_every) {
  const Tensor u = Tensor::uniform(s, seed);
  std::vector<bool> m(static_cast<size_t>(u.numel()));
  const auto x = u.to_vector<double>();
  const int64_t lk = s.back(), lq = s[s.size() - 2];
  for (size_t i = 0; i < m.size(); ++i) {
    const int64_t row = static_cast<int64_t>(i) / lk % lq;
    m[i] = x[i] < p_attend && !(masked_row_every > 0 && row % masked_row_every == 1);
  }
  return Tensor::from_vector(m, s);
}

struct Inputs {
  Tensor q, k, v;
  AttentionOptions options;
};

inline Inputs make_inputs(const Config& c) {
  Inputs in;
  const int64_t bk = c.kv_batch_one ? 1 : c.b;
  in.q = Tensor::randn({c.b, c.hq, c.lq, c.dk}, c.seed);
  in.k = Tensor::randn({bk, c.hk, c.lk, c.dk}, c.seed + 1);
  in.v = Tensor::randn({bk, c.hk, c.lk, c.dv}, c.seed + 2);
  if (c.big) in.q = scaled(in.q, 1000.0), in.k = scaled(in.k, 1000.0);
  AttentionOptions& o = in.options;
  o.is_causal = c.causal;
  o.enable_gqa = c.gqa;
  o.dropout_p = c.dropout;
  o.seed = c.seed;
  o.scale = c.scale;
  switch (c.mask) {
    case MaskKind::none: break;
    case MaskKind::bool_full: o.attn_mask = bool_tensor({c.b, c.hq, c.lq, c.lk}, c.seed + 3, 0.7, 0); break;
    case MaskKind::bool_broadcast: o.attn_mask = bool_tensor({c.lq, c.lk}, c.seed + 3, 0.5, 0); break;
    case MaskKind::bool_masked_rows: o.attn_mask = bool_tensor({c.lq, c.lk}, c.seed + 3, 0.5, 3); break;
    case MaskKind::float_full: o.attn_mask = Tensor::randn({c.b, 1, c.lq, c.lk}, c.seed + 3); break;
    case MaskKind::float_row: {
      std::vector<float> row = Tensor::randn({c.lk}, c.seed + 3).to_vector<float>();
      for (size_t j = 0; j < row.size(); j += 5) row[j] = -INFINITY;
      o.attn_mask = Tensor::from_vector(row, {c.lk});
      break;
    }
  }
  return in;
}

// ---- measures ------------------------------------------------------------------------

inline double max_abs(const Tensor& t) {
  double m = 0;
  for (double x : t.to_vector<double>()) m = std::isnan(x) ? INFINITY : std::max(m, std::fabs(x));
  return m;
}

// Max |a - b|; +inf on a NaN (only where exactly one side is NaN) or differing infinities.
inline double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i]))) continue;
    const double d = std::fabs(x[i] - y[i]);
    m = std::isnan(d) ? INFINITY : std::max(m, d);
  }
  return m;
}

}  // namespace qkv::test
