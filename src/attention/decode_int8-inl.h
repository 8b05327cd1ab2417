// Per-target int8 decode kernels (Highway): Q K^T and P V read the int8 cache rows in place,
// dequantizing each group of KVCache::kInt8Group channels in registers (decode_int8.h). The
// scalar loop that widened each chunk into scratch before two f32 GEMMs read int8 at 6.5 GB/s
// (docs/decode.md). decode_int8.cc re-includes this file once per SIMD target via
// hwy/foreach_target.h; no other file includes it. Include guard toggled per target.
#if defined(QKV_ATTENTION_DECODE_INT8_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_DECODE_INT8_INL_H_
#undef QKV_ATTENTION_DECODE_INT8_INL_H_
#else
#define QKV_ATTENTION_DECODE_INT8_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "qkv/kv_cache.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::attention::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kGroup = KVCache::kInt8Group;  // channels per scale
constexpr int64_t kRows = 4;                     // query rows per pass: each int8 vector feeds kRows FMAs
constexpr int64_t kAhead = 16;                   // rows prefetched ahead

// int8 lanes [p, p + N) as floats.
template <class D>
HWY_INLINE hn::Vec<D> LoadInt8(D df, const int8_t* p) {
  const hn::RebindToSigned<D> di;
  const hn::Rebind<int8_t, D> d8;
  return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, p)));
}

// The lane sums of a, b, c and d (one query row's products with one key each) into out[0..3]:
// on AVX2 and AVX-512 with interleaves and one block reduction (13 operations where four
// SumOfLanes took 32: the reductions had been a third of the scores' time), else lane by lane.
template <class D, class V>
HWY_INLINE void Sum4(D df, V a, V b, V c, V d, float* out) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2
  const hn::Repartition<uint64_t, D> d64;
  const auto ab = hn::Add(hn::InterleaveLower(df, a, b), hn::InterleaveUpper(df, a, b));  // a b a b per block
  const auto cd = hn::Add(hn::InterleaveLower(df, c, d), hn::InterleaveUpper(df, c, d));  // c d c d
  const auto lo = hn::InterleaveLower(d64, hn::BitCast(d64, ab), hn::BitCast(d64, cd));
  const auto hi = hn::InterleaveUpper(d64, hn::BitCast(d64, ab), hn::BitCast(d64, cd));
  const auto blocks = hn::Add(hn::BitCast(df, lo), hn::BitCast(df, hi));  // a b c d per 128-bit block
  const hn::Half<D> dh;
  const auto half = hn::Add(hn::LowerHalf(dh, blocks), hn::UpperHalf(dh, blocks));
#if HWY_TARGET == HWY_AVX3
  const hn::Half<decltype(dh)> dq;
  hn::StoreU(hn::Add(hn::LowerHalf(dq, half), hn::UpperHalf(dq, half)), dq, out);
#else
  hn::StoreU(half, dh, out);
#endif
#else
  const V v[4] = {a, b, c, d};
  for (int i = 0; i < 4; ++i) out[i] = hn::GetLane(hn::SumOfLanes(df, v[i]));
#endif
}

// Scores of NR query rows against keys [n, d]: s[r, j] = scale (sum_g ks[j, g] (qs[r] . k[j])_g + qc[r]).
template <int64_t NR>
HWY_INLINE void ScoreRows(const float* qs, const float* qc, const int8_t* k, const float* ks, int64_t n, int64_t d,
                          float scale, float* s, int64_t lds) {
  const hn::ScalableTag<float> df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t groups = (d + kGroup - 1) / kGroup;
  // whole vectors within one group each (lanes divide 16 on every target); the rest lane by lane
  const int64_t whole = lanes <= kGroup ? d / lanes * lanes : 0;
  for (int64_t j = 0; j < n; ++j) {
    const int8_t* kj = k + j * d;       // [D]
    const float* sj = ks + j * groups;  // [groups]
    if (j + kAhead < n) {
      for (int64_t c = 0; c < d; c += 64) hwy::Prefetch(kj + kAhead * d + c);
    }
    hn::Vec<decltype(df)> acc[NR];
    float tail[NR] = {};
    for (int64_t r = 0; r < NR; ++r) acc[r] = hn::Zero(df);
    for (int64_t c = 0; c < whole; c += lanes) {
      const auto kv = hn::Mul(LoadInt8(df, kj + c), hn::Set(df, sj[c / kGroup]));  // without r and c
      for (int64_t r = 0; r < NR; ++r) acc[r] = hn::MulAdd(hn::LoadU(df, qs + r * d + c), kv, acc[r]);
    }
    for (int64_t c = whole; c < d; ++c) {
      for (int64_t r = 0; r < NR; ++r) tail[r] += qs[r * d + c] * (static_cast<float>(kj[c]) * sj[c / kGroup]);
    }
    float sums[4];
    if constexpr (NR == 4) {
      Sum4(df, acc[0], acc[1], acc[2], acc[3], sums);
    } else {
      for (int64_t r = 0; r < NR; ++r) sums[r] = hn::GetLane(hn::SumOfLanes(df, acc[r]));
    }
    for (int64_t r = 0; r < NR; ++r) s[r * lds + j] = scale * (sums[r] + tail[r] + qc[r]);
  }
}

void Int8Scores(const float* qs, const float* qc, int64_t rows, const int8_t* k, const float* ks, int64_t n, int64_t d,
                float scale, float* s, int64_t lds) {
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) ScoreRows<kRows>(qs + r * d, qc + r, k, ks, n, d, scale, s + r * lds, lds);
  for (; r < rows; ++r) ScoreRows<1>(qs + r * d, qc + r, k, ks, n, d, scale, s + r * lds, lds);
}

// o[r, c] += sum_j p[r, j] vs[j, c / 16] v[j, c] for NR rows and the channels [c0, c0 + V lanes):
// NR x V accumulators stay in registers across the keys (the chunk's rows stay in L2).
template <int64_t NR, int64_t V>
HWY_INLINE void ValuePass(const float* p, int64_t ldp, const int8_t* v, const float* vs, int64_t n, int64_t dv,
                          int64_t c0, float* o) {
  const hn::ScalableTag<float> df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t groups = (dv + kGroup - 1) / kGroup;
  hn::Vec<decltype(df)> acc[NR][V];
  for (int64_t r = 0; r < NR; ++r) {
    for (int64_t x = 0; x < V; ++x) acc[r][x] = hn::Zero(df);
  }
  for (int64_t j = 0; j < n; ++j) {
    const int8_t* vj = v + j * dv + c0;
    const float* sj = vs + j * groups;
    if (c0 == 0 && j + kAhead < n) {  // the first pass brings whole rows: later passes find them in cache
      for (int64_t c = 0; c < dv; c += 64) hwy::Prefetch(v + (j + kAhead) * dv + c);
    }
    hn::Vec<decltype(df)> vv[V];
    for (int64_t x = 0; x < V; ++x)
      vv[x] = hn::Mul(LoadInt8(df, vj + x * lanes), hn::Set(df, sj[(c0 + x * lanes) / kGroup]));
    for (int64_t r = 0; r < NR; ++r) {
      const auto w = hn::Set(df, p[r * ldp + j]);
      for (int64_t x = 0; x < V; ++x) acc[r][x] = hn::MulAdd(w, vv[x], acc[r][x]);
    }
  }
  for (int64_t r = 0; r < NR; ++r) {
    for (int64_t x = 0; x < V; ++x) {
      float* out = o + r * dv + c0 + x * lanes;
      hn::StoreU(hn::Add(hn::LoadU(df, out), acc[r][x]), df, out);
    }
  }
}

// NR rows: passes of 4 vectors (64 channels, four groups, on AVX-512: two passes over a chunk for
// D = 128, 16 accumulators), then single vectors, then the channels left lane by lane.
template <int64_t NR>
HWY_INLINE void ValueRows(const float* p, int64_t ldp, const int8_t* v, const float* vs, int64_t n, int64_t dv,
                          float* o) {
  const hn::ScalableTag<float> df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t groups = (dv + kGroup - 1) / kGroup;
  int64_t c = 0;
  if (lanes <= kGroup) {  // a vector never straddles two groups
    for (; c + 4 * lanes <= dv; c += 4 * lanes) ValuePass<NR, 4>(p, ldp, v, vs, n, dv, c, o);
    for (; c + lanes <= dv; c += lanes) ValuePass<NR, 1>(p, ldp, v, vs, n, dv, c, o);
  }
  for (; c < dv; ++c) {
    for (int64_t j = 0; j < n; ++j) {
      const float vc = static_cast<float>(v[j * dv + c]) * vs[j * groups + c / kGroup];
      for (int64_t r = 0; r < NR; ++r) o[r * dv + c] += p[r * ldp + j] * vc;
    }
  }
}

void Int8Values(const float* p, int64_t ldp, int64_t rows, const int8_t* v, const float* vs, int64_t n, int64_t dv,
                float* o) {
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) ValueRows<kRows>(p + r * ldp, ldp, v, vs, n, dv, o + r * dv);
  for (; r < rows; ++r) ValueRows<1>(p + r * ldp, ldp, v, vs, n, dv, o + r * dv);
}

}  // namespace qkv::attention::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
