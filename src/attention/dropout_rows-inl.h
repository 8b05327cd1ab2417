// Per-target dropout kernel (Highway). dropout_rows.cc re-includes this file once per SIMD
// target via hwy/foreach_target.h and dispatches at run time; no other file includes it.
#if defined(QKV_ATTENTION_DROPOUT_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_DROPOUT_ROWS_INL_H_
#undef QKV_ATTENTION_DROPOUT_ROWS_INL_H_
#else
#define QKV_ATTENTION_DROPOUT_ROWS_INL_H_
#endif

#include <cmath>
#include <cstdint>

#include "hwy/highway.h"
#include "qkv/random.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::attention::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

#if HWY_TARGET != HWY_SCALAR  // one-lane vectors cannot split a u64 lane into u32 halves

// random::philox4x32's first two words for the counters in the u64 lanes of `counter`
// (each lane holds one counter; the 32-bit words live in the low halves of u64 lanes, so
// that MulEven gives the 32 x 32 -> 64 products of philox4x32's rounds).
template <class D64, class V = hn::Vec<D64>>
HWY_INLINE void Philox2(D64 d64, V counter, uint64_t seed, V& r0, V& r1) {
  const hn::Repartition<uint32_t, D64> d32;
  const V lo32 = hn::Set(d64, 0xFFFFFFFFull);
  const auto mul0 = hn::Set(d32, 0xD2511F53u), mul1 = hn::Set(d32, 0xCD9E8D57u);
  V c0 = hn::And(counter, lo32), c1 = hn::ShiftRight<32>(counter), c2 = hn::Zero(d64), c3 = hn::Zero(d64);
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const V p0 = hn::MulEven(hn::BitCast(d32, c0), mul0);  // kMul0 * c0
    const V p1 = hn::MulEven(hn::BitCast(d32, c2), mul1);  // kMul1 * c2
    const V n0 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p1), c1), hn::Set(d64, k0));
    const V n2 = hn::Xor(hn::Xor(hn::ShiftRight<32>(p0), c3), hn::Set(d64, k1));
    c1 = hn::And(p1, lo32);
    c3 = hn::And(p0, lo32);
    c0 = n0;
    c2 = n2;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  r0 = c0;
  r1 = c1;
}

// The whole vectors of row from its start (the tail is the caller's); returns where they end.
HWY_INLINE int64_t DropoutVectors(float* HWY_RESTRICT row, float* HWY_RESTRICT row2, int64_t n, uint64_t seed,
                                  uint64_t index, double p, float scale) {
  const hn::ScalableTag<uint64_t> d64;
  const hn::RebindToSigned<decltype(d64)> di64;
  const hn::Rebind<uint32_t, decltype(d64)> du32;  // as many lanes as d64, half the bytes
  const hn::Rebind<float, decltype(d64)> df;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d64));
  // uniform = bits * 2^-53 >= p  <=>  bits >= ceil(p * 2^53) (bits an integer, p * 2^53 exact)
  const double scaled = std::ceil(std::ldexp(p, 53));
  const int64_t first_kept = scaled <= 0.0 ? 0 : scaled >= 0x1.0p53 ? (int64_t{1} << 53) : static_cast<int64_t>(scaled);
  const auto vscale = hn::Set(df, scale);
  const auto below = hn::Set(di64, first_kept - 1);
  const auto bits53 = hn::Set(d64, (uint64_t{1} << 53) - 1);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::Vec<decltype(d64)> r0, r1;
    Philox2(d64, hn::Add(hn::Iota(d64, 0), hn::Set(d64, index + static_cast<uint64_t>(i))), seed, r0, r1);
    const auto bits = hn::BitCast(di64, hn::And(hn::Xor(hn::ShiftLeft<21>(r0), hn::ShiftRight<11>(r1)), bits53));
    // all ones where kept, else 0: a dropped NaN or inf weight becomes +0 (a multiply by 0 would
    // leave NaN), as the scalar definition gives
    const auto kept = hn::VecFromMask(di64, hn::Gt(bits, below));
    const auto keep_bits = hn::BitCast(df, hn::TruncateTo(du32, hn::BitCast(d64, kept)));
    hn::StoreU(hn::And(hn::Mul(hn::LoadU(df, row + i), vscale), keep_bits), df, row + i);
    if (row2) hn::StoreU(hn::And(hn::Mul(hn::LoadU(df, row2 + i), vscale), keep_bits), df, row2 + i);
  }
  return i;
}

#else

HWY_INLINE int64_t DropoutVectors(float*, float*, int64_t, uint64_t, uint64_t, double, float) { return 0; }

#endif  // HWY_TARGET != HWY_SCALAR

HWY_NOINLINE void DropoutRow(float* HWY_RESTRICT row, float* HWY_RESTRICT row2, int64_t n, uint64_t seed,
                             uint64_t index, double p, float scale) {
  for (int64_t i = DropoutVectors(row, row2, n, seed, index, p, scale); i < n; ++i) {
    const bool keep = random::dropout_keep(seed, index + static_cast<uint64_t>(i), p);
    row[i] = keep ? row[i] * scale : 0.0f;
    if (row2) row2[i] = keep ? row2[i] * scale : 0.0f;
  }
}

}  // namespace qkv::attention::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKV_ATTENTION_DROPOUT_ROWS_INL_H_ toggle
