// Per-target body of simd_dispatch.cc: a function that returns the target it was compiled for,
// so that calling it through the dispatch tells which target the dispatch runs. simd_dispatch.cc
// re-includes this file once per SIMD target via hwy/foreach_target.h; no other file includes
// it. Include guard toggled per target (Highway's convention).
#if defined(QKV_RUNTIME_SIMD_DISPATCH_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_RUNTIME_SIMD_DISPATCH_INL_H_
#undef QKV_RUNTIME_SIMD_DISPATCH_INL_H_
#else
#define QKV_RUNTIME_SIMD_DISPATCH_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::runtime::HWY_NAMESPACE {

inline int64_t DispatchedTarget() { return HWY_TARGET; }

}  // namespace qkv::runtime::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
