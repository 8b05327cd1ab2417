// The SIMD targets qkv compiles its Highway kernels for, set here once. Every Highway
// dispatch file (softmax_cpu.cc, copy_transpose.cc, and any new *-inl.h user) includes this
// header first, before any hwy/ header, so that all kernels dispatch over the same list.
//
// Targets: AVX-512 (AVX3), AVX2 and the portable fallback (SCALAR with GCC 12.2,
// EMU128 with clang and GCC >= 12.3). SSSE3 and SSE4 are left out: each target is
// one more compile of every kernel, and CPUs without AVX2 run the fallback. The
// fallback stays on: with Highway 1.0.3, disabling HWY_EMU128 is a build
// error ("At least one baseline target must be defined and enabled") wherever EMU128
// is the baseline. The list is a macro of this header, not a -D flag of the build,
// so that every file that compiles Highway code gets the same list whichever target
// builds it (ctest layering.hwy_targets checks that each dispatch file includes it).
#pragma once

#include "runtime/simd_dispatch.h"  // QKV_DYNAMIC_DISPATCH's cap

#if defined(HIGHWAY_HWY_DETECT_TARGETS_H_)
#error "kernels/cpu/hwy_targets.h must be included before any Highway header"
#endif

#undef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4)

// HWY_DYNAMIC_DISPATCH of FUNC after QKV_MAX_SIMD_TARGET's cap is applied (runtime/simd_dispatch.h):
// every dispatch of qkv goes through it (ctest layering.hwy_targets), so that no kernel runs
// on a target above the cap, and a bad value is a ValueError at the first kernel, not ignored.
#define QKV_DYNAMIC_DISPATCH(FUNC) (::qkv::detail::apply_simd_target_cap(), HWY_DYNAMIC_DISPATCH(FUNC))
