// Runtime dispatch of the conversion kernels (convert-inl.h, compiled once per SIMD
// target here and nowhere else).
#include "kernels/cpu/hwy_targets.h"  // the target list, before any hwy/ header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/convert-inl.h"
#include "hwy/foreach_target.h"  // must come before highway.h
#include "hwy/highway.h"
#include "kernels/cpu/convert-inl.h"

#if HWY_ONCE

#include "kernels/cpu/convert.h"

namespace qkv::kernels {

static_assert(sizeof(bfloat16) == 2 && sizeof(float16) == 2, "16-bit floats are their bits");

HWY_EXPORT(WidenBf16);
HWY_EXPORT(WidenF16);
HWY_EXPORT(NarrowBf16);

void widen(const bfloat16* src, int64_t n, float* dst) {
  QKV_DYNAMIC_DISPATCH(WidenBf16)(reinterpret_cast<const uint16_t*>(src), n, dst);
}

void widen(const float16* src, int64_t n, float* dst) {
  QKV_DYNAMIC_DISPATCH(WidenF16)(reinterpret_cast<const uint16_t*>(src), n, dst);
}

void narrow(const float* src, int64_t n, bfloat16* dst) {
  QKV_DYNAMIC_DISPATCH(NarrowBf16)(src, n, reinterpret_cast<uint16_t*>(dst));
}

void narrow(const float* src, int64_t n, float16* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = float16(src[i]);
}

}  // namespace qkv::kernels

#endif  // HWY_ONCE
