// linear_attention (the fused kernel) against linear_attention_reference (float64 loops
// from the formula), and the reference against a direct softmax-free restatement on a
// hand-sized case; causal chunking at every chunk size; errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>
#include <vector>

#include "common/expect.h"
#include "common/relative_error.h"
#include "qkv/attention.h"
#include "qkv/linear_attention.h"

namespace qkv {
namespace {

using qkv::testing::max_relative_error;

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
  auto half = [](const Tensor& t) {
    std::vector<double> x = t.to_vector<double>();
    for (double& e : x) e *= 0.5;
    return Tensor::from_vector(x, t.shape());
  };
  const Tensor q = half(Tensor::randn({1, 4, 64, 16}, 1, DType::f64)),
               k = half(Tensor::randn({1, 4, 64, 16}, 2, DType::f64));
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
