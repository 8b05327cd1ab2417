// Per-target body of fma_peak.cc: chains of float32 multiply-adds with nothing else in the
// loop, the most FMAs a core issues. fma_peak.cc re-includes this file once per SIMD target via
// hwy/foreach_target.h; no other file includes it. Include guard toggled per target (Highway's
// convention).
#if defined(QKV_RUNTIME_FMA_PEAK_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_RUNTIME_FMA_PEAK_INL_H_
#undef QKV_RUNTIME_FMA_PEAK_INL_H_
#else
#define QKV_RUNTIME_FMA_PEAK_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::runtime::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// detail::kFmaChains (12) independent chains a_c <- a_c * x + y (a_c starting at c, every lane
// alike), `steps` multiply-adds each; ends[c] = a_c's lane 0 afterwards. Returns the float32 lanes of
// one vector. Twelve chains: an FMA's result is ready 4 cycles later on the CPUs here, and two
// FMA pipes (Sapphire Rapids' two 512-bit ones, Zen 4's two 256-bit ones that run 512-bit
// vectors in halves) need 8 in flight to stay busy; 12 accumulators and 2 constants also fit
// AVX2's 16 registers, so no chain spills. Starting values differ so that the compiler cannot
// fold identical chains into one.
inline int64_t FmaChains(int64_t steps, float x, float y, float* ends) {
  const hn::ScalableTag<float> d;
  const auto vx = hn::Set(d, x);
  const auto vy = hn::Set(d, y);
  auto a0 = hn::Set(d, 0.0f), a1 = hn::Set(d, 1.0f), a2 = hn::Set(d, 2.0f), a3 = hn::Set(d, 3.0f);
  auto a4 = hn::Set(d, 4.0f), a5 = hn::Set(d, 5.0f), a6 = hn::Set(d, 6.0f), a7 = hn::Set(d, 7.0f);
  auto a8 = hn::Set(d, 8.0f), a9 = hn::Set(d, 9.0f), a10 = hn::Set(d, 10.0f), a11 = hn::Set(d, 11.0f);
  for (int64_t i = 0; i < steps; ++i) {
    a0 = hn::MulAdd(a0, vx, vy), a1 = hn::MulAdd(a1, vx, vy), a2 = hn::MulAdd(a2, vx, vy);
    a3 = hn::MulAdd(a3, vx, vy), a4 = hn::MulAdd(a4, vx, vy), a5 = hn::MulAdd(a5, vx, vy);
    a6 = hn::MulAdd(a6, vx, vy), a7 = hn::MulAdd(a7, vx, vy), a8 = hn::MulAdd(a8, vx, vy);
    a9 = hn::MulAdd(a9, vx, vy), a10 = hn::MulAdd(a10, vx, vy), a11 = hn::MulAdd(a11, vx, vy);
  }
  ends[0] = hn::GetLane(a0), ends[1] = hn::GetLane(a1), ends[2] = hn::GetLane(a2), ends[3] = hn::GetLane(a3);
  ends[4] = hn::GetLane(a4), ends[5] = hn::GetLane(a5), ends[6] = hn::GetLane(a6), ends[7] = hn::GetLane(a7);
  ends[8] = hn::GetLane(a8), ends[9] = hn::GetLane(a9), ends[10] = hn::GetLane(a10), ends[11] = hn::GetLane(a11);
  return static_cast<int64_t>(hn::Lanes(d));
}

}  // namespace qkv::runtime::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
