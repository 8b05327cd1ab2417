// Per-target conversions between float and the 16-bit float types (Highway).
// convert_cpu.cc re-includes this file once per SIMD target via hwy/foreach_target.h
// and dispatches at run time; no other file includes it. Include guard toggled per
// target (Highway's convention), so the body is compiled once for each of them.
#if defined(QKV_KERNELS_CPU_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_KERNELS_CPU_CONVERT_INL_H_
#undef QKV_KERNELS_CPU_CONVERT_INL_H_
#else
#define QKV_KERNELS_CPU_CONVERT_INL_H_
#endif

#include <cstdint>

#include "hwy/highway.h"
#include "kernels/cpu/half_bits-inl.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// FromHalfBits: kernels/cpu/half_bits-inl.h.

// dst[i] = float(src[i]) for 16-bit floats stored as uint16 bits: exact, so every
// target gives the same values.
template <bool kF16>
HWY_INLINE void WidenT(const uint16_t* HWY_RESTRICT src, int64_t n, float* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint16_t, decltype(df)> d16;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  auto widen = [&](hn::Vec<decltype(d16)> h) { return FromHalfBits<kF16>(df, hn::PromoteTo(du, h)); };
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(widen(hn::LoadU(d16, src + i)), df, dst + i);
  if (i < n) {  // the tail through padded buffers: no load or store past the row
    HWY_ALIGN uint16_t in[HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN float out[HWY_MAX_BYTES / sizeof(float)];
    for (int64_t j = 0; i + j < n; ++j) in[j] = src[i + j];
    hn::Store(widen(hn::Load(d16, in)), df, out);
    for (int64_t j = 0; i + j < n; ++j) dst[i + j] = out[j];
  }
}

HWY_NOINLINE void WidenBf16(const uint16_t* HWY_RESTRICT src, int64_t n, float* HWY_RESTRICT dst) {
  WidenT<false>(src, n, dst);
}

HWY_NOINLINE void WidenF16(const uint16_t* HWY_RESTRICT src, int64_t n, float* HWY_RESTRICT dst) {
  WidenT<true>(src, n, dst);
}

// bfloat16 bits of v rounded to nearest even, NaN kept NaN (quieted), as qkv::bfloat16's
// constructor does (Highway's DemoteTo to bfloat16 truncates). Result in the low half
// of each 32-bit lane.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> Bf16Bits(D /*df*/, hn::Vec<D> v) {
  const hn::RebindToUnsigned<D> du;
  const auto u = hn::BitCast(du, v);
  const auto lsb = hn::And(hn::ShiftRight<16>(u), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<16>(hn::Add(u, hn::Add(hn::Set(du, 0x7fffu), lsb)));
  const auto quiet = hn::Or(hn::ShiftRight<16>(u), hn::Set(du, 0x40u));
  return hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, rounded);
}

// dst[i] = bfloat16(src[i]), round to nearest even.
HWY_NOINLINE void NarrowBf16(const float* HWY_RESTRICT src, int64_t n, uint16_t* HWY_RESTRICT dst) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint16_t, decltype(df)> d16;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(df));
  // The bits are <= 0xffff, so the saturating i32 -> u16 demotion keeps them as they are.
  auto narrow = [&](hn::Vec<decltype(df)> v) { return hn::DemoteTo(d16, hn::BitCast(di, Bf16Bits(df, v))); };
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(narrow(hn::LoadU(df, src + i)), d16, dst + i);
  if (i < n) {
    HWY_ALIGN float in[HWY_MAX_BYTES / sizeof(float)] = {};
    HWY_ALIGN uint16_t out[HWY_MAX_BYTES / sizeof(float)];
    for (int64_t j = 0; i + j < n; ++j) in[j] = src[i + j];
    hn::Store(narrow(hn::Load(df, in)), d16, out);
    for (int64_t j = 0; i + j < n; ++j) dst[i + j] = out[j];
  }
}

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
