// The Highway softmax/exp kernels against the scalar double reference (and
// std::exp), on every SIMD target this CPU supports; then qkv::softmax on
// tensors of several layouts and dtypes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/simd_targets.h"
#include "qkv/softmax.h"
#include "softmax/softmax_cpu.h"

namespace qkv {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// Row lengths around every vector width (4, 8, 16 lanes) and up to 1000.
const std::vector<int64_t> kCols = {1,  2,  3,   5,   7,   8,   9,   13,  15,  16,  17,  31,  33,
                                    63, 65, 100, 127, 129, 255, 257, 333, 511, 513, 999, 1000};

using test::for_each_target;

// Bound on |float kernel - double reference| for softmax element i of a row:
// rounding x_i - max in float costs |x_i - max| * 2^-24 relative, exp, the sum
// and the scaling a few ulp more (worst seen: 5.8e-7 relative at x_i = max, in a
// 1000-element row: the float sum). Below FLT_MIN results are subnormal (or 0).
double softmax_bound(double ref, double shifted) {
  if (!std::isfinite(shifted)) return 0.0;  // masked entry or row: exactly 0
  return ref * 3e-7 * (4.0 + std::fabs(shifted)) + FLT_MIN;
}

// Softmax of each row of `x` ([rows, cols], rows `stride` apart) with the kernel
// and the reference; checks every element, and that padding is untouched.
void expect_rows_match(std::vector<float> x, int64_t rows, int64_t cols, int64_t stride) {
  std::vector<float> got = x;
  kernels::softmax_rows(got.data(), rows, cols, stride);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<double> in(x.begin() + r * stride, x.begin() + r * stride + cols), want(cols);
    kernels::softmax_reference(in.data(), want.data(), cols);
    double m = -INFINITY;
    for (double v : in) m = std::max(m, v);
    for (int64_t c = 0; c < cols; ++c) {
      const double g = got[r * stride + c], w = want[c];
      if (std::isnan(w)) {
        ASSERT_TRUE(std::isnan(g)) << "row " << r << " col " << c << " of " << cols;
      } else {
        ASSERT_LE(std::fabs(g - w), softmax_bound(w, in[c] - m))
            << "row " << r << " col " << c << " of " << cols << ": got " << g << ", want " << w;
      }
    }
    for (int64_t c = cols; r + 1 < rows && c < stride; ++c) {
      ASSERT_EQ(std::memcmp(&got[r * stride + c], &x[r * stride + c], 4), 0) << "padding changed";
    }
  }
}

std::vector<float> normal_values(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, sigma);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(Softmax, ReferencePinnedByHand) {
  const double x[] = {1.0, 2.0, 3.0};
  double y[3];
  kernels::softmax_reference(x, y, 3);
  const double z = 1.0 + std::exp(1.0) + std::exp(2.0);
  EXPECT_DOUBLE_EQ(y[0], 1.0 / z);
  EXPECT_DOUBLE_EQ(y[1], std::exp(1.0) / z);
  EXPECT_DOUBLE_EQ(y[2], std::exp(2.0) / z);
}

TEST(Softmax, RowsMatchReferenceOnEveryTarget) {
  for_each_target([] {
    for (int64_t cols : kCols) {
      SCOPED_TRACE(cols);
      expect_rows_match(normal_values(3 * cols, 3.0f, static_cast<uint32_t>(cols)), 3, cols, cols);
    }
  });
}

TEST(Softmax, RowStrideLeavesPaddingAlone) {
  for_each_target([] {
    for (int64_t cols : {5, 16, 37}) expect_rows_match(normal_values(4 * (cols + 3), 1.0f, 7), 4, cols, cols + 3);
  });
}

TEST(Softmax, LargeMagnitudes) {
  for_each_target([] {
    for (int64_t cols : kCols) {
      std::vector<float> x = normal_values(2 * cols, 1000.0f, static_cast<uint32_t>(cols) + 1);
      expect_rows_match(x, 2, cols, cols);
      for (float& v : x) v = v * 0.001f + 80.0f;  // near exp's overflow: max-shift keeps it finite
      expect_rows_match(x, 2, cols, cols);
    }
  });
}

TEST(Softmax, MaskedEntriesGiveExactZeros) {
  for_each_target([] {
    for (int64_t cols : kCols) {
      std::vector<float> x = normal_values(cols, 2.0f, 3);
      for (int64_t c = 0; c < cols; c += 3) x[c] = -kInf;
      if (cols > 1) x[cols - 1] = 0.5f;  // at least one unmasked entry
      std::vector<float> got = x;
      kernels::softmax_rows(got.data(), 1, cols, cols);
      for (int64_t c = 0; c < cols; ++c) {
        if (x[c] == -kInf) {
          ASSERT_EQ(got[c], 0.0f) << c;
        }
      }
      expect_rows_match(x, 1, cols, cols);
    }
  });
}

TEST(Softmax, FullyMaskedRowGivesZeros) {
  for_each_target([] {
    for (int64_t cols : kCols) {
      std::vector<float> x(2 * cols, -kInf);
      x[cols] = 1.0f;  // second row has one live entry
      kernels::softmax_rows(x.data(), 2, cols, cols);
      for (int64_t c = 0; c < cols; ++c) ASSERT_EQ(x[c], 0.0f);
      EXPECT_EQ(x[cols], 1.0f);
    }
  });
}

TEST(Softmax, NaNOrPlusInfMakesTheRowNaN) {
  for_each_target([] {
    for (float bad : {kNaN, kInf}) {
      for (int64_t cols : {1, 7, 33}) {
        std::vector<float> x(cols, -kInf);  // NaN must win over "fully masked" too
        x[cols / 2] = bad;
        kernels::softmax_rows(x.data(), 1, cols, cols);
        for (float v : x) ASSERT_TRUE(std::isnan(v)) << bad << " in " << cols;
      }
    }
  });
}

// Distance in representable floats (both finite, same sign here).
int64_t ulp_distance(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return std::abs(static_cast<int64_t>(ia) - ib);
}

TEST(Softmax, ExpWithinTwoUlpOfStdExp) {
  for_each_target([] {
    std::vector<float> x;
    for (float v = -87.0f; v <= 88.5f; v += 0.00731f) x.push_back(v);  // normal results
    for (float v : {0.0f, -0.0f, 1e-8f, -1e-8f, 1.0f, -1.0f, 0.5f, 88.72f}) x.push_back(v);
    std::vector<float> got = x;
    kernels::exp_inplace(got.data(), static_cast<int64_t>(got.size()));
    int64_t worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const float want = static_cast<float>(std::exp(static_cast<double>(x[i])));
      worst = std::max(worst, ulp_distance(got[i], want));
      ASSERT_LE(ulp_distance(got[i], want), 2) << "exp(" << x[i] << ") = " << got[i] << ", want " << want;
    }
    RecordProperty("max_ulp", static_cast<int>(worst));  // 1 on AVX3, AVX2 and SCALAR
  });
}

// The softmax backward rows g = y o (g - dot): bitwise the scalar formula on every target
// (every row length around the vector widths, inf and NaN included), and, as a gradient,
// the float64 Jacobian product J^T g of softmax at the row's y (J = diag(y) - y y^T); rows
// `ld` apart each with its own dot, the padding between them untouched.
TEST(Softmax, BackwardRowIsTheScalarFormulaAndTheJacobianProduct) {
  for_each_target([] {
    for (int64_t n : {5, 16, 37}) {
      const int64_t rows = 3, ld = n + 3;
      const std::vector<float> y = normal_values(static_cast<size_t>(rows * ld), 1.0f, 31);
      const std::vector<float> g0 = normal_values(static_cast<size_t>(rows * ld), 1.0f, 32);
      const std::vector<float> dots = {0.5f, -1.25f, 3.0f};
      std::vector<float> g = g0;
      kernels::softmax_backward_rows(y.data(), g.data(), rows, n, ld, dots.data());
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < ld; ++c) {
          const size_t u = static_cast<size_t>(r * ld + c);
          const float want = c < n ? y[u] * (g0[u] - dots[static_cast<size_t>(r)]) : g0[u];
          ASSERT_EQ(g[u], want) << "row " << r << " column " << c << " of " << n << " (ld " << ld << ")";
        }
      }
    }
    for (int64_t n : kCols) {
      std::vector<float> x = normal_values(n, 3.0f, static_cast<uint32_t>(n) + 21);
      std::vector<double> xd(x.begin(), x.end()), y(static_cast<size_t>(n));
      kernels::softmax_reference(xd.data(), y.data(), n);
      const std::vector<float> yf(y.begin(), y.end()), g0 = normal_values(n, 1.0f, static_cast<uint32_t>(n) + 5);
      float dot = 0;
      for (int64_t i = 0; i < n; ++i) dot += yf[i] * g0[i];
      std::vector<float> g = g0;
      kernels::softmax_backward_rows(yf.data(), g.data(), 1, n, n, &dot);
      double gdot = 0;
      for (int64_t i = 0; i < n; ++i) gdot += y[i] * g0[i];
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(g[i], yf[i] * (g0[i] - dot)) << "element " << i << " of " << n;
        const double want = y[i] * (g0[i] - gdot);  // (J^T g)_i, J symmetric
        ASSERT_NEAR(g[i], want, 1e-6 * (1.0 + std::fabs(gdot))) << "element " << i << " of " << n;
      }
      std::vector<double> gd(g0.begin(), g0.end());
      kernels::softmax_backward_rows(y.data(), gd.data(), 1, n, n, &gdot);
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(gd[i], y[i] * (g0[i] - gdot)) << "double, element " << i;
    }
    const std::vector<float> y = {0.0f, 1.0f, 0.5f, kNaN, 0.25f, 0.0f, 1.0f, 0.5f, 0.5f,
                                  0.0f, 0.0f, 0.0f, 0.0f, 0.0f,  0.0f, 0.0f, 0.0f, 0.5f};
    std::vector<float> g = {kInf, 2.0f, kNaN, 1.0f, -kInf, 1.0f, 1.0f, 1.0f, 1.0f,
                            1.0f, 1.0f, 1.0f, 1.0f, 1.0f,  1.0f, 1.0f, 1.0f, 3.0f};
    const std::vector<float> g0 = g;
    const float one = 1.0f;
    kernels::softmax_backward_rows(y.data(), g.data(), 1, static_cast<int64_t>(g.size()), 0, &one);
    for (size_t i = 0; i < g.size(); ++i) {
      const float want = y[i] * (g0[i] - 1.0f);  // 0 * inf and NaN lanes are NaN, as in the scalar loop
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(g[i])) << "element " << i;
      } else {
        ASSERT_EQ(g[i], want) << "element " << i;
      }
    }
  });
}

// The mask rows of fused attention: x += keep ? 0 : -inf and x += bias, bitwise the scalar
// formulas on every target, at every length around the vector widths and at odd offsets
// (unaligned), with NaN, +-inf and finite scores under kept and masked keys.
TEST(Softmax, MaskRowsAreTheScalarFormulas) {
  for_each_target([] {
    const std::vector<float> specials = {kNaN, kInf, -kInf, 0.0f, -0.0f, 1e30f, -3.5f};
    for (int64_t n : kCols) {
      for (int64_t offset : {0, 3}) {
        std::vector<float> x = normal_values(static_cast<size_t>(n + offset), 4.0f, static_cast<uint32_t>(n) + 2);
        for (size_t i = 0; i < x.size(); i += 5) x[i] = specials[(i / 5) % specials.size()];
        std::vector<float> bias = normal_values(static_cast<size_t>(n + offset), 1.0f, static_cast<uint32_t>(n) + 3);
        for (size_t i = 1; i < bias.size(); i += 7) bias[i] = specials[(i / 7) % specials.size()];
        std::unique_ptr<bool[]> keep(new bool[static_cast<size_t>(n + offset)]);
        for (int64_t i = 0; i < n + offset; ++i) keep[static_cast<size_t>(i)] = (i * 7 + n) % 3 != 0;
        std::vector<float> got_mask = x, got_bias = x;
        kernels::add_bool_mask(got_mask.data() + offset, keep.get() + offset, n);
        kernels::add_row(got_bias.data() + offset, bias.data() + offset, n);
        std::vector<double> xd(x.begin(), x.end()), bd(bias.begin(), bias.end()), got_double = xd;
        kernels::add_row(got_double.data() + offset, bd.data() + offset, n);
        for (int64_t i = 0; i < n + offset; ++i) {
          const size_t u = static_cast<size_t>(i);
          const double want = i < offset ? xd[u] : xd[u] + bd[u];
          if (std::isnan(want)) {
            ASSERT_TRUE(std::isnan(got_double[u])) << "double, element " << i;
          } else {
            ASSERT_EQ(got_double[u], want) << "double, element " << i << " of " << n << " + " << offset;
          }
        }
        for (int64_t i = 0; i < n + offset; ++i) {
          const size_t u = static_cast<size_t>(i);
          const float want_mask = i < offset ? x[u] : x[u] + (keep[u] ? 0.0f : -kInf);
          const float want_bias = i < offset ? x[u] : x[u] + bias[u];
          for (auto [got, want, what] :
               {std::tuple{got_mask[u], want_mask, "bool mask"}, std::tuple{got_bias[u], want_bias, "float mask"}}) {
            if (std::isnan(want)) {
              ASSERT_TRUE(std::isnan(got)) << what << ", element " << i << " of " << n << " + " << offset;
            } else {
              ASSERT_EQ(got, want) << what << ", element " << i << " of " << n << " + " << offset;
            }
          }
        }
      }
    }
  });
}

// The score modifier rows: softcap within 4 ulp (Highway's Tanh) of cap tanh(x / cap) in
// float64 and its derivative within 1e-6, NaN kept, +-inf to +-cap; the ALiBi ramp within
// one rounding of x + slope (first + i) in float64. Every target, lengths around the widths.
TEST(Softmax, SoftcapAndRampRows) {
  for_each_target([] {
    for (int64_t n : kCols) {
      for (float cap : {50.0f, 1.0f, 0.03f}) {
        std::vector<float> x = normal_values(static_cast<size_t>(n), 30.0f, static_cast<uint32_t>(n) + 11);
        std::vector<float> got = x, grad(x.size(), -7.0f), got_nograd = x;
        kernels::softcap_row(got.data(), n, cap, grad.data());
        kernels::softcap_row(got_nograd.data(), n, cap, nullptr);
        for (int64_t i = 0; i < n; ++i) {
          const size_t u = static_cast<size_t>(i);
          const double t = std::tanh(static_cast<double>(x[u]) / cap), want = cap * t;
          ASSERT_NEAR(got[u], want, 5 * std::fabs(want) * FLT_EPSILON + 1e-30) << "x = " << x[u] << ", cap " << cap;
          ASSERT_EQ(got_nograd[u], got[u]);
          ASSERT_NEAR(grad[u], 1.0 - t * t, 1e-6) << "x = " << x[u] << ", cap " << cap;
        }
      }
      const float first = -static_cast<float>(n) / 2, slope = -0.0625f;
      std::vector<float> x = normal_values(static_cast<size_t>(n), 2.0f, static_cast<uint32_t>(n) + 12), got = x;
      kernels::add_ramp(got.data(), n, first, slope);
      for (int64_t i = 0; i < n; ++i) {
        const double want = x[static_cast<size_t>(i)] + static_cast<double>(slope) * (first + static_cast<double>(i));
        ASSERT_NEAR(got[static_cast<size_t>(i)], want, std::fabs(want) * FLT_EPSILON) << "element " << i;
      }
    }
    std::vector<float> x = {kNaN, kInf, -kInf, 0.0f,  -0.0f, 1e30f, -1e30f, 1e-30f, kNaN,
                            3.0f, kInf, 0.0f,  -5.0f, 7.0f,  1.0f,  2.0f,   4.0f,   100.0f};
    std::vector<float> grad(x.size());
    kernels::softcap_row(x.data(), static_cast<int64_t>(x.size()), 10.0f, grad.data());
    EXPECT_TRUE(std::isnan(x[0]) && std::isnan(x[8]));
    EXPECT_EQ(x[1], 10.0f);
    EXPECT_EQ(x[2], -10.0f);
    EXPECT_EQ(x[3], 0.0f);
    EXPECT_TRUE(x[4] == 0.0f && std::signbit(x[4]));
    EXPECT_EQ(x[5], 10.0f);
    EXPECT_EQ(x[6], -10.0f);
    EXPECT_EQ(grad[1], 0.0f);
    EXPECT_EQ(grad[3], 1.0f);
  });
}

TEST(Softmax, ExpEdgeCases) {
  for_each_target([] {
    std::vector<float> x = {-kInf, kInf, kNaN, -200.0f, 89.5f, 1000.0f, -1e30f, 1e30f, -100.0f};
    kernels::exp_inplace(x.data(), static_cast<int64_t>(x.size()));
    EXPECT_EQ(x[0], 0.0f);
    EXPECT_EQ(x[1], kInf);
    EXPECT_TRUE(std::isnan(x[2]));
    EXPECT_EQ(x[3], 0.0f);
    EXPECT_EQ(x[4], kInf);
    EXPECT_EQ(x[5], kInf);
    EXPECT_EQ(x[6], 0.0f);
    EXPECT_EQ(x[7], kInf);
    EXPECT_NEAR(x[8], std::exp(-100.0), 2e-45);  // subnormal result
  });
}

TEST(Softmax, MaxValueAndExpShiftSum) {
  for_each_target([] {
    for (int64_t n : kCols) {
      const std::vector<float> orig = normal_values(n, 5.0f, static_cast<uint32_t>(n) + 9);
      std::vector<float> x = orig;
      const float m = *std::max_element(x.begin(), x.end());
      ASSERT_EQ(kernels::max_value(x.data(), n), m);
      double want = 0.0;
      for (float v : x) want += std::exp(static_cast<double>(v) - m);
      const float sum = kernels::exp_shift_sum(x.data(), n, m);
      ASSERT_NEAR(sum, want, want * 1e-6);
      kernels::scale(x.data(), n, 2.0f);
      const float e0 = static_cast<float>(std::exp(static_cast<double>(orig[0]) - m));
      ASSERT_NEAR(x[0], 2.0f * e0, 2.0f * e0 * 1e-6f);
      x[n / 2] = kNaN;
      ASSERT_TRUE(std::isnan(kernels::max_value(x.data(), n)));
    }
    EXPECT_EQ(kernels::max_value(static_cast<const float*>(nullptr), 0), -kInf);
    EXPECT_EQ(kernels::exp_shift_sum(static_cast<float*>(nullptr), 0, 0.0f), 0.0f);
  });
}

// exp_shift_sum_fast (attention's exp) on every target: within 1e-7 relative of 2^y for the
// y = (x - shift) log2 e it computes in float32 (the polynomial's 1.32 ulp of 2^-24 and the
// exact 2^n), and within that plus the rounding of y of std::exp(x - shift) in double;
// +0 below 2^-126.5, exactly 1 at x = shift, -inf -> 0, NaN kept; the sum is the values'.
TEST(Softmax, FastExpShiftWithinItsBound) {
  for_each_target([] {
    double worst = 0.0;
    for (float shift : {0.0f, 3.5f, -50.0f, 1000.25f}) {
      std::vector<float> x;
      for (int i = 0; i <= 20000; ++i) x.push_back(shift - static_cast<float>(i) * 0.0045f);  // x - shift in [-90, 0]
      const int64_t n = static_cast<int64_t>(x.size());
      std::vector<float> got = x;
      const float sum = kernels::exp_shift_sum_fast(got.data(), n, shift);
      double total = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const float y = (x[i] - shift) * 1.44269504088896341f;  // as the kernel rounds it
        total += got[i];
        if (y < -126.5f) {
          ASSERT_EQ(got[i], 0.0f) << "x - shift = " << x[i] - shift;
          continue;
        }
        if (y < -126.0f) continue;  // at the flush threshold either is right
        const double want = std::exp2(static_cast<double>(y));
        const double rel = std::fabs(got[i] / want - 1.0);
        worst = std::max(worst, rel);
        ASSERT_LE(rel, 1e-7) << "x - shift = " << x[i] - shift << " (shift " << shift << ")";
        const double exact = std::exp(static_cast<double>(x[i]) - shift);
        ASSERT_LE(std::fabs(got[i] / exact - 1.0), 1e-7 + (std::fabs(y) + 1.0) * 0x1p-24) << x[i] - shift;
      }
      ASSERT_NEAR(sum, total, total * 1e-5);  // 20001 float additions (one chain on SCALAR)
    }
    std::printf("exp_shift_sum_fast: worst relative error %.3g against 2^y\n", worst);
    for (int64_t n : kCols) {  // every tail length; masked, NaN and equal entries
      std::vector<float> x = normal_values(static_cast<size_t>(n), 5.0f, static_cast<uint32_t>(n) + 3);
      const float m = *std::max_element(x.begin(), x.end());
      x[0] = -kInf;
      std::vector<float> got = x;
      (void)kernels::exp_shift_sum_fast(got.data(), n, m);
      ASSERT_EQ(got[0], 0.0f);
      for (int64_t i = 1; i < n; ++i) {
        if (x[i] == m) {
          ASSERT_EQ(got[i], 1.0f);
        }
      }
      if (n > 2) {
        x[n - 1] = kNaN;
        got = x;
        const float s = kernels::exp_shift_sum_fast(got.data(), n, m);
        ASSERT_TRUE(std::isnan(got[n - 1]) && std::isnan(s));
      }
      got = x;
      ASSERT_TRUE(std::isnan(kernels::exp_shift_sum_fast(got.data(), n, kNaN)));
    }
    EXPECT_EQ(kernels::exp_shift_sum_fast(static_cast<float*>(nullptr), 0, 0.0f), 0.0f);
  });
}

// The double row kernels (float64 attention) against the reference and std::exp, on
// every target: Highway's double exp is within a few ulp, so 1e-14 relative holds with
// margin (worst seen: 2.1e-15, AVX2 EPYC, both of its targets); NaN, masked and +inf rows follow the float rules.
TEST(SoftmaxKernels, DoubleKernelsMatchTheReferenceOnEveryTarget) {
  for_each_target([] {
    std::mt19937_64 rng(11);
    std::normal_distribution<double> normal(0.0, 8.0);
    double worst = 0.0;
    for (int64_t n : kCols) {
      std::vector<double> x(static_cast<size_t>(n)), want(static_cast<size_t>(n));
      for (double& v : x) v = normal(rng);
      if (n > 3) x[1] = -std::numeric_limits<double>::infinity();  // a masked key
      kernels::softmax_reference(x.data(), want.data(), n);
      std::vector<double> got = x;
      kernels::softmax_rows(got.data(), 1, n, n);
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_NEAR(got[i], want[i], want[i] * 1e-14 + 1e-300) << "n " << n << " i " << i;
        if (want[i] > 0) worst = std::max(worst, std::fabs(got[i] - want[i]) / want[i]);
      }
      const double m = *std::max_element(x.begin(), x.end());
      ASSERT_EQ(kernels::max_value(x.data(), n), m);
      double sum_want = 0.0;
      for (double v : x) sum_want += std::exp(v - m);
      std::vector<double> e = x;
      ASSERT_NEAR(kernels::exp_shift_sum(e.data(), n, m), sum_want, sum_want * 1e-14);
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(e[i], std::exp(x[i] - m), std::exp(x[i] - m) * 1e-14);
      kernels::scale(e.data(), n, 0.5);
      ASSERT_NEAR(e[0], 0.5 * std::exp(x[0] - m), std::exp(x[0] - m) * 1e-14);
    }
    std::printf("double softmax rows: worst relative error %.3g\n", worst);
    const double inf = std::numeric_limits<double>::infinity(), nan = std::numeric_limits<double>::quiet_NaN();
    std::vector<double> masked = {-inf, -inf, -inf}, with_nan = {1.0, nan, 2.0}, with_inf = {1.0, inf, 2.0};
    kernels::softmax_rows(masked.data(), 1, 3, 3);
    kernels::softmax_rows(with_nan.data(), 1, 3, 3);
    kernels::softmax_rows(with_inf.data(), 1, 3, 3);
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(masked[i], 0.0);
      EXPECT_TRUE(std::isnan(with_nan[i]));
      EXPECT_TRUE(std::isnan(with_inf[i]));
    }
    std::vector<double> edges = {-inf, nan, -800.0, 0.0, 700.0, 710.0};
    kernels::exp_shift_sum(edges.data(), 6, 0.0);
    EXPECT_EQ(edges[0], 0.0);
    EXPECT_TRUE(std::isnan(edges[1]));
    EXPECT_EQ(edges[2], 0.0);  // exp(-800) is below the smallest subnormal
    EXPECT_EQ(edges[3], 1.0);
    EXPECT_NEAR(edges[4], std::exp(700.0), std::exp(700.0) * 1e-14);
    EXPECT_EQ(edges[5], inf);
  });
}

}  // namespace
}  // namespace qkv
