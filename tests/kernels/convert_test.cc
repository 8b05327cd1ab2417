// kernels::widen / narrow (convert_cpu.cc) against qkv::bfloat16 / qkv::float16's
// scalar conversions, bit for bit, on every SIMD target this CPU supports: every
// 16-bit pattern widened; narrowing on rounding ties, NaN, infinities, subnormals and
// random bits; every length up to a few vectors (the padded tail).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "common/simd_targets.h"
#include "kernels/cpu/convert.h"

namespace qkv {
namespace {

using test::for_each_target;

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <class H>
void expect_widens_every_pattern() {
  std::vector<H> all(65536);
  for (uint32_t i = 0; i < 65536; ++i) all[i] = H::from_bits(static_cast<uint16_t>(i));
  std::vector<float> got(all.size());
  kernels::widen(all.data(), static_cast<int64_t>(all.size()), got.data());
  int failures = 0;
  for (size_t i = 0; i < all.size() && failures < 5; ++i) {
    const float want = static_cast<float>(all[i]);
    const bool ok = std::isnan(want) ? std::isnan(got[i]) : bits(got[i]) == bits(want);
    if (!ok) {
      ADD_FAILURE() << "pattern " << i << ": " << got[i] << " want " << want;
      ++failures;
    }
  }
}

TEST(Convert, WidenIsExactForEveryPatternOnEveryTarget) {
  for_each_target([] {
    expect_widens_every_pattern<bfloat16>();
    expect_widens_every_pattern<float16>();
  });
}

std::vector<float> narrowing_inputs() {
  std::vector<float> x = {0.0f,    -0.0f,    1.0f,   -1.0f,   INFINITY, -INFINITY, NAN,   -NAN,
                          3.0e38f, -3.4e38f, 1e-40f, -1e-45f, 65504.0f, 65520.0f,  6e-8f, 1e-5f};
  // Exact ties between two bfloat16 values (low 16 bits 0x8000), both parities, and
  // one ulp either side of them; signalling NaN payloads.
  for (uint32_t hi : {0x3f80u, 0x3f81u, 0x4049u, 0xc2c8u, 0x7f7fu, 0x0001u}) {
    for (uint32_t lo : {0x8000u, 0x7fffu, 0x8001u, 0xffffu, 0x0000u}) x.push_back(from_bits(hi << 16 | lo));
  }
  for (uint32_t nan : {0x7f800001u, 0xff800100u, 0x7fc00000u, 0x7fbfffffu}) x.push_back(from_bits(nan));
  std::mt19937 rng(3);
  for (int i = 0; i < 20000; ++i) x.push_back(from_bits(static_cast<uint32_t>(rng())));
  return x;
}

template <class H>
void expect_narrows_like_the_scalar(const std::vector<float>& x) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{15}, size_t{16}, size_t{17}, size_t{33}, x.size()}) {
    std::vector<H> got(n + 1, H::from_bits(0x1234));  // one guard element past the end
    kernels::narrow(x.data(), static_cast<int64_t>(n), got.data());
    int failures = 0;
    for (size_t i = 0; i < n && failures < 5; ++i) {
      if (got[i].bits != H(x[i]).bits) {
        ADD_FAILURE() << "n " << n << " input " << x[i] << " bits " << got[i].bits << " want " << H(x[i]).bits;
        ++failures;
      }
    }
    EXPECT_EQ(got[n].bits, 0x1234) << "wrote past the end, n " << n;
  }
}

TEST(Convert, NarrowRoundsToNearestEvenLikeTheScalarOnEveryTarget) {
  const std::vector<float> x = narrowing_inputs();
  for_each_target([&] {
    expect_narrows_like_the_scalar<bfloat16>(x);
    expect_narrows_like_the_scalar<float16>(x);
  });
}

TEST(Convert, RowsHonourLeadingDimensions) {
  const std::vector<float> src = {1, 2, 3, -1, 4, 5, 6, -1};  // 2 rows of 3, ld 4
  std::vector<bfloat16> mid(6);
  kernels::convert_rows(src.data(), 2, 3, 4, mid.data(), 3);
  std::vector<float> back(10, -7.0f);  // 2 rows of 3, ld 5
  kernels::convert_rows(mid.data(), 2, 3, 3, back.data(), 5);
  EXPECT_EQ(back, (std::vector<float>{1, 2, 3, -7, -7, 4, 5, 6, -7, -7}));
}

}  // namespace
}  // namespace qkv
