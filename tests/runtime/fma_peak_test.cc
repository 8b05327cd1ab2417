// measure_fma_peak (qkv/machine.h) and its kernel, fma_peak-inl.h's chains: every compiled
// target this CPU runs does exactly `steps` multiply-adds per chain (against the recurrence's
// closed form in float64), and the measurement reports the workers, target and lanes it ran on.
// The rate itself is a benchmark's figure (`qkv bench peak`), never checked against a time.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>

#include "common/simd_targets.h"
#include "common/thread_guard.h"
#include "qkv/error.h"
#include "qkv/machine.h"
#include "qkv/parallel.h"
#include "runtime/fma_peak.h"

namespace qkv {
namespace {

// a_n of a <- a x + y from a_0: x^n a_0 + y (1 - x^n) / (1 - x), in float64.
double chain_after(double a0, double x, double y, int64_t n) {
  const double xn = std::pow(x, static_cast<double>(n));
  return xn * a0 + y * (1 - xn) / (1 - x);
}

// Lanes of a float32 vector on a Highway target, by its name.
int lanes_of(const std::string& target) {
  if (target.rfind("AVX3", 0) == 0) return 16;
  if (target == "AVX2") return 8;
  return target == "SCALAR" ? 1 : 4;  // SSE2, SSE4, EMU128, NEON: 128-bit vectors
}

TEST(FmaPeak, EveryTargetRunsExactlyTheStepsAskedOfEachChain) {
  // x = 0.999: one step more or fewer moves a_1000 by x^1000 (y - (1 - x) a_0) ~ 0.36, more than
  // five times the tolerance (1e-4 of ~632), itself above float32's rounding over 1000 steps
  // (1000 * 2^-24 * 632 ~ 4e-2 at most, mul and add rounded apart on targets without FMA).
  constexpr float x = 0.999f, y = 1.0f;
  test::for_each_target([&] {
    for (int64_t steps : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}}) {
      float ends[detail::kFmaChains];
      const int64_t lanes = detail::fma_chains(steps, x, y, ends);
      EXPECT_EQ(lanes, lanes_of(machine_info().simd_target));
      for (int c = 0; c < detail::kFmaChains; ++c) {
        const double want = chain_after(c, x, y, steps);
        EXPECT_NEAR(ends[c], want, 1e-4 * std::abs(want) + 1e-6) << "chain " << c << ", " << steps << " steps";
      }
    }
  });
}

TEST(FmaPeak, ReportsItsWorkersTargetAndLanes) {
  const test::ThreadCountGuard guard;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    const FmaPeak peak = measure_fma_peak(0);
    EXPECT_EQ(peak.threads, threads);
    EXPECT_EQ(peak.simd_target, machine_info().simd_target);
    EXPECT_EQ(peak.lanes, lanes_of(peak.simd_target));
    EXPECT_TRUE(std::isfinite(peak.gflops) && peak.gflops > 0) << peak.gflops;
  }
}

TEST(FmaPeak, RefusesATimeOutsideItsRange) {
  for (double bad : {-1.0, std::numeric_limits<double>::quiet_NaN(), 1e9}) {
    try {
      measure_fma_peak(bad);
      ADD_FAILURE() << "no error for min_seconds " << bad;
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("measure_fma_peak: min_seconds must be in [0, 3600]"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace qkv
