// Runs a test body once per Highway SIMD target this CPU supports (AVX3, AVX2, SCALAR,
// ... as available), so every dispatch path of the kernels is checked on the machine
// at hand. The hooks are softmax_cpu.cc's; forcing a target is process-wide (Highway's
// SetSupportedTargetsForTest), so it covers every Highway file.
//
// QKV_TEST_SIMD_TARGET=<name> (e.g. AVX2) makes the whole test run behave as a CPU whose
// best target is <name>: tests/runtime/simd_target_env_test.cc forces it before the first
// test, and for_each_target loops over it and the targets below it, then restores it. The
// ctest avx2.machine sets it with ONEDNN_MAX_CPU_ISA=AVX2: an AVX2-only machine on this one.
// Names are read as the library reads QKV_MAX_SIMD_TARGET (runtime/simd_dispatch.h), the
// product's cap; unlike that maximum, this one must be a target this CPU runs: a name it lacks
// fails the run at set-up, unless QKV_TEST_SIMD_TARGET_ABSENT=skip and the named target is
// better than every one the CPU has (AVX3 on an AVX2-only AMD EPYC), which skips every test
// with a message that says so (simd_target_above_the_cpu; the ctests dtypes.avx3, dtypes.sse2).
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/simd_dispatch.h"  // simd_target_by_name, simd_targets_at_most
#include "softmax/softmax_cpu.h"    // simd_targets, force_simd_target

namespace qkv::test {

// The value of QKV_TEST_SIMD_TARGET ("" when unset), spelled as Highway names its target
// where it names one ("avx2": "AVX2").
inline std::string simd_target_from_env() {
  const char* name = std::getenv("QKV_TEST_SIMD_TARGET");
  if (name == nullptr) return std::string();
  const int64_t target = qkv::detail::simd_target_by_name(name);
  return target == 0 ? std::string(name) : kernels::detail::simd_target_name(target);
}

// The mask of the named target and every worse one this CPU supports, or 0 when `name` is
// empty or names none of them. Call with no target forced (simd_targets() lists only the
// forced ones).
inline int64_t simd_targets_up_to(const std::string& name) {
  const int64_t best = qkv::detail::simd_target_by_name(name);
  int64_t mask = 0, have = 0;
  for (int64_t target : kernels::detail::simd_targets()) {
    have |= target;
    if (target == best) mask = qkv::detail::simd_targets_at_most(best);
  }
  return mask & have;
}

// Back to the run's targets: QKV_TEST_SIMD_TARGET's and those below it, else every one.
// Returns false when the variable names no target of this CPU (every one is then enabled).
inline bool force_run_simd_targets() {
  kernels::detail::force_simd_target(0);
  const std::string name = simd_target_from_env();
  const int64_t mask = simd_targets_up_to(name);
  kernels::detail::force_simd_target(mask);
  return name.empty() || mask != 0;
}

// Whether the run is to be skipped rather than failed when QKV_TEST_SIMD_TARGET names no target
// of this CPU: QKV_TEST_SIMD_TARGET_ABSENT=skip and the name is a Highway target better than
// the CPU's best (Highway's bits grow as targets get worse), so that a CPU without it is an
// older one. A name Highway does not know, or one below the CPU's best (a target qkv is not
// compiled for, such as SSE4), still fails. Call after force_run_simd_targets returned false.
inline bool simd_target_above_the_cpu() {
  const char* absent = std::getenv("QKV_TEST_SIMD_TARGET_ABSENT");
  if (absent == nullptr || std::string(absent) != "skip") return false;
  const int64_t named = qkv::detail::simd_target_by_name(simd_target_from_env());
  const std::vector<int64_t> have = kernels::detail::simd_targets();
  return named != 0 && !have.empty() && named < have.front();
}

template <class Fn>
void for_each_target(Fn&& body) {
  for (int64_t target : kernels::detail::simd_targets()) {
    kernels::detail::force_simd_target(target);
    SCOPED_TRACE("target " + kernels::detail::simd_target_name(target));
    body();
  }
  force_run_simd_targets();
}

}  // namespace qkv::test
