// float from 16-bit float bits in registers (Highway), shared by the per-target files that
// widen bf16 / f16: convert-inl.h (rows into float buffers) and attention/decode_rows-inl.h
// (cache rows widened in registers). Included by -inl.h files only, after highway.h, once per
// SIMD target; include guard toggled per target (Highway's convention).
#if defined(QKV_KERNELS_CPU_HALF_BITS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_KERNELS_CPU_HALF_BITS_INL_H_
#undef QKV_KERNELS_CPU_HALF_BITS_INL_H_
#else
#define QKV_KERNELS_CPU_HALF_BITS_INL_H_
#endif

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// float from 16-bit float bits in the low half of each 32-bit lane, exactly.
// bfloat16: the bits are a float's upper half. float16: exponent and mantissa shifted
// into place and multiplied by 2^112 (rebiasing 15 -> 127; exact, and it also turns
// f16 subnormals into f32 normals), inf/NaN given the all-ones exponent, sign ORed
// back. Written out rather than Highway's PromoteTo, whose SCALAR f16 version maps inf
// and NaN to 65536 and more (Highway 1.0.3; tests/kernels/convert_test.cc).
template <bool kF16, class D>
HWY_INLINE hn::Vec<D> FromHalfBits(D df, hn::Vec<hn::RebindToUnsigned<D>> h) {
  const hn::RebindToUnsigned<D> du;
  if constexpr (!kF16) {
    return hn::BitCast(df, hn::ShiftLeft<16>(h));
  } else {
    const auto em = hn::And(h, hn::Set(du, 0x7fffu));  // exponent and mantissa
    const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
    auto mag = hn::Mul(hn::BitCast(df, hn::ShiftLeft<13>(em)), hn::Set(df, 0x1.0p112f));
    const hn::RebindToSigned<D> di;  // Highway 1.0.3 compares unsigned lanes for equality only
    const auto special = hn::RebindMask(df, hn::Gt(hn::BitCast(di, em), hn::Set(di, 0x7bff)));  // inf or NaN
    mag = hn::IfThenElse(special, hn::Or(mag, hn::BitCast(df, hn::Set(du, 0x7f800000u))), mag);
    return hn::Or(mag, hn::BitCast(df, sign));
  }
}

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
