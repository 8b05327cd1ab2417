// Per-target int8 value products of decode (Highway; included by decode_rows-inl.h once per
// target, after the row types and helpers it uses): o[r, c] += sum_j p[r, j] s[j, c / 16] v[j, c]
// on int8 rows v [n, dv] with bfloat16 scales s [n, dv / 16] read in place. On AVX2 / AVX-512
// with dv a multiple of 64 (PairBlock, PairPass) they are integer products over pairs of keys:
// per row and block of kValueKeys keys, w = p s is rounded to int16 in steps of the block's
// tau = max_j p[j] max_(j, g) s[j, g] / 32767, and one int16 multiply-add (vpmaddwd) takes
// w_j v_j + w_(j+1) v_(j+1) for a channel of 2 keys: 16 multiply-adds a key row where the float
// passes took 40 FMAs and multiplies. A weight moves by tau / 2 at most, its product by tau / 2
// |v| (v the int8 value): decode_rows.h states the arithmetic, DecodeInt8's tests follow it and
// bound the step's error (docs/decode.md, "int8 caches"). Other targets and head sizes, an odd
// last key and blocks with a NaN or infinite p or scale multiply in float, exactly. Include
// guard toggled per target.
#if defined(QKV_ATTENTION_DECODE_ROWS_INT8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_DECODE_ROWS_INT8_INL_H_
#undef QKV_ATTENTION_DECODE_ROWS_INT8_INL_H_
#else
#define QKV_ATTENTION_DECODE_ROWS_INT8_INL_H_
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::attention::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kValueKeys = kInt8ValueKeys;  // keys a block of the value passes (in L1 for all its passes)

#if HWY_TARGET != HWY_SCALAR
// dst[16 m + 4 t .. + 3] += out[t][4 m .. + 3] for each 128-bit block m: 4 vectors whose block m
// holds 4 channels each of the 16 channels at 16 m, back in channel order.
template <size_t N>
HWY_INLINE void AddBlocks(const float (&out)[4][N], float* dst) {
  const hn::FixedTag<float, 4> d4;
  for (size_t m = 0; m < N / 4; ++m) {
    for (size_t t = 0; t < 4; ++t) {
      float* at = dst + 16 * m + 4 * t;
      hn::StoreU(hn::Add(hn::LoadU(d4, at), hn::Load(d4, out[t] + 4 * m)), d4, at);
    }
  }
}

// o[r, c] += sum_j p[r, j] v[j, c] for NR rows and the 4 N channels [c0, c0 + 4 N) of int8 rows
// (N int32 lanes): one load of 4 N bytes split by shifts into 4 vectors, vector t lane i holding
// channel c0 + 4 i + t, scaled lane by lane (its group's scale). vpmovsxbd widening one vector
// at a time ran on Zen 4's FMA pipes beside the 16 FMAs of 4 rows, shifts and conversions do not.
// The 4 NR accumulators go back to channel order at the end (a 4 x 4 transpose per block). Keys
// [j0, j1) of n (the prefetches run ahead over all n).
template <int64_t NR>
HWY_INLINE void ValuePassInt(const float* p, int64_t ldp, const Int8Rows& v, int64_t j0, int64_t j1, int64_t n,
                             int64_t dv, int64_t c0, const TableIndices<hn::ScalableTag<float>>& idx, float* o) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  hn::Vec<decltype(df)> acc[NR][4];
  for (auto& row : acc) {
    for (auto& a : row) a = hn::Zero(df);
  }
  for (int64_t j = j0; j < j1; ++j) {
    // The first pass brings whole rows kAhead ahead; the later ones, which find their rows in L1,
    // the next block's rows kAhead ahead of where its first pass starts: memory had idled through
    // them (int8 step at 32k keys, 2 threads, interleaved in one process: -4.5% at B = 1 and 8).
    PrefetchAhead(v, j, n, c0 == 0 ? kAhead : kValueKeys + kAhead);
    const auto x = hn::LoadU(di, reinterpret_cast<const int32_t*>(v.x + j * dv + c0));
    const auto sv = hn::TableLookupLanes(ScaleBlock(df, v.scales + j * v.groups + c0 / 64 * 4), idx);
    const hn::Vec<decltype(df)> vv[4] = {hn::Mul(hn::ConvertTo(df, hn::ShiftRight<24>(hn::ShiftLeft<24>(x))), sv),
                                         hn::Mul(hn::ConvertTo(df, hn::ShiftRight<24>(hn::ShiftLeft<16>(x))), sv),
                                         hn::Mul(hn::ConvertTo(df, hn::ShiftRight<24>(hn::ShiftLeft<8>(x))), sv),
                                         hn::Mul(hn::ConvertTo(df, hn::ShiftRight<24>(x)), sv)};
    for (int64_t r = 0; r < NR; ++r) {
      const auto w = hn::Set(df, p[r * ldp + j]);
      for (int64_t t = 0; t < 4; ++t) acc[r][t] = hn::MulAdd(w, vv[t], acc[r][t]);
    }
  }
  const hn::Repartition<uint64_t, decltype(df)> d64;
  HWY_ALIGN float out[4][hn::MaxLanes(df)];  // out[t] block m: channels c0 + 16 m + 4 t .. + 3
  for (int64_t r = 0; r < NR; ++r) {
    const auto a = hn::BitCast(d64, hn::InterleaveLower(df, acc[r][0], acc[r][1]));  // 0 1 4 5 of each block
    const auto b = hn::BitCast(d64, hn::InterleaveLower(df, acc[r][2], acc[r][3]));  // 2 3 6 7
    const auto c = hn::BitCast(d64, hn::InterleaveUpper(df, acc[r][0], acc[r][1]));  // 8 9 12 13
    const auto e = hn::BitCast(d64, hn::InterleaveUpper(df, acc[r][2], acc[r][3]));  // 10 11 14 15
    hn::Store(hn::BitCast(df, hn::InterleaveLower(d64, a, b)), df, out[0]);
    hn::Store(hn::BitCast(df, hn::InterleaveUpper(d64, a, b)), df, out[1]);
    hn::Store(hn::BitCast(df, hn::InterleaveLower(d64, c, e)), df, out[2]);
    hn::Store(hn::BitCast(df, hn::InterleaveUpper(d64, c, e)), df, out[3]);
    AddBlocks(out, o + r * dv + c0);
  }
}

// The float passes over keys [j0, j1) (a block of kValueKeys at most: in L1 for all its passes;
// passes over a whole chunk left memory idle during the later passes, which read the rows back from L2).
template <int64_t NR>
HWY_INLINE void ValueBlockInt(const float* p, int64_t ldp, const Int8Rows& v, int64_t j0, int64_t j1, int64_t n,
                              int64_t dv, float* o) {
  const hn::ScalableTag<float> df;
  const int64_t step = 4 * static_cast<int64_t>(hn::Lanes(df));
  for (int64_t c = 0; c < dv; c += step) {
    HWY_ALIGN int32_t lanes[hn::MaxLanes(df)];  // lane i: group (c % 64) / 16 + i / 4 of c's block
    for (int64_t i = 0; i < step / 4; ++i) lanes[i] = static_cast<int32_t>(c % 64 / kGroup + i / 4);
    ValuePassInt<NR>(p, ldp, v, j0, j1, n, dv, c, hn::SetTableIndices(df, lanes), o);
  }
}

#if QKV_HWY_AVX2_OR_AVX512
constexpr int64_t kPairGroups = 32;  // the pair path's largest dv / 16 (its weights on the stack)

// The int16 weights of NR rows for the m pairs of keys from j0: wt[(q NR + r) G + g] holds, as two
// int16 lanes, w = round(pw[r, 2 q] s[j, g]) of key j = j0 + 2 q (low) and of key j + 1 (high),
// pw = p / tau (each w in [0, 32767]); g over the G = v.groups groups, DG lanes at a time.
template <int64_t NR, class DG>
HWY_INLINE void PairWeights(DG dg, const float* pw, const Int8Rows& v, int64_t j0, int64_t m, int32_t* wt) {
  const hn::RebindToSigned<DG> di;
  const hn::RebindToUnsigned<DG> du;
  const hn::Rebind<uint16_t, DG> d16;
  const int64_t groups = v.groups, lanes = static_cast<int64_t>(hn::Lanes(dg));
  const auto magic = hn::Set(dg, 8388608.0f);  // 2^23: its ulp is 1
  const auto low = hn::Set(di, 0xFFFF);
  for (int64_t q = 0; q < m; ++q) {
    const uint16_t* s0 = v.scales + (j0 + 2 * q) * groups;  // key j's scales, then key j + 1's
    for (int64_t g = 0; g < groups; g += lanes) {
      const auto a = hn::BitCast(dg, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, s0 + g))));  // bf16 bits
      const auto b = hn::BitCast(dg, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, s0 + groups + g))));
      for (int64_t r = 0; r < NR; ++r) {  // bits of 2^23 + w: w in the low 23 (the FMA rounds p s once)
        const auto w0 = hn::BitCast(di, hn::MulAdd(hn::Set(dg, pw[r * kValueKeys + 2 * q]), a, magic));
        const auto w1 = hn::BitCast(di, hn::MulAdd(hn::Set(dg, pw[r * kValueKeys + 2 * q + 1]), b, magic));
        hn::StoreU(hn::Or(hn::And(w0, low), hn::ShiftLeft<16>(w1)), di, wt + (q * NR + r) * groups + g);
      }
    }
  }
}

// o[r, c] += tau[r] sum_q (w_j v[j, c] + w_(j+1) v[j + 1, c]) (j = j0 + 2 q) over the channels
// [c0, c0 + 4 N) (N int32 lanes; a 128-bit block a group): each row's bytes split by shifts into
// its even and odd channels (SplitBytes), the two keys' int16 lanes interleaved into pairs (4
// vectors: channels 16 b + 2 i, 16 b + 8 + 2 i, then + 1, in lane i of block b), and one
// vpmaddwd a vector and row with the pair's weights of block b's group (a lookup of 4 of wt). A
// key row costs 16 multiply-adds and 16 integer adds for 4 rows of 128 channels where the float
// passes took 32 FMAs and 8 scale multiplies, all on Zen 4's two FMA pipes; the int32 sums of a
// block (at most kValueKeys 127 32767 < 2^31) are converted and scaled once.
template <int64_t NR>
HWY_INLINE void PairPass(const int32_t* wt, const Int8Rows& v, int64_t j0, int64_t m, int64_t n, int64_t dv, int64_t c0,
                         const float* tau, float* o) {
  const hn::ScalableTag<int32_t> di;
  const hn::Repartition<int16_t, decltype(di)> dw;
  const hn::RebindToFloat<decltype(di)> df;
  HWY_ALIGN int32_t lanes[hn::MaxLanes(di)];  // lane i: group i / 4 of those from c0
  for (size_t i = 0; i < hn::Lanes(di); ++i) lanes[i] = static_cast<int32_t>(i / 4);
  const auto idx = hn::SetTableIndices(di, lanes);
  hn::Vec<decltype(di)> acc[NR][4], acc1[NR][4];
  for (int64_t r = 0; r < NR; ++r) {
    for (int64_t t = 0; t < 4; ++t) acc[r][t] = acc1[r][t] = hn::Zero(di);
  }
  const int32_t* w = wt + c0 / kGroup;
  // the next block's scales, 64 bytes a pair, when it is in this run
  const uint16_t* next_scales = v.scales + std::min(n, j0 + kValueKeys) * v.groups;
  const uint16_t* scales_end = v.scales + std::min(n, j0 + 2 * kValueKeys) * v.groups;
  for (int64_t q = 0; q < m; ++q, w += NR * v.groups) {
    const int64_t j = j0 + 2 * q;
    if (c0 == 0) {  // the first pass brings whole rows, and the next block's scales (PairBlock reads them first)
      PrefetchAhead(v, j, n), PrefetchAhead(v, j + 1, n);
      if (next_scales < scales_end) hwy::Prefetch(next_scales), next_scales += 32;
    } else {  // later passes run from L1: they prefetch the next block's rows (ValuePassInt)
      PrefetchAhead(v, j, n, kValueKeys + kAhead), PrefetchAhead(v, j + 1, n, kValueKeys + kAhead);
    }
    hn::Vec<decltype(dw)> e0, o0, e1, o1;
    SplitBytes(hn::LoadU(dw, reinterpret_cast<const int16_t*>(v.x + j * dv + c0)), e0, o0);
    SplitBytes(hn::LoadU(dw, reinterpret_cast<const int16_t*>(v.x + (j + 1) * dv + c0)), e1, o1);
    const hn::Vec<decltype(dw)> x[4] = {hn::InterleaveLower(dw, e0, e1), hn::InterleaveUpper(dw, e0, e1),
                                        hn::InterleaveLower(dw, o0, o1), hn::InterleaveUpper(dw, o0, o1)};
    for (int64_t r = 0; r < NR; ++r) {
      const auto wr = hn::BitCast(dw, hn::TableLookupLanes(hn::LoadU(di, w + r * v.groups), idx));
      for (int64_t t = 0; t < 4; ++t) acc[r][t] = hn::ReorderWidenMulAccumulate(di, x[t], wr, acc[r][t], acc1[r][t]);
    }
  }
  HWY_ALIGN float out[4][hn::MaxLanes(df)];  // out[t] block b: channels c0 + 16 b + 4 t .. + 3
  for (int64_t r = 0; r < NR; ++r) {
    hn::Vec<decltype(df)> f[4];
    for (int64_t t = 0; t < 4; ++t) {
      f[t] = hn::Mul(hn::ConvertTo(df, hn::RearrangeToOddPlusEven(acc[r][t], acc1[r][t])), hn::Set(df, tau[r]));
    }
    hn::Store(hn::InterleaveLower(df, f[0], f[2]), df, out[0]);  // 16 b + 0 .. 3
    hn::Store(hn::InterleaveUpper(df, f[0], f[2]), df, out[1]);  // 4 .. 7
    hn::Store(hn::InterleaveLower(df, f[1], f[3]), df, out[2]);  // 8 .. 11
    hn::Store(hn::InterleaveUpper(df, f[1], f[3]), df, out[3]);  // 12 .. 15
    AddBlocks(out, o + r * dv + c0);
  }
}

// The largest of n bfloat16 scales (their bits: positive, ordered as integers; NaN above inf).
HWY_INLINE float MaxScale(const uint16_t* s, int64_t n) {
  const hn::ScalableTag<uint16_t> d16;
  const auto lanes = static_cast<int64_t>(hn::Lanes(d16));
  auto big = hn::Zero(d16);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) big = hn::Max(big, hn::LoadU(d16, s + i));
  uint16_t bits = hn::GetLane(hn::MaxOfLanes(d16, big));
  for (; i < n; ++i) bits = std::max(bits, s[i]);
  return static_cast<float>(bfloat16::from_bits(bits));
}

// Keys [j0, j1) of n for NR rows by PairPass: per row tau = max_j p max s / 32767 over the block,
// pw = p / tau, the weights, the passes; an odd last key by the float pass. False (nothing
// done) when some p or scale is not finite, or a scale negative (its bits would be the largest):
// the float passes keep their NaN and inf.
template <int64_t NR>
HWY_INLINE bool PairBlock(const float* p, int64_t ldp, const Int8Rows& v, int64_t j0, int64_t j1, int64_t n, int64_t dv,
                          float* o) {
  const hn::ScalableTag<float> df;
  const int64_t keys = j1 - j0, m = keys / 2, lanes = static_cast<int64_t>(hn::Lanes(df));
  const float smax = MaxScale(v.scales + j0 * v.groups, keys * v.groups);
  HWY_ALIGN float pw[NR * kValueKeys], tau[NR];
  for (int64_t r = 0; r < NR; ++r) {
    const float* pr = p + r * ldp + j0;
    auto vmax = hn::Zero(df), vsum = hn::Zero(df);
    int64_t x = 0;
    for (; x + lanes <= keys; x += lanes)
      vmax = hn::Max(vmax, hn::LoadU(df, pr + x)), vsum = hn::Add(vsum, hn::LoadU(df, pr + x));
    float pmax = hn::GetLane(hn::MaxOfLanes(df, vmax)), sum = hn::GetLane(hn::SumOfLanes(df, vsum));
    for (; x < keys; ++x) pmax = std::max(pmax, pr[x]), sum += pr[x];
    const float big = pmax * smax;  // the block's largest p s, up to a scale's
    if (!std::isfinite(big) || !std::isfinite(sum) || smax < 0.0f)
      return false;  // a negative scale: only loaded states
    tau[r] = big / 32767.0f;
    const float inv = big > 0.0f ? 32767.0f / big : 0.0f;
    for (x = 0; x + lanes <= keys; x += lanes)
      hn::Store(hn::Mul(hn::LoadU(df, pr + x), hn::Set(df, inv)), df, pw + r * kValueKeys + x);
    for (; x < keys; ++x) pw[r * kValueKeys + x] = pr[x] * inv;
  }
  HWY_ALIGN int32_t wt[kValueKeys / 2 * NR * kPairGroups + 16];  // + 16: PairPass loads a vector from each group
  if (v.groups % 8 == 0) {
    PairWeights<NR>(hn::FixedTag<float, 8>(), pw, v, j0, m, wt);
  } else {
    PairWeights<NR>(hn::FixedTag<float, 4>(), pw, v, j0, m, wt);
  }
  std::fill(wt + m * NR * v.groups, wt + m * NR * v.groups + 16, 0);  // past the last weights PairPass loads
  const int64_t step = 4 * static_cast<int64_t>(hn::Lanes(df));
  for (int64_t c = 0; c < dv; c += step) PairPass<NR>(wt, v, j0, m, n, dv, c, tau, o);
  if (2 * m < keys) ValueBlockInt<NR>(p, ldp, v, j1 - 1, j1, n, dv, o);
  return true;
}
#endif

// int8 value rows, dv a multiple of 64: blocks of kValueKeys keys, integer pairs where they can.
template <int64_t NR>
HWY_INLINE void ValueRowsPairs(const float* p, int64_t ldp, const Int8Rows& v, int64_t n, int64_t dv, float* o) {
  for (int64_t j0 = 0; j0 < n; j0 += kValueKeys) {
    const int64_t j1 = std::min(n, j0 + kValueKeys);
#if QKV_HWY_AVX2_OR_AVX512
    if (v.groups <= kPairGroups && PairBlock<NR>(p, ldp, v, j0, j1, n, dv, o)) continue;
#endif
    ValueBlockInt<NR>(p, ldp, v, j0, j1, n, dv, o);
  }
}
#endif

void Int8Values(const float* p, int64_t ldp, int64_t rows, const int8_t* v, const uint16_t* vs, int64_t n, int64_t dv,
                const int8_t* next, float* o) {
  const Int8Rows values{v, vs, dv, Groups(dv), next};
#if HWY_TARGET != HWY_SCALAR
  if (dv % 64 == 0) {
    int64_t r = 0;
    for (; r + kRows <= rows; r += kRows) ValueRowsPairs<kRows>(p + r * ldp, ldp, values, n, dv, o + r * dv);
    for (; r < rows; ++r) ValueRowsPairs<1>(p + r * ldp, ldp, values, n, dv, o + r * dv);
    return;
  }
#endif
  Values(p, ldp, rows, values, n, dv, o);
}

}  // namespace qkv::attention::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
