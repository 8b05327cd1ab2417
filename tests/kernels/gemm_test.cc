// qkv::gemm (oneDNN) against qkv::gemm_reference (double accumulation), which a
// hand-computed case pins first. Layout cases mirror what attention and einsum
// pass: permuted head/sequence strides, broadcasts, padding, empty dims.
#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <vector>

#include "kernels/gemm_test_util.h"
#include "qkv/gemm.h"

namespace qkv {
namespace {

using test::Case;
using test::expect_matches_reference;
using test::plain;

// A null float operand (a bare nullptr would match the bf16/f16 overloads too).
constexpr const float* kNoFloats = nullptr;

TEST(GemmReference, HandComputed2x2) {
  const float a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8};
  float c[] = {1, 1, 1, 1};
  gemm_reference({false, false, 2, 2, 2, 2, 2, 2}, 2.0f, a, b, 0.5f, c);
  EXPECT_EQ(std::vector<float>(c, c + 4), (std::vector<float>{38.5f, 44.5f, 86.5f, 100.5f}));
  float t[4];
  gemm_reference({true, false, 2, 2, 2, 2, 2, 2}, 1.0f, a, b, 0.0f, t);  // A^T B
  EXPECT_EQ(std::vector<float>(t, t + 4), (std::vector<float>{26, 30, 38, 44}));
  gemm_reference({false, true, 2, 2, 2, 2, 2, 2}, 1.0f, a, b, 0.0f, t);  // A B^T
  EXPECT_EQ(std::vector<float>(t, t + 4), (std::vector<float>{17, 23, 39, 53}));
}

TEST(Gemm, HandComputed2x2) {
  const float a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8};
  float c[] = {1, 1, 1, 1};
  gemm({false, false, 2, 2, 2, 2, 2, 2}, 2.0f, a, b, 0.5f, c);
  EXPECT_EQ(std::vector<float>(c, c + 4), (std::vector<float>{38.5f, 44.5f, 86.5f, 100.5f}));
}

TEST(Gemm, MatchesReferenceOnRandomShapes) { test::expect_random_shapes_match<float>(150, 42); }

TEST(Gemm, AllTransposeCombinations) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      expect_matches_reference(plain(37, 53, 71, ta, tb));
      expect_matches_reference(plain(256, 128, 96, ta, tb));
    }
  }
}

TEST(Gemm, LeadingDimensionsLargerThanRows) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) expect_matches_reference(plain(19, 23, 29, ta, tb, 13));
  }
}

TEST(Gemm, DegenerateSizesOne) {
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      expect_matches_reference(plain(1, 1, 1, ta, tb));
      expect_matches_reference(plain(1, 40, 33, ta, tb, 5));
      expect_matches_reference(plain(40, 1, 33, ta, tb, 5));
      expect_matches_reference(plain(40, 33, 1, ta, tb, 5));
    }
  }
}

TEST(Gemm, UnusedLeadingDimensionMayBeAnything) {
  Case c = plain(1, 8, 4);
  c.s.lda = 0;  // one stored row: lda unused (a broadcast row of a tensor)
  expect_matches_reference(c);
  c = plain(8, 8, 1, false, false);
  c.s.ldb = 0;
  expect_matches_reference(c);
}

TEST(Gemm, ZeroSizedDimsLeaveCAlone) {
  for (const Case& c : {plain(0, 5, 3), plain(5, 0, 3)}) {
    std::vector<float> out(64, 7.0f);
    gemm(c.s, 1.0f, kNoFloats, kNoFloats, 0.0f, out.data());
    EXPECT_EQ(out, std::vector<float>(64, 7.0f));
  }
  Case c = plain(3, 4, 5);
  c.batch = {{2, 0}, {15, 15}, {20, 20}, {12, 12}};
  std::vector<float> out(64, 7.0f);
  gemm(c.s, 1.0f, kNoFloats, kNoFloats, 0.0f, out.data(), c.batch);
  EXPECT_EQ(out, std::vector<float>(64, 7.0f));
}

TEST(Gemm, KZeroScalesCByBeta) {
  Case c = plain(3, 4, 0);
  std::vector<float> out(12, 2.0f);
  gemm(c.s, 1.0f, kNoFloats, kNoFloats, 1.5f, out.data());
  EXPECT_EQ(out, std::vector<float>(12, 3.0f));
  gemm(c.s, 1.0f, kNoFloats, kNoFloats, 0.0f, out.data());
  EXPECT_EQ(out, std::vector<float>(12, 0.0f));
  expect_matches_reference(c);
}

TEST(Gemm, BetaZeroOverwritesNaNInC) {
  const float a[] = {1, 2}, b[] = {3, 4};
  float c[] = {std::numeric_limits<float>::quiet_NaN()};
  gemm({false, false, 1, 1, 2, 2, 1, 1}, 1.0f, a, b, 0.0f, c);
  EXPECT_EQ(c[0], 11.0f);
  float r[] = {std::numeric_limits<float>::quiet_NaN()};
  gemm_reference({false, false, 1, 1, 2, 2, 1, 1}, 1.0f, a, b, 0.0f, r);
  EXPECT_EQ(r[0], 11.0f);
}

TEST(Gemm, AlphaZeroDoesNotReadAOrB) {
  std::vector<float> out(6, 4.0f);
  gemm({false, false, 2, 3, 5, 5, 3, 3}, 0.0f, kNoFloats, kNoFloats, 0.5f, out.data());
  EXPECT_EQ(out, std::vector<float>(6, 2.0f));
}

TEST(Gemm, AlphaAndBetaCombinations) {
  for (float alpha : {1.0f, -1.0f, 0.125f, 3.0f}) {
    for (float beta : {0.0f, 1.0f, -0.5f, 2.0f}) {
      Case c = plain(33, 65, 17, false, true);
      c.alpha = alpha;
      c.beta = beta;
      expect_matches_reference(c);
    }
  }
}

}  // namespace
}  // namespace qkv
