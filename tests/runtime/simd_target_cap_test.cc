// QKV_MAX_SIMD_TARGET (runtime/simd_dispatch.h): its names, its errors, and the target the
// dispatch runs under each cap. The caps set here are restored to the run's own (the variable's,
// read once by the library) before each test ends; the ctest simd_cap.avx2 runs these again with
// QKV_MAX_SIMD_TARGET=avx2 set, and python/test_py_machine.py a bad value in a subprocess.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/simd_targets.h"
#include "qkv/error.h"
#include "qkv/machine.h"
#include "qkv/softmax.h"
#include "qkv/tensor.h"
#include "runtime/simd_dispatch.h"
#include "softmax/softmax_cpu.h"

namespace qkv {
namespace {

using kernels::detail::simd_target_name;
using kernels::detail::simd_targets;

// The run's cap back (QKV_MAX_SIMD_TARGET's, or none) when a test ends.
struct RestoreRunCap {
  ~RestoreRunCap() { detail::set_simd_target_cap(detail::parse_simd_target_cap(std::getenv("QKV_MAX_SIMD_TARGET"))); }
};

std::string name_of_cap(const char* value) { return simd_target_name(detail::parse_simd_target_cap(value)); }

// The ValueError message of parse_simd_target_cap(value), or "" when it does not throw.
std::string cap_error(const char* value) {
  try {
    detail::parse_simd_target_cap(value);
  } catch (const ValueError& e) {
    return e.what();
  }
  return "";
}

TEST(SimdTargetCap, TakesHighwaysTargetNamesInAnyCase) {
  EXPECT_EQ(detail::parse_simd_target_cap(nullptr), 0);
  EXPECT_EQ(detail::parse_simd_target_cap(""), 0);
  // Every name at or above the fallback qkv compiles (SSE2 on x86-64 with Highway 1.2)
  for (const char* name : {"AVX3_SPR", "AVX3_ZEN4", "AVX3_DL", "AVX3", "AVX2", "SSE4", "SSSE3", "SSE2"}) {
    EXPECT_EQ(name_of_cap(name), name);
  }
  EXPECT_EQ(name_of_cap("avx2"), "AVX2");
  EXPECT_EQ(name_of_cap("Avx3_Zen4"), "AVX3_ZEN4");
  for (int64_t target : simd_targets())
    EXPECT_EQ(name_of_cap(simd_target_name(target).c_str()), simd_target_name(target));
  // Each cap admits itself and every worse target, and no better one.
  const int64_t avx2 = detail::simd_target_by_name("AVX2");
  EXPECT_EQ(detail::simd_targets_at_most(avx2) & detail::simd_target_by_name("AVX3"), 0);
  EXPECT_NE(detail::simd_targets_at_most(avx2) & avx2, 0);
  EXPECT_NE(detail::simd_targets_at_most(avx2) & detail::simd_target_by_name("SSE2"), 0);
  EXPECT_NE(detail::simd_targets_at_most(avx2) & detail::simd_target_by_name("SCALAR"), 0);
  EXPECT_EQ(detail::simd_targets_at_most(0), 0);
}

TEST(SimdTargetCap, RejectsOtherNamesNamingTheVariableTheValueAndTheTargets) {
  const std::string fallback = simd_target_name(simd_targets().back());
  for (const char* bad : {"AVX9", "AVX512", "avx2 ", "AVX-2", "3"}) {
    const std::string message = cap_error(bad);
    EXPECT_NE(message.find(std::string("QKV_MAX_SIMD_TARGET='") + bad + "' names no Highway SIMD target"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("AVX3_SPR, AVX3_ZEN4, AVX3_DL, AVX3, AVX2, SSE4, SSSE3, SSE2, EMU128, SCALAR"),
              std::string::npos)
        << message;
    EXPECT_NE(message.find("qkv dispatches to "), std::string::npos) << message;
    EXPECT_NE(message.find(fallback + " on this CPU)"), std::string::npos) << message;
  }
  // EMU128 and SCALAR are below SSE2, the fallback Highway 1.2 compiles on x86-64 (a build for
  // another architecture compiles one of them).
  for (const char* low : {"EMU128", "SCALAR"}) {
    if (fallback == low) {
      EXPECT_EQ(name_of_cap(low), low);
    } else {
      EXPECT_NE(cap_error(low).find("is below every target qkv is compiled for"), std::string::npos) << low;
    }
  }
}

// Under each cap the dispatch runs the best of the CPU's targets at or below it (a cap set
// replaces the run's), and machine_info names that target; a cap above them all changes nothing.
TEST(SimdTargetCap, DispatchRunsTheBestTargetAtOrBelowTheCap) {
  RestoreRunCap restore;
  EXPECT_EQ(detail::dispatched_simd_target(), simd_target_name(simd_targets().front()));
  detail::set_simd_target_cap(0);
  const std::vector<int64_t> all = simd_targets();  // the CPU's (or QKV_TEST_SIMD_TARGET's)
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(detail::dispatched_simd_target(), simd_target_name(all.front()));
  for (int64_t target : all) {
    detail::set_simd_target_cap(target);
    SCOPED_TRACE("cap " + simd_target_name(target));
    EXPECT_EQ(detail::dispatched_simd_target(), simd_target_name(target));
    EXPECT_EQ(machine_info().simd_target, simd_target_name(target));
    EXPECT_EQ(simd_targets().front(), target);
    // A kernel dispatched under the cap still computes: softmax of [0, log 3] is [1/4, 3/4].
    Tensor x = Tensor::zeros({2});
    x.data<float>()[1] = std::log(3.0f);
    const Tensor y = softmax(x, 0);
    EXPECT_NEAR(y.data<float>()[0], 0.25f, 1e-6f);
    EXPECT_NEAR(y.data<float>()[1], 0.75f, 1e-6f);
  }
  detail::set_simd_target_cap(detail::simd_target_by_name("AVX3_SPR"));  // above qkv's targets
  EXPECT_EQ(detail::dispatched_simd_target(), simd_target_name(all.front()));
  detail::set_simd_target_cap(detail::simd_target_by_name("SSE4"));  // not compiled: the fallback
  EXPECT_EQ(detail::dispatched_simd_target(), simd_target_name(all.back()));
}

// The run's own cap: the variable's value, and the target machine_info reports under it.
TEST(SimdTargetCap, MachineInfoNamesTheVariableAndTheCappedTarget) {
  const char* value = std::getenv("QKV_MAX_SIMD_TARGET");
  const MachineInfo info = machine_info();
  EXPECT_EQ(info.simd_target, detail::dispatched_simd_target());
  if (value == nullptr || *value == '\0') {
    EXPECT_EQ(info.simd_target_cap, "");
    EXPECT_NE(machine_line(info).find("; Highway: " + info.simd_target + "; "), std::string::npos);
  } else {
    EXPECT_EQ(info.simd_target_cap, value);
    EXPECT_NE(machine_line(info).find("; Highway: " + info.simd_target + " (QKV_MAX_SIMD_TARGET=" + value + "); "),
              std::string::npos)
        << machine_line(info);
    EXPECT_LE(detail::parse_simd_target_cap(value), simd_targets().front());  // the cap or worse
  }
}

}  // namespace
}  // namespace qkv
