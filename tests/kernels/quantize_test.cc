// kernels/cpu/quantize.h: symmetric int8 quantization shared by the int8 nn::Linear and
// the fused attention's int8 Q K^T, against its definition written out by hand.
#include "kernels/cpu/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

namespace qkv::kernels {
namespace {

TEST(Quantize, ScaleIsAmaxOver127AndOneForZeroOrNonFinite) {
  EXPECT_EQ(symmetric_scale(254.0f), 2.0f);
  EXPECT_EQ(symmetric_scale(0.0f), 1.0f);
  EXPECT_EQ(symmetric_scale(INFINITY), 1.0f);
  EXPECT_EQ(symmetric_scale(NAN), 1.0f);
}

TEST(Quantize, RoundsHalfToEvenAndClipsTo127) {
  const std::vector<float> x = {0.5f, 1.5f, 2.5f, -0.5f, -1.5f, 1.49f, 300.0f, -300.0f, 0.0f};
  std::vector<int8_t> q(x.size());
  quantize_with(x.data(), static_cast<int64_t>(x.size()), 1.0f, q.data());
  const std::vector<int8_t> want = {0, 2, 2, 0, -2, 1, 127, -127, 0};
  EXPECT_EQ(q, want);
  // scale 2: x / 2 rounded
  quantize_with(x.data(), 3, 2.0f, q.data());
  EXPECT_EQ(q[0], 0);  // 0.25
  EXPECT_EQ(q[1], 1);  // 0.75
  EXPECT_EQ(q[2], 1);  // 1.25
}

TEST(Quantize, MaxAbsIsTheLargestMagnitudeAndReturnsInfAndNaN) {
  const std::vector<float> x = {1.0f, -3.0f, 0.5f, -0.0f, 2.0f, NAN, -INFINITY};
  EXPECT_EQ(max_abs(x.data(), 5), 3.0f);
  EXPECT_EQ(max_abs(x.data(), 0), 0.0f);
  EXPECT_TRUE(std::isnan(max_abs(x.data(), 6)));
  EXPECT_EQ(max_abs(x.data() + 6, 1), INFINITY);
  EXPECT_TRUE(std::isnan(max_abs(x.data() + 5, 2)));  // NaN orders above Inf
}

}  // namespace
}  // namespace qkv::kernels
