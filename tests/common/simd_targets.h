// Runs a test body once per Highway SIMD target this CPU supports (AVX3, AVX2, SCALAR,
// ... as available), so every dispatch path of the kernels is checked on the machine
// at hand. The hooks are softmax_cpu.cc's; forcing a target is process-wide (Highway's
// SetSupportedTargetsForTest), so it covers every Highway file.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>

#include "softmax/softmax_cpu.h"  // simd_targets, force_simd_target

namespace qkv::test {

template <class Fn>
void for_each_target(Fn&& body) {
  for (int64_t target : kernels::detail::simd_targets()) {
    kernels::detail::force_simd_target(target);
    SCOPED_TRACE("target " + kernels::detail::simd_target_name(target));
    body();
  }
  kernels::detail::force_simd_target(0);
}

}  // namespace qkv::test
