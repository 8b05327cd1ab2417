// The vectorized attention dropout (attention/dropout_rows.h) against its definition,
// random::dropout_keep (Philox4x32-10, qkv/random.h), on every Highway target: the same
// weights kept, bit for bit, across seeds, counters that cross 2^32 and probabilities at
// the edges; then the fused forward with dropout against the float64 reference.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "attention/dropout_rows.h"
#include "common/simd_targets.h"
#include "qkv/attention.h"
#include "qkv/random.h"
#include "qkv/tensor.h"

namespace qkv::attention {
namespace {

using test::for_each_target;

std::vector<float> row_values(int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = 0.25f + 0.001f * static_cast<float>(i);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(), -0.0f};
  for (int64_t i = 3; i < n; i += 11) x[static_cast<size_t>(i)] = specials[(i / 11) % 4];
  return x;
}

TEST(DropoutRows, KeepExactlyTheDefinitionsWeights) {
  const uint64_t seeds[] = {0, 1, 0x123456789abcdefull, ~0ull};
  const uint64_t starts[] = {0, 17, (uint64_t{1} << 32) - 5, (uint64_t{1} << 40) + 3, ~0ull - 40};
  const double ps[] = {0.0, 1e-300, 0.1, 0.5, 0.9, 1.0 - 1e-16, 1.0};
  for_each_target([&] {
    for (int64_t n : {1, 3, 7, 8, 9, 15, 16, 17, 33, 100, 257}) {
      for (uint64_t seed : seeds) {
        for (uint64_t start : starts) {
          for (double p : ps) {
            const float scale = p < 1.0 ? static_cast<float>(1.0 / (1.0 - p)) : 0.0f;
            const std::vector<float> x = row_values(n);
            std::vector<float> got = x, first = x, second(x.rbegin(), x.rend());
            const std::vector<float> second_in = second;
            dropout_row(got.data(), n, seed, start, p, scale);
            dropout_row(first.data(), n, seed, start, p, scale, second.data());  // one draw, two rows
            for (int64_t i = 0; i < n; ++i) {
              const size_t u = static_cast<size_t>(i);
              const bool keep = random::dropout_keep(seed, start + static_cast<uint64_t>(i), p);
              const float want = keep ? x[u] * scale : 0.0f, want2 = keep ? second_in[u] * scale : 0.0f;
              ASSERT_EQ(std::memcmp(&first[u], &got[u], sizeof(float)), 0) << "element " << i;
              if (std::isnan(want2)) {
                ASSERT_TRUE(std::isnan(second[u])) << "second row, element " << i;
              } else {
                ASSERT_EQ(second[u], want2) << "second row, element " << i << ", seed " << seed << ", p " << p;
              }
              if (std::isnan(want)) {
                ASSERT_TRUE(std::isnan(got[u])) << "element " << i << " seed " << seed << " start " << start;
              } else {
                ASSERT_EQ(got[u], want) << "element " << i << " of " << n << ", seed " << seed << ", start " << start
                                        << ", p " << p;
                ASSERT_EQ(std::signbit(got[u]), std::signbit(want)) << "element " << i;
              }
            }
          }
        }
      }
    }
  });
}

// The fused forward's dropout (through this kernel) against the float64 reference's
// (random::dropout_keep per element): the same output within float32 rounding.
TEST(DropoutRows, FusedForwardMatchesTheReference) {
  const Tensor q = Tensor::randn({2, 3, 37, 16}, 11), k = Tensor::randn({2, 3, 45, 16}, 12),
               v = Tensor::randn({2, 3, 45, 8}, 13);
  AttentionOptions o;
  o.dropout_p = 0.3;
  o.seed = 77;
  for_each_target([&] {
    const Tensor got = scaled_dot_product_attention(q, k, v, o).output;
    const Tensor want = attention_reference(q, k, v, o).output.to(DType::f64);
    const Tensor g = got.to(DType::f64).contiguous(), w = want.contiguous();
    const double* gp = g.data<double>();
    const double* wp = w.data<double>();
    for (int64_t i = 0; i < g.numel(); ++i) ASSERT_NEAR(gp[i], wp[i], 1e-5 * (1.0 + std::fabs(wp[i]))) << i;
  });
}

}  // namespace
}  // namespace qkv::attention
