// qkv::gemm for float64 (OpenBLAS) against gemm_reference (long double
// accumulation), pinned first by a hand-computed case; the layouts einsum passes.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/gemm_test_util.h"
#include "qkv/error.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"

namespace qkv {
namespace {

using test::Case;
using test::expect_matches_reference;
using test::plain;

TEST(GemmF64, HandComputed2x2BothPaths) {
  const double a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8};
  using GemmF64 = void (*)(const GemmShape&, double, const double*, const double*, double, double*, const GemmBatch&);
  for (GemmF64 fn : std::initializer_list<GemmF64>{gemm, gemm_reference}) {
    double c[] = {1, 1, 1, 1};
    fn({false, false, 2, 2, 2, 2, 2, 2}, 2.0, a, b, 0.5, c, {});
    EXPECT_EQ(std::vector<double>(c, c + 4), (std::vector<double>{38.5, 44.5, 86.5, 100.5}));
  }
}

TEST(GemmF64, KeepsPrecisionFloat32WouldLose) {
  // 1 + 1e-12 is not a float; the product must keep it.
  const double a[] = {1.0 + 1e-12, 3.0}, b[] = {1.0, 1e-12};
  double c = 0;
  gemm({false, false, 1, 1, 2, 2, 1, 1}, 1.0, a, b, 0.0, &c);
  EXPECT_EQ(c, (1.0 + 1e-12) + 3e-12);
}

TEST(GemmF64, MatchesReferenceOnRandomShapes) { test::expect_random_shapes_match<double>(100, 7); }

TEST(GemmF64, BatchedLayoutsOfAttentionAndEinsum) {
  // [B=2, H=3] heads read from [B, L, H, D] storage (L=5, D=4): scores = Q K^T.
  Case heads = plain(5, 5, 4, false, true);
  heads.s.lda = heads.s.ldb = 12;
  heads.batch = {{2, 3}, {60, 4}, {60, 4}, {75, 25}};
  expect_matches_reference<double>(heads);
  Case broadcast = plain(6, 7, 8);  // B shared by every batch matrix
  broadcast.batch = {{4}, {48}, {0}, {42}};
  expect_matches_reference<double>(broadcast);
  Case many_small = plain(3, 4, 5, true, false);  // runs as parallel_for over the batch
  many_small.batch = {{64}, {15}, {20}, {12}};
  many_small.beta = 0.5f;
  expect_matches_reference<double>(many_small);
  Case negative = plain(4, 4, 4);
  negative.batch = {{3}, {-16}, {16}, {16}};
  expect_matches_reference<double>(negative);
}

TEST(GemmF64, DegenerateSizesAndUnusedLeadingDims) {
  expect_matches_reference<double>(plain(1, 1, 1));
  expect_matches_reference<double>(plain(1, 9, 1, true, true));
  Case single_row = plain(1, 5, 3);
  single_row.s.lda = 0;  // one stored row: lda is not used
  expect_matches_reference<double>(single_row);
  Case k_zero = plain(3, 3, 0);
  k_zero.beta = 2.0f;
  expect_matches_reference<double>(k_zero);
}

TEST(GemmF64, AlphaZeroOrKZeroDoesNotReadAOrB) {
  std::vector<double> c = {1, std::numeric_limits<double>::quiet_NaN(), 3, 4};
  gemm({false, false, 2, 2, 3, 3, 2, 2}, 0.0, nullptr, nullptr, 2.0, c.data());
  EXPECT_EQ(c[0], 2.0);
  EXPECT_TRUE(std::isnan(c[1]));
  gemm({false, false, 2, 2, 0, 1, 2, 2}, 1.0, nullptr, nullptr, 0.0, c.data());  // beta 0 overwrites NaN
  EXPECT_EQ(c, (std::vector<double>{0, 0, 0, 0}));
}

TEST(GemmF64, RejectsInconsistentArgumentsLikeFloat32) {
  std::vector<double> buf(16, 0.0);
  EXPECT_THROW(gemm({false, false, 2, 2, 3, 2, 2, 2}, 1.0, buf.data(), buf.data(), 0.0, buf.data()), ValueError);
  try {
    gemm({false, false, 2, 2, 2, 2, 2, 2}, 1.0, buf.data(), buf.data(), 0.0, buf.data(), {{2}, {4}, {4}, {0}});
    ADD_FAILURE() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("stride_c is 0"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gemm({false, false, 2, 2, 2, 2, 2, 2}, 1.0, nullptr, buf.data(), 0.0, buf.data()), ValueError);
}

TEST(GemmF64, SameResultOnOneAndTwoThreadsAndInsideParallelFor) {
  const int saved = get_num_threads();
  Case big = plain(96, 80, 300);
  big.batch = {{3}, {96 * 300}, {0}, {96 * 80}};
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    expect_matches_reference<double>(big);
  }
  set_num_threads(saved);
  parallel_for(0, 4, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) expect_matches_reference<double>(plain(33, 17, 65), static_cast<uint32_t>(i));
  });
}

}  // namespace
}  // namespace qkv
