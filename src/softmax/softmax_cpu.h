// Test hooks of the Highway dispatch in softmax_cpu.cc: run the kernel tests on
// every SIMD target this CPU supports, not only the best one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace qkv::kernels::detail {

// Highway targets compiled into qkv and supported by this CPU, best first
// (e.g. AVX3, AVX2, SCALAR); affected by force_simd_target and QKV_MAX_SIMD_TARGET
// (runtime/simd_dispatch.h).
std::vector<int64_t> simd_targets();
// "AVX3", "AVX2", "SCALAR", ...
std::string simd_target_name(int64_t target);
// Makes dispatch behave as if the CPU supported only `target` (0 restores the
// real CPU). Process-wide: for single-threaded tests only.
void force_simd_target(int64_t target);

}  // namespace qkv::kernels::detail
