// The SIMD targets qkv compiles its Highway kernels for, set here once. Every Highway
// dispatch file (softmax_cpu.cc, copy_transpose.cc, and any new *-inl.h user) includes this
// header first, before any hwy/ header, so that all kernels dispatch over the same list.
//
// Targets (Highway 1.2.0, cmake/QkvHighway.cmake): AVX3_DL (AVX-512 with VNNI, VBMI2 and
// friends: Ice Lake server, Sapphire Rapids, Zen 4 and later), AVX3 (AVX-512), AVX2 and the
// baseline fallback (SSE2 on x86-64; EMU128 or SCALAR elsewhere). AVX3_DL's use
// here: Highway's int16 ReorderWidenMulAccumulate is one vpdpwssd there (vpmaddwd + vpaddd on
// AVX3), the int8 decode kernels' multiply-adds (docs/decode_int8.md, "Highway 1.2"). Left out:
// SSSE3 and SSE4 (each target is one more compile of every kernel, and CPUs without AVX2 run the
// fallback), AVX3_ZEN4 (AMD only in Highway; Zen 4 runs AVX3_DL) and AVX3_SPR (AVX-512 FP16,
// which no machine here could run to test; Sapphire Rapids runs AVX3_DL). The fallback stays
// on: disabling the baseline target is a build error ("At least one baseline target must be
// defined and enabled"). The list is a macro of this header, not a -D flag of
// the build, so that every file that compiles Highway code gets the same list whichever target
// builds it (ctest layering.hwy_targets checks that each dispatch file includes it).
#pragma once

#include "runtime/simd_dispatch.h"  // QKV_DYNAMIC_DISPATCH's cap

#if defined(HIGHWAY_HWY_DETECT_TARGETS_H_)
#error "kernels/cpu/hwy_targets.h must be included before any Highway header"
#endif

#undef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SSSE3 | HWY_SSE4 | HWY_AVX3_ZEN4 | HWY_AVX3_SPR)
#undef HWY_WANT_AVX3_DL
#define HWY_WANT_AVX3_DL  // Highway compiles AVX3_DL only when asked

// The compiled target (HWY_TARGET, one per pass of foreach_target) by vector ISA, for kernels
// with code for AVX-512 or AVX2 only: Highway's x86 targets are ordered, better ones lower, so
// every AVX-512 target (AVX3_DL, AVX3, and any this list enables later) is <= HWY_AVX3.
#define QKV_HWY_AVX512 (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3)
#define QKV_HWY_AVX2_OR_AVX512 (HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2)

// HWY_DYNAMIC_DISPATCH of FUNC after QKV_MAX_SIMD_TARGET's cap is applied (runtime/simd_dispatch.h):
// every dispatch of qkv goes through it (ctest layering.hwy_targets), so that no kernel runs
// on a target above the cap, and a bad value is a ValueError at the first kernel, not ignored.
#define QKV_DYNAMIC_DISPATCH(FUNC) (::qkv::detail::apply_simd_target_cap(), HWY_DYNAMIC_DISPATCH(FUNC))
