// gemm_panels (B packed once in 64-column panels, oneDNN's BA16a64b) against the float64
// reference of the same product on the unpacked B (gemm_reference), and the packed layout
// itself against a hand-made case: attention packs K once per call and multiplies runs of
// whole panels (attention_cpu.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_internal.h"
#include "qkv/error.h"
#include "qkv/gemm.h"

namespace qkv {
namespace {

std::vector<float> random_floats(int64_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(GemmPanels, PackedLayout) {
  // op(B) [K = 3, N = 66] stored transposed ([N, K] rows, ldb 5): panel 0 holds columns
  // 0..63 as [16, 64] (rows 3..15 zero), panel 1 columns 64, 65 and zeros.
  const int64_t k = 3, n = 66, ldb = 5;
  std::vector<float> b(static_cast<size_t>(n * ldb));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t p = 0; p < k; ++p) b[static_cast<size_t>(j * ldb + p)] = static_cast<float>(100 * p + j);
  }
  ASSERT_EQ(gemm_panels_size(k, n), 2 * 16 * 64);
  std::vector<float> panels(static_cast<size_t>(gemm_panels_size(k, n)), -1.0f);
  gemm_pack_panels(true, k, n, b.data(), ldb, panels.data());
  for (int64_t x = 0; x < 2; ++x) {
    for (int64_t p = 0; p < 16; ++p) {
      for (int64_t c = 0; c < 64; ++c) {
        const int64_t j = 64 * x + c;
        const float want = p < k && j < n ? static_cast<float>(100 * p + j) : 0.0f;
        ASSERT_EQ(panels[static_cast<size_t>((x * 16 + p) * 64 + c)], want)
            << "panel " << x << " row " << p << " col " << c;
      }
    }
  }
}

// C [m, n] = alpha A op(B) + beta C with op(B) packed, against gemm_reference on op(B).
void expect_panels_match(int64_t m, int64_t n, int64_t k, bool trans_b, float alpha, float beta, uint32_t seed) {
  SCOPED_TRACE(testing::Message() << "m=" << m << " n=" << n << " k=" << k << " trans_b=" << trans_b);
  std::mt19937 rng(seed);
  const int64_t lda = k + 3, ldb = (trans_b ? k : n) + 2, ldc = n + 1;
  const std::vector<float> a = random_floats(m * lda, rng);
  const std::vector<float> b = random_floats((trans_b ? n : k) * ldb, rng);
  std::vector<float> c = random_floats(m * ldc, rng);
  std::vector<float> panels(static_cast<size_t>(gemm_panels_size(k, n)));
  gemm_pack_panels(trans_b, k, n, b.data(), ldb, panels.data());
  const GemmShape s{false, trans_b, m, n, k, lda, ldb, ldc};
  std::vector<float> want = c, packed_want = c, got = c;
  gemm_reference(s, alpha, a.data(), b.data(), beta, want.data());
  gemm_panels_reference(s, alpha, a.data(), panels.data(), beta, packed_want.data());
  gemm_panels(s, alpha, a.data(), panels.data(), beta, got.data());
  for (size_t i = 0; i < c.size(); ++i) {
    ASSERT_EQ(packed_want[i], want[i]) << "element " << i;  // the same float64 sums
    ASSERT_NEAR(got[i], want[i], 1e-5 * std::sqrt(static_cast<double>(k)) * 4) << "element " << i;
  }
}

TEST(GemmPanels, MatchesReference) {
  expect_panels_match(64, 448, 64, true, 0.125f, 0.0f, 1);  // attention's gathered key blocks
  expect_panels_match(64, 192, 64, true, 1.0f, 0.0f, 2);
  expect_panels_match(17, 100, 40, true, 0.5f, 1.0f, 3);  // partial panel, K not a multiple of 16
  expect_panels_match(5, 130, 16, false, -2.0f, 0.5f, 4);
  expect_panels_match(3, 1, 1, true, 1.0f, 0.0f, 5);
}

TEST(GemmPanels, RunsOfWholePanelsAreThemselvesPacked) {
  // op(B) [64, 320] packed once (streamed stores); columns 128..319 are panels 2.. of it.
  std::mt19937 rng(7);
  const int64_t m = 64, k = 64, n = 320, j0 = 128, cols = 192;
  const std::vector<float> a = random_floats(m * k, rng), kt = random_floats(n * k, rng);  // kt: [N, K]
  std::vector<float> panels(static_cast<size_t>(gemm_panels_size(k, n)));
  gemm_pack_panels(true, k, n, kt.data(), k, panels.data(), /*stream=*/true);
  const GemmShape s{false, true, m, cols, k, k, k, cols};
  std::vector<float> got(static_cast<size_t>(m * cols)), want(got.size());
  gemm_panels(s, 1.0f, a.data(), panels.data() + j0 * gemm_panels_size(k, 64) / 64, 0.0f, got.data());
  gemm_reference(s, 1.0f, a.data(), kt.data() + j0 * k, 0.0f, want.data());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4) << "element " << i;
}

// A as the MHA layer's head views give it (q rows 3E apart), transposed, and C rows wider
// than N, with beta: gemm_panels stages them as dense rows, since oneDNN 2.6 ran such packed
// products on its reference matmul (80 ms a 128 x 64 x 512 call); and where this CPU (or
// ONEDNN_MAX_CPU_ISA: the ctest gemm_panels.avx2) has no packed kernel at all, it unpacks B.
// Either way the plan it runs is one of oneDNN's fast kernels.
TEST(GemmPanels, NonDenseRowsMatchTheReferenceOnFastKernels) {
  std::mt19937 rng(11);
  struct Case {
    bool trans_a;
    int64_t m, n, k, lda, ldc;
    float beta;
  };
  for (const Case& x : {Case{false, 128, 512, 64, 384, 512, 0.0f}, Case{true, 40, 192, 64, 50, 192, 0.0f},
                        Case{false, 64, 256, 48, 48, 300, 0.5f}, Case{true, 33, 128, 20, 40, 140, 1.0f},
                        Case{false, 64, 128, 64, 64, 128, 0.0f}}) {
    const GemmShape s{x.trans_a, false, x.m, x.n, x.k, x.lda, x.n, x.ldc};
    SCOPED_TRACE(testing::Message() << detail::gemm_args_str(s, {}));
    const std::vector<float> a = random_floats((x.trans_a ? x.k : x.m) * x.lda, rng);
    const std::vector<float> b = random_floats(x.k * x.n, rng);
    std::vector<float> panels(static_cast<size_t>(gemm_panels_size(x.k, x.n)));
    gemm_pack_panels(false, x.k, x.n, b.data(), x.n, panels.data());
    std::vector<float> want = random_floats(x.m * x.ldc, rng), got = want;
    gemm_reference(s, 0.25f, a.data(), b.data(), x.beta, want.data());
    gemm_panels(s, 0.25f, a.data(), panels.data(), x.beta, got.data());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5 * std::sqrt(static_cast<double>(x.k))) << "element " << i;
    }
    const std::string plan = detail::gemm_panels_plan_str(s, 0.25f, x.beta);
    EXPECT_EQ(plan.find("ref"), std::string::npos) << plan;
    EXPECT_EQ(plan.rfind("unpacked", 0) == 0, !gemm_panels_native()) << plan;
  }
}

TEST(GemmPanels, EdgeCasesAndErrors) {
  std::vector<float> c{1.0f, 2.0f}, a{1.0f};
  const GemmShape empty_k{false, false, 1, 2, 0, 1, 0, 2};
  gemm_panels(empty_k, 1.0f, nullptr, nullptr, 0.5f, c.data());  // K == 0: C = beta C, nothing read
  EXPECT_EQ(c, (std::vector<float>{0.5f, 1.0f}));
  const GemmShape one{false, false, 1, 2, 1, 1, 0, 2};
  EXPECT_THROW(gemm_panels(one, 1.0f, a.data(), nullptr, 0.0f, c.data()), ValueError);
  EXPECT_THROW(gemm_panels({false, false, -1, 2, 1, 1, 0, 2}, 1.0f, a.data(), a.data(), 0.0f, c.data()), ValueError);
  EXPECT_THROW(gemm_pack_panels(true, 4, 2, a.data(), 3, c.data()), ValueError);  // ldb 3 < K 4
  EXPECT_THROW(gemm_panels_size(-1, 2), ValueError);
}

}  // namespace
}  // namespace qkv
