// apply_rotary (qkv/rotary.h): kernel against the float64 reference, the property RoPE exists
// for (q.k of rotated rows depends only on their positions' difference), the two layouts as one
// another under the interleaving permutation, positions per sequence, errors.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention_test_configs.h"
#include "common/expect.h"
#include "qkv/rotary.h"

namespace qkv {
namespace {

using test::max_abs_diff;  // NaN-aware, shapes checked (attention_test_configs.h)

TEST(Rotary, KernelMatchesReference) {
  for (RotaryLayout layout : {RotaryLayout::neox, RotaryLayout::gptj}) {
    for (int64_t rd : {0, 8, 12}) {
      for (DType dt : {DType::f32, DType::f64, DType::bf16}) {
        RotaryOptions o;
        o.layout = layout, o.rotary_dim = rd, o.offset = 1000, o.base = 500000.0;
        const Tensor x = Tensor::randn({2, 3, 17, 16}, 1, dt);
        const double tol = dt == DType::f64 ? 1e-12 : (dt == DType::bf16 ? 2e-2 : 3e-6);
        EXPECT_LE(max_abs_diff(apply_rotary(x, o), apply_rotary_reference(x, o)), tol) << rd;
        EXPECT_EQ(apply_rotary(x, o).dtype(), dt);
      }
    }
  }
}

// (R_m q) . (R_n k) = (R_{m+s} q) . (R_{n+s} k) for every shift s.
TEST(Rotary, DotProductsDependOnlyOnThePositionDifference) {
  const Tensor q = Tensor::randn({1, 64}, 2, DType::f64), k = Tensor::randn({1, 64}, 3, DType::f64);
  auto dot_at = [&](int64_t m, int64_t n) {
    RotaryOptions a, b;
    a.offset = m, b.offset = n;
    const auto x = apply_rotary(q, a).to_vector<double>(), y = apply_rotary(k, b).to_vector<double>();
    double s = 0.0;
    for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
    return s;
  };
  for (int64_t shift : {1, 17, 4096}) EXPECT_NEAR(dot_at(5, 2), dot_at(5 + shift, 2 + shift), 1e-9);
  EXPECT_GT(std::fabs(dot_at(5, 2) - dot_at(5, 3)), 1e-3);  // and it does depend on the difference
}

// gptj(x) = P^-1 neox(P x), P taking interleaved pairs (x0, x1), (x2, x3).. to halves.
TEST(Rotary, TheLayoutsAreOneAnotherUnderThePairPermutation) {
  const int64_t d = 8;
  const Tensor x = Tensor::randn({5, d}, 4, DType::f64);
  std::vector<double> v = x.to_vector<double>(), halves(v.size());
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t i = 0; i < d / 2; ++i) {
      halves[r * d + i] = v[r * d + 2 * i], halves[r * d + i + d / 2] = v[r * d + 2 * i + 1];
    }
  }
  RotaryOptions neox, gptj;
  gptj.layout = RotaryLayout::gptj;
  const auto a = apply_rotary(Tensor::from_vector(halves, {5, d}), neox).to_vector<double>();
  const auto b = apply_rotary(x, gptj).to_vector<double>();
  for (int64_t r = 0; r < 5; ++r) {
    for (int64_t i = 0; i < d / 2; ++i) {
      EXPECT_NEAR(b[r * d + 2 * i], a[r * d + i], 1e-12);
      EXPECT_NEAR(b[r * d + 2 * i + 1], a[r * d + i + d / 2], 1e-12);
    }
  }
}

TEST(Rotary, PositionsPerSequenceAndErrors) {
  const Tensor x = Tensor::randn({2, 2, 3, 8}, 5, DType::f64);
  RotaryOptions o;
  o.positions = Tensor::from_vector<int64_t>({0, 1, 2, 10, 11, 12}, {2, 3});
  const Tensor got = apply_rotary(x, o);
  RotaryOptions shifted;
  shifted.offset = 10;
  EXPECT_LE(max_abs_diff(got.select(0, 1), apply_rotary(x.select(0, 1), shifted)), 1e-12);
  EXPECT_LE(max_abs_diff(got.select(0, 0), apply_rotary(x.select(0, 0), {})), 1e-12);
  o.positions = Tensor::zeros({4}, DType::i64);
  EXPECT_THROW_WITH(apply_rotary(x, o), ShapeError, "apply_rotary: positions must be integer [T] or [B, T]");
  // dtypes are DTypeErrors (Python TypeError); they were ShapeErrors (ValueError)
  o.positions = Tensor::zeros({3}, DType::f32);
  EXPECT_THROW_WITH(apply_rotary(x, o), DTypeError,
                    "apply_rotary: positions must be integer (int32 or int64) [T] or [B, T], got float32 [3]");
  EXPECT_THROW_WITH(apply_rotary(Tensor::zeros({3, 8}, DType::i32), {}), DTypeError,
                    "apply_rotary: x must be floating [..., T, D], got int32 [3, 8]");
  EXPECT_THROW_WITH(apply_rotary(Tensor::zeros({8}), {}), ShapeError, "apply_rotary: x must be floating [..., T, D]");
  RotaryOptions odd;
  odd.rotary_dim = 5;
  EXPECT_THROW_WITH(apply_rotary(x, odd), ValueError, "apply_rotary: rotary_dim must be even and <= D = 8");
}

// Positions past +-2^53 are errors (offset + t overflowed int64 near INT64_MAX: undefined, a row
// turned at -2^63), checked before the sum; up to 2^53 they are accepted, and at 2^29 the angles
// hold to float32's precision (qkv/rotary.h), against angles taken in long double.
TEST(Rotary, PositionsPastTwoTo53AreErrors) {
  const Tensor x = Tensor::randn({1, 1, 3, 8}, 6, DType::f64);
  RotaryOptions o;
  o.offset = std::numeric_limits<int64_t>::max();
  EXPECT_THROW_WITH(apply_rotary(x, o), ValueError,
                    "apply_rotary: positions offset + t must lie within +-2^53 = 9007199254740992 (float64 holds every "
                    "integer only up to 2^53), got offset 9223372036854775807 and T = 3");
  EXPECT_THROW_WITH(apply_rotary_reference(x, o), ValueError, "apply_rotary_reference: positions offset + t must lie");
  for (int64_t bad : {kMaxRotaryPosition - 1, -kMaxRotaryPosition - 1, std::numeric_limits<int64_t>::min()}) {
    SCOPED_TRACE(bad);
    o.offset = bad;
    EXPECT_THROW_WITH(apply_rotary(x, o), ValueError, "apply_rotary: positions offset + t must lie within");
  }
  for (int64_t fine : {kMaxRotaryPosition - 2, -kMaxRotaryPosition}) {
    o.offset = fine;
    for (double v : apply_rotary(x, o).to_vector<double>()) EXPECT_TRUE(std::isfinite(v)) << fine;
  }
  o.offset = 0;
  o.positions = Tensor::from_vector<int64_t>({0, kMaxRotaryPosition + 1, 2}, {3});
  EXPECT_THROW_WITH(apply_rotary(x, o), ValueError,
                    "apply_rotary: positions must lie within +-2^53 = 9007199254740992 (float64 holds every integer "
                    "only up to 2^53), got 9007199254740993 at flat index 1");
  o.positions = Tensor::from_vector<int64_t>({0, 1, std::numeric_limits<int64_t>::min()}, {3});
  EXPECT_THROW_WITH(apply_rotary_reference(x, o), ValueError, "got -9223372036854775808 at flat index 2");
  RotaryOptions far;  // 2^29: angles within |p| 2^-53 rad of the exact ones
  far.offset = int64_t{1} << 29;
  const std::vector<double> got = apply_rotary(x, far).to_vector<double>(), in = x.to_vector<double>();
  for (int64_t t = 0; t < 3; ++t) {
    for (int64_t i = 0; i < 4; ++i) {  // neox: pairs (i, i + 4)
      const long double angle = static_cast<long double>(far.offset + t) * std::pow(10000.0L, -2.0L * i / 8.0L);
      const long double a = in[t * 8 + i], b = in[t * 8 + i + 4];
      EXPECT_NEAR(got[t * 8 + i], static_cast<double>(a * std::cos(angle) - b * std::sin(angle)), 1e-6) << t << i;
      EXPECT_NEAR(got[t * 8 + i + 4], static_cast<double>(b * std::cos(angle) + a * std::sin(angle)), 1e-6) << t << i;
    }
  }
}

// D = 0 has nothing to turn: x comes back as it is (rows were counted as numel / D, a division by zero, SIGFPE).
TEST(Rotary, ZeroFeaturesReturnTheEmptyInput) {
  const Tensor x = Tensor::zeros({2, 3, 0}, DType::f32);
  EXPECT_EQ(apply_rotary(x, {}).shape(), x.shape());
  EXPECT_EQ(apply_rotary_reference(x, {}).shape(), x.shape());
}

}  // namespace
}  // namespace qkv
