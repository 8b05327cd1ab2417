// linear_attention (the fused kernel) against linear_attention_reference (float64 loops
// from the formula), and the reference against a direct softmax-free restatement on a
// hand-sized case; causal chunking at every chunk size; errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/expect.h"
#include "common/relative_error.h"
#include "qkv/attention.h"
#include "qkv/linear_attention.h"

namespace qkv {
namespace {

using qkv::testing::max_relative_error;

// Gaussian inputs of std `sigma` in `dtype` (drawn in float64, then rounded).
Tensor gaussian(const Shape& shape, double sigma, uint64_t seed, DType dtype = DType::f64) {
  std::vector<double> x = Tensor::randn(shape, seed, DType::f64).to_vector<double>();
  for (double& e : x) e *= sigma;
  return Tensor::from_vector(x, shape).to(dtype);
}

TEST(LinearAttention, ReferenceIsTheFormulaOnAHandCase) {
  // One key: every query's output is that key's value (phi > 0, weights normalised).
  const Tensor q = Tensor::from_vector(std::vector<double>{0.5, -2.0, 3.0, 0.0}, {2, 2});
  const Tensor k = Tensor::from_vector(std::vector<double>{1.0, -1.0}, {1, 2});
  const Tensor v = Tensor::from_vector(std::vector<double>{4.0, -5.0, 6.0}, {1, 3});
  EXPECT_EQ(linear_attention_reference(q, k, v).to_vector<double>(), (std::vector<double>{4, -5, 6, 4, -5, 6}));
  // Two keys, phi(k_0) = [2, e^-1], phi(k_1) = [1, 1]; query phi(q) = [1.5, e^-2]:
  const Tensor k2 = Tensor::from_vector(std::vector<double>{1.0, -1.0, 0.0, 0.0}, {2, 2});
  const Tensor v2 = Tensor::from_vector(std::vector<double>{1.0, 3.0}, {2, 1});
  const double w0 = 1.5 * 2 + std::exp(-2.0) * std::exp(-1.0), w1 = 1.5 + std::exp(-2.0);
  const auto got = linear_attention_reference(q.slice(0, 0, 1), k2, v2).to_vector<double>();
  EXPECT_NEAR(got[0], (w0 * 1 + w1 * 3) / (w0 + w1), 1e-15);
}

TEST(LinearAttention, FusedMatchesTheReference) {
  std::mt19937_64 rng(16);
  double worst64 = 0, worst32 = 0;
  for (int i = 0; i < 40; ++i) {
    const int64_t b = 1 + static_cast<int64_t>(rng() % 3), h = 1 + static_cast<int64_t>(rng() % 2);
    const int64_t lq = static_cast<int64_t>(rng() % 70), d = 1 + static_cast<int64_t>(rng() % 40);
    const int64_t dv = 1 + static_cast<int64_t>(rng() % 24);
    LinearAttentionOptions o;
    o.is_causal = i % 2 == 1;
    o.chunk = std::vector<int64_t>{1, 3, 16, 64, 1000}[static_cast<size_t>(i % 5)];
    const int64_t lk = o.is_causal ? lq : static_cast<int64_t>(rng() % 90);
    const Tensor q = Tensor::randn({b, h, lq, d}, rng()).to(DType::f64),
                 k = Tensor::randn({b, h, lk, d}, rng()).to(DType::f64);
    const Tensor v = Tensor::randn({b, h, lk, dv}, rng()).to(DType::f64);
    const Tensor want = linear_attention_reference(q, k, v, o);
    const double e64 = max_relative_error(linear_attention(q, k, v, o), want);
    const double e32 =
        max_relative_error(linear_attention(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), o), want);
    EXPECT_LE(e64, 1e-12) << i;
    EXPECT_LE(e32, 2e-5) << i;
    worst64 = std::max(worst64, e64), worst32 = std::max(worst32, e32);
  }
  std::printf("linear_attention vs reference: worst f64 %.2e, f32 %.2e\n", worst64, worst32);
}

TEST(LinearAttention, CausalRowsSeeOnlyTheirPrefix) {
  // Changing the last key and value moves only the last causal row.
  const Tensor q = Tensor::randn({1, 9, 4}, 1), k = Tensor::randn({1, 9, 4}, 2), v = Tensor::randn({1, 9, 3}, 3);
  std::vector<float> kv = k.to_vector<float>(), vv = v.to_vector<float>();
  kv[8 * 4] += 5.0f, vv[8 * 3] += 5.0f;
  LinearAttentionOptions o;
  o.is_causal = true, o.chunk = 4;
  const auto a = linear_attention(q, k, v, o).to_vector<float>();
  const auto b =
      linear_attention(q, Tensor::from_vector(kv, {1, 9, 4}), Tensor::from_vector(vv, {1, 9, 3}), o).to_vector<float>();
  for (int i = 0; i < 8 * 3; ++i) EXPECT_EQ(a[static_cast<size_t>(i)], b[static_cast<size_t>(i)]) << i;
  EXPECT_NE(a[8 * 3], b[8 * 3]);
}

TEST(LinearAttention, ErrorsNameTheOpAndShapes) {
  const Tensor q = Tensor::randn({2, 5, 4}, 1), k = Tensor::randn({2, 6, 4}, 2), v = Tensor::randn({2, 6, 3}, 3);
  LinearAttentionOptions causal;
  causal.is_causal = true;
  EXPECT_THROW_WITH(linear_attention(q, k, v, causal), ShapeError,
                    "linear_attention: is_causal needs Lq == Lk (q [2, 5, 4], k [2, 6, 4], v [2, 6, 3])");
  EXPECT_THROW_WITH(linear_attention(q, Tensor::randn({2, 6, 5}, 4), v), ShapeError, "linear_attention: k must be");
  EXPECT_THROW_WITH(linear_attention(q, Tensor::randn({3, 6, 4}, 4), v), ShapeError, "same leading dims");
  LinearAttentionOptions bad;
  bad.chunk = 0;
  EXPECT_THROW_WITH(linear_attention(q, k, v, bad), ValueError, "chunk must be >= 1");
  EXPECT_EQ(linear_attention(q, k.slice(1, 0, 0), v.slice(1, 0, 0)).to_vector<float>(),
            std::vector<float>(2 * 5 * 3, 0.0f));  // no keys: zeros, as the reference
}

TEST(LinearAttention, FavorMatchesItsReferenceAndApproachesSoftmax) {
  // The kernel against the float64 reference on the same random features (same seed) ...
  std::mt19937_64 rng(21);
  for (int i = 0; i < 12; ++i) {
    const int64_t l = 1 + static_cast<int64_t>(rng() % 40), d = 1 + static_cast<int64_t>(rng() % 16);
    LinearAttentionOptions o;
    o.feature_map = LinearFeatureMap::favor;
    o.num_features = 1 + static_cast<int64_t>(rng() % 40);
    o.seed = rng();
    o.is_causal = i % 2 == 1;
    o.chunk = 7;
    const Tensor q = Tensor::randn({2, l, d}, rng(), DType::f64), k = Tensor::randn({2, l, d}, rng(), DType::f64);
    const Tensor v = Tensor::randn({2, l, 3}, rng(), DType::f64);
    EXPECT_LE(max_relative_error(linear_attention(q, k, v, o), linear_attention_reference(q, k, v, o)), 1e-12) << i;
  }
  // ... and, as the number of features grows, towards exact softmax attention (an unbiased
  // estimate of exp(q . k / sqrt(D)) whose variance falls as 1/m; fixed seeds).
  // Inputs of norm ~2 (randn / 2 at D = 16): the estimator's variance grows as exp(|q'|^2 + |k'|^2).
  const Tensor q = gaussian({1, 4, 64, 16}, 0.5, 1), k = gaussian({1, 4, 64, 16}, 0.5, 2);
  const Tensor v = Tensor::randn({1, 4, 64, 16}, 3, DType::f64);
  const Tensor exact = scaled_dot_product_attention(q, k, v).output;
  std::vector<double> err;
  for (int64_t m : {8, 256, 8192}) {
    LinearAttentionOptions o;
    o.feature_map = LinearFeatureMap::favor, o.num_features = m, o.seed = 7;
    const auto got = linear_attention(q, k, v, o).to_vector<double>(), want = exact.to_vector<double>();
    double mean = 0;
    for (size_t i = 0; i < got.size(); ++i) mean += std::fabs(got[i] - want[i]) / static_cast<double>(got.size());
    err.push_back(mean);
  }
  std::printf("FAVOR+ mean |error| vs softmax attention, m = 8 / 256 / 8192: %.4f / %.4f / %.4f\n", err[0], err[1],
              err[2]);
  EXPECT_LT(err[1], 0.7 * err[0]);
  EXPECT_LT(err[2], 0.5 * err[1]);
  const Tensor w = favor_random_features(4, 6, 3);  // two blocks: rows 0-3 orthogonal to each other
  double dot = 0;
  for (int64_t c = 0; c < 4; ++c) dot += w.item({0, c}) * w.item({1, c});
  EXPECT_NEAR(dot, 0.0, 1e-12);
  EXPECT_THROW(favor_random_features(0, 4, 1), ValueError);
}

// FAVOR+ at large inputs: std 8 to 50 put the exponents w . x' - |x'|^2 / 2 in the hundreds
// to tens of thousands, far outside float32's exp range (float64's too at 50). With one shift
// over all keys and features, early causal rows (std >= 6) and queries whose largest features
// meet only far-off keys (std >= 16) gave 0/0 = NaN; the float64 path did too at std 50.
TEST(LinearAttention, FavorIsFiniteAndMatchesItsReferenceAtLargeInputs) {
  const double sigmas[] = {8, 16, 50}, bound32[] = {1e-4, 3e-4, 2e-3};
  for (int si = 0; si < 3; ++si) {
    double worst32 = 0, worst64 = 0;
    for (const int64_t d : {16, 64}) {
      for (const bool causal : {false, true}) {
        LinearAttentionOptions o;
        o.feature_map = LinearFeatureMap::favor, o.seed = 11, o.is_causal = causal;
        o.chunk = d == 16 ? 7 : 64;
        const uint64_t seed = static_cast<uint64_t>(100 * si + d + (causal ? 1 : 0));
        const Tensor q = gaussian({1, 2, 160, d}, sigmas[si], seed, DType::f32),
                     k = gaussian({1, 2, 160, d}, sigmas[si], seed + 1000, DType::f32),
                     v = gaussian({1, 2, 160, 8}, 1.0, seed + 2000, DType::f32);
        const Tensor q64 = q.to(DType::f64), k64 = k.to(DType::f64), v64 = v.to(DType::f64);
        const Tensor want = linear_attention_reference(q64, k64, v64, o);
        const double e32 = max_relative_error(linear_attention(q, k, v, o), want);
        const double e64 = max_relative_error(linear_attention(q64, k64, v64, o), want);
        EXPECT_LE(e32, bound32[si]) << sigmas[si] << " " << d << " " << causal;
        EXPECT_LE(e64, 1e-11) << sigmas[si] << " " << d << " " << causal;
        worst32 = std::max(worst32, e32), worst64 = std::max(worst64, e64);
      }
    }
    std::printf("FAVOR+ std %g: worst error vs reference f32 %.2e, f64 %.2e\n", sigmas[si], worst32, worst64);
  }
}

// Single rows of large norm among unit ones, in every floating dtype: the first key 40x (its
// features underflow next to any later key's: the first causal row's only key), another key
// 40x, and two query rows 300x (features that peak where the keys are far below the column's
// largest). Causal chunks of 1, 5 and 64 rows.
TEST(LinearAttention, FavorHandlesSingleRowsOfLargeNorm) {
  std::vector<double> q = gaussian({2, 96, 32}, 1.0, 5).to_vector<double>(),
                      k = gaussian({2, 96, 32}, 1.0, 6).to_vector<double>();
  for (int64_t c = 0; c < 32; ++c) {
    k[c] *= 40, k[33 * 32 + c] *= 40, q[c] *= 300, q[(96 + 50) * 32 + c] *= 300;
  }
  for (const DType dt : {DType::f32, DType::f16, DType::bf16, DType::f64}) {
    double worst = 0;
    const Tensor tq = Tensor::from_vector(q, {2, 96, 32}).to(dt), tk = Tensor::from_vector(k, {2, 96, 32}).to(dt);
    const Tensor tv = gaussian({2, 96, 4}, 1.0, 7, dt);
    for (const int64_t chunk : {int64_t{0}, int64_t{1}, int64_t{5}, int64_t{64}}) {
      LinearAttentionOptions o;
      o.feature_map = LinearFeatureMap::favor, o.seed = 2, o.is_causal = chunk > 0,
      o.chunk = std::max<int64_t>(chunk, 1);
      const Tensor want = linear_attention_reference(tq.to(DType::f64), tk.to(DType::f64), tv.to(DType::f64), o);
      const Tensor got = linear_attention(tq, tk, tv, o);
      EXPECT_EQ(got.dtype(), dt);
      // the output's own rounding: float32's, or the 11 / 8 significant bits of f16 / bf16
      const double bound = dt == DType::f64 ? 1e-9 : dt == DType::f32 ? 1e-4 : dt == DType::f16 ? 2e-3 : 1e-2;
      const double e = max_relative_error(got, want);
      EXPECT_LE(e, bound) << dtype_name(dt) << " chunk " << chunk;
      worst = std::max(worst, e);
    }
    std::printf("FAVOR+ rows of large norm, %s: worst error vs reference %.2e\n", std::string(dtype_name(dt)).c_str(),
                worst);
  }
}

// num_features so large that m x D or L x m overflows int64 wrapped the kernel's sizes (a
// segfault for m = 2^62, "corrupted double-linked list" for m ~ 2^63 / 3): now a ValueError.
TEST(LinearAttention, FeatureCountsThatOverflowAreAValueError) {
  const Tensor q = Tensor::randn({1, 4, 3}, 1);
  LinearAttentionOptions o;
  o.feature_map = LinearFeatureMap::favor;
  for (const int64_t m : {int64_t{1} << 62, std::numeric_limits<int64_t>::max() / 3 + 1}) {
    o.num_features = m;
    EXPECT_THROW_WITH(linear_attention(q, q, q, o), ValueError, "linear_attention: num_features = ");
    EXPECT_THROW_WITH(linear_attention_reference(q, q, q, o), ValueError, "num_features = ");
  }
  EXPECT_THROW_WITH(favor_random_features(3, int64_t{1} << 62, 0), ValueError, "overflows");
  o.num_features = 5;  // a small count still runs, and equals its float64 reference
  EXPECT_LE(max_relative_error(linear_attention(q, q, q, o), linear_attention_reference(q, q, q, o)), 1e-5);
}

}  // namespace
}  // namespace qkv
