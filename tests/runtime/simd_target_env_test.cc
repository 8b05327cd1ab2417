// QKV_TEST_SIMD_TARGET (tests/common/simd_targets.h): forced for the whole run before the
// first test, so that a test run on this CPU dispatches every Highway kernel as a CPU whose
// best target is the named one does. The ctest avx2.machine sets AVX2 there (with oneDNN capped
// at AVX2): the AMD EPYC machines without AVX-512, emulated on one with it. The ctests
// dtypes.avx3 and dtypes.sse2 set AVX3 and SSE2 with QKV_TEST_SIMD_TARGET_ABSENT=skip: on a CPU
// without AVX3 the run is skipped, saying so, instead of failing (simd_target.absent_skips).
#include <gtest/gtest.h>

#include <string>

#include "common/simd_targets.h"
#include "qkv/machine.h"
#include "softmax/softmax_cpu.h"

namespace qkv {
namespace {

class ForcedSimdTarget : public ::testing::Environment {
 public:
  void SetUp() override {
    if (test::force_run_simd_targets()) return;
    std::string have;
    for (int64_t target : kernels::detail::simd_targets()) {
      have += ' ';  // (appended in two steps: gcc 12's -Wrestrict misfires on " " + name)
      have += kernels::detail::simd_target_name(target);
    }
    if (test::simd_target_above_the_cpu()) {  // QKV_TEST_SIMD_TARGET_ABSENT=skip
      GTEST_SKIP() << "QKV_TEST_SIMD_TARGET=" << test::simd_target_from_env()
                   << " is above this CPU's SIMD targets (it has" << have
                   << ", at or below QKV_MAX_SIMD_TARGET if set): every test skipped";
    }
    FAIL() << "QKV_TEST_SIMD_TARGET=" << test::simd_target_from_env()
           << " names no SIMD target of this CPU at or below QKV_MAX_SIMD_TARGET, if set (it has" << have << ")";
  }
};

const ::testing::Environment* const forced = ::testing::AddGlobalTestEnvironment(new ForcedSimdTarget);

// Without the variable every target stays enabled; with it, the named one is the best left,
// and what machine_info reports (the target HWY_DYNAMIC_DISPATCH picks).
TEST(ForcedSimdTarget, IsTheTargetTheKernelsDispatchTo) {
  ASSERT_NE(forced, nullptr);
  const std::string name = test::simd_target_from_env();
  const std::vector<int64_t> targets = kernels::detail::simd_targets();
  ASSERT_FALSE(targets.empty());
  if (name.empty()) {
    kernels::detail::force_simd_target(0);
    EXPECT_EQ(kernels::detail::simd_targets(), targets);
  } else {
    EXPECT_EQ(kernels::detail::simd_target_name(targets.front()), name);
  }
  EXPECT_EQ(machine_info().simd_target, kernels::detail::simd_target_name(targets.front()));
}

// for_each_target visits the run's targets and leaves them as they were.
TEST(ForcedSimdTarget, ForEachTargetRestoresTheRunsTargets) {
  const std::vector<int64_t> before = kernels::detail::simd_targets();
  std::vector<int64_t> seen;
  test::for_each_target([&] { seen.push_back(kernels::detail::simd_targets().front()); });
  EXPECT_EQ(seen, before);
  EXPECT_EQ(kernels::detail::simd_targets(), before);
}

}  // namespace
}  // namespace qkv
