// qkv::gemm on int8 operands (int32 C) against gemm_reference (int64 accumulation):
// bit for bit, on the layouts the quantized Linear and attention pass.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/gemm_test_util.h"
#include "qkv/gemm.h"

namespace qkv {
namespace {

// `narrow`: B in [-64, 63] through detail::gemm_int8_narrow_b, half of the cases at its extremes.
void expect_int8_matches_reference(const test::Case& c, uint32_t seed, bool narrow = false) {
  SCOPED_TRACE(test::describe(c) + (narrow ? " narrow B" : ""));
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> dist(-128, 127), dist_b(narrow ? -64 : -128, narrow ? 63 : 127);
  const bool extremes = narrow && seed % 2 == 0;
  const GemmShape& s = c.s;
  auto fill = [&](int64_t span, std::uniform_int_distribution<int>& d, int lo, int hi) {
    std::vector<int8_t> x(static_cast<size_t>(std::max<int64_t>(span, 1)));
    for (int8_t& e : x) e = static_cast<int8_t>(extremes ? (rng() & 1 ? lo : hi) : d(rng));
    return x;
  };
  const std::vector<int8_t> a =
      fill(test::matrix_span(s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k, s.lda), dist, -128, 127);
  const std::vector<int8_t> b =
      fill(test::matrix_span(s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, s.ldb), dist_b, -64, 63);
  std::vector<int32_t> got(static_cast<size_t>(std::max<int64_t>(test::matrix_span(s.m, s.n, s.ldc), 1)), -7);
  std::vector<int32_t> want = got;
  if (narrow) {
    detail::gemm_int8_narrow_b(s, a.data(), b.data(), got.data());
  } else {
    gemm(s, a.data(), b.data(), got.data());
  }
  gemm_reference(s, a.data(), b.data(), want.data());
  EXPECT_EQ(got, want);  // padding between rows (ldc > n) stays -7 in both
}

TEST(GemmInt8, MatchesTheReferenceExactly) {
  const int64_t sizes[] = {1, 3, 16, 17, 64, 100, 768};
  std::mt19937 rng(8);
  auto pick = [&](auto& arr) { return arr[rng() % std::size(arr)]; };
  for (int trial = 0; trial < 40; ++trial) {
    const test::Case c = test::plain(pick(sizes), pick(sizes), pick(sizes), false, rng() & 1, trial % 3 == 0 ? 5 : 0);
    expect_int8_matches_reference(c, static_cast<uint32_t>(trial));
  }
  // The quantized Linear's call: tokens x [M, in] times the [out, in] weight transposed.
  expect_int8_matches_reference(test::plain(512, 768, 768, false, true), 99);
}

TEST(GemmInt8, ExtremeValuesDoNotOverflowAtTheDepthLimit) {
  const int64_t k = 131071;  // -128 * -128 * k < 2^31
  const std::vector<int8_t> a(static_cast<size_t>(k), -128);
  int32_t c = 0, r = 0;
  gemm({false, true, 1, 1, k, k, k, 1}, a.data(), a.data(), &c);
  gemm_reference({false, true, 1, 1, k, k, k, 1}, a.data(), a.data(), &r);
  EXPECT_EQ(c, int64_t{128} * 128 * k);
  EXPECT_EQ(r, c);
}

// The exact path of CPUs whose oneDNN int8 matmul saturates (no VNNI: AVX2; the ctest
// avx2.machine runs this file there too): float32 gemms over depth chunks of 1024, added in
// int32. Forced here on any CPU: random layouts, depths across chunk edges, batches, and
// the extremes at the depth limit (each chunk's sum is then exactly 2^24).
TEST(GemmInt8, WidenedPathMatchesTheReferenceExactly) {
  detail::force_gemm_int8_widening(true);
  const int64_t sizes[] = {1, 17, 64, 1023, 1024, 1025, 2500};
  std::mt19937 rng(5);
  auto pick = [&](auto& arr) { return arr[rng() % std::size(arr)]; };
  for (int trial = 0; trial < 16; ++trial) {
    const int64_t k = pick(sizes);
    const test::Case c = test::plain(1 + rng() % 40, 1 + rng() % 40, k, rng() & 1, rng() & 1, trial % 3 == 0 ? 5 : 0);
    expect_int8_matches_reference(c, static_cast<uint32_t>(trial));
  }
  {  // three op(A) [7, 1100] stored transposed, one B broadcast over them
    const GemmShape s{true, false, 7, 9, 1100, 7, 9, 9};
    const GemmBatch batch{{3}, {7 * 1100}, {0}, {7 * 9}};
    std::vector<int8_t> a(3 * 7 * 1100), b(1100 * 9);
    for (size_t x = 0; x < a.size(); ++x) a[x] = static_cast<int8_t>(rng());
    for (size_t x = 0; x < b.size(); ++x) b[x] = static_cast<int8_t>(rng());
    std::vector<int32_t> got(3 * 7 * 9), want(got.size());
    gemm(s, a.data(), b.data(), got.data(), batch);
    gemm_reference(s, a.data(), b.data(), want.data(), batch);
    EXPECT_EQ(got, want);
  }
  const int64_t k = 131071;
  const std::vector<int8_t> a(static_cast<size_t>(k), -128);
  int32_t c = 0;
  gemm({false, true, 1, 1, k, k, k, 1}, a.data(), a.data(), &c);
  EXPECT_EQ(c, int64_t{128} * 128 * k);
  detail::force_gemm_int8_widening(false);
}

// B in [-64, 63] (7-bit weights): oneDNN's int8 kernel on every CPU, also where 8-bit B
// saturates (the hook, and the ctest avx2.machine under ONEDNN_MAX_CPU_ISA=AVX2), never the
// float32-chunk path; random and extreme values, bit for bit. Products of one row or column
// may take the float32 path: oneDNN's gemv shifts B, not A, to u8, and saturated there for
// full-range A without VNNI (ONEDNN_MAX_CPU_ISA=AVX512_CORE, m = 768, n = 1, k = 64).
TEST(GemmInt8, NarrowBIsExactWithoutTheFloat32Path) {
  const int64_t sizes[] = {1, 16, 17, 64, 100, 768};
  std::mt19937 rng(12);
  auto pick = [&](auto& arr) { return arr[rng() % std::size(arr)]; };
  auto expect_exact = [](const test::Case& c, uint32_t seed) {
    const int64_t widened = detail::gemm_int8_widened_runs();
    expect_int8_matches_reference(c, seed, true);
    if (c.s.m != 1 && c.s.n != 1) {
      EXPECT_EQ(detail::gemm_int8_widened_runs(), widened) << test::describe(c);
    }
  };
  for (bool force : {false, true}) {
    detail::force_gemm_int8_widening(force);
    for (int trial = 0; trial < 12; ++trial) {
      expect_exact(test::plain(pick(sizes), pick(sizes), pick(sizes), false, rng() & 1, trial % 3 == 0 ? 5 : 0),
                   static_cast<uint32_t>(trial));
    }
    for (const int64_t m : {int64_t{1}, int64_t{100}, int64_t{768}}) {  // one column, one row (gemv)
      expect_exact(test::plain(m, 1, 64, false, true), 5);
      expect_exact(test::plain(1, m, 100, false, false), 6);
    }
    expect_exact(test::plain(64, 2304, 768, false, true), 4);  // the Linear's block
  }
  detail::force_gemm_int8_widening(false);
}

TEST(GemmInt8, FullRangeFollowsTheHook) {
  const bool native = gemm_int8_full_range();
  detail::force_gemm_int8_widening(true);
  EXPECT_FALSE(gemm_int8_full_range());
  detail::force_gemm_int8_widening(false);
  EXPECT_EQ(gemm_int8_full_range(), native);
  std::printf("gemm_int8_full_range: %d\n", native);
}

TEST(GemmInt8, DepthsThatCouldOverflowAreValueErrors) {
  const int8_t x = 0;
  int32_t c = 0;
  try {
    gemm({false, true, 1, 1, 131072, 131072, 131072, 1}, &x, &x, &c);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("gemm: k=131072 is more than 131071 for int8 operands"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace qkv
