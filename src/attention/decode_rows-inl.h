// Per-target decode kernels (Highway) on cache rows in place: Q K^T and P V read int8 rows,
// dequantizing each group of KVCache::kInt8Group channels in registers, and bf16 / f16 rows,
// widened to float32 in registers (decode_rows.h); float32 accumulation throughout. One loop
// per product, templated over a row type (Int8Rows, HalfRows) that loads lanes of a row as
// floats. The int8 scalar loop that widened each chunk into scratch before two f32 GEMMs read
// int8 at 6.5 GB/s, the bf16 widening at 73-78% of memcpy (docs/decode.md). decode_rows.cc
// re-includes this file once per SIMD target via hwy/foreach_target.h; no other file includes
// it. Include guard toggled per target.
#if defined(QKV_ATTENTION_DECODE_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_DECODE_ROWS_INL_H_
#undef QKV_ATTENTION_DECODE_ROWS_INL_H_
#else
#define QKV_ATTENTION_DECODE_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstdint>

#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/cpu/half_bits-inl.h"
#include "qkv/kv_cache.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::attention::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kGroup = KVCache::kInt8Group;  // channels per scale
constexpr int64_t kRows = 4;                     // query rows per pass: each row vector loaded feeds kRows FMAs
constexpr int64_t kAhead = 16;                   // rows prefetched ahead

// int8 lanes [p, p + N) as floats.
template <class D>
HWY_INLINE hn::Vec<D> LoadInt8(D df, const int8_t* p) {
  const hn::RebindToSigned<D> di;
  const hn::Rebind<int8_t, D> d8;
  return hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, p)));
}

// Row types: Load(df, j, c) is lanes [c, c + N) of row j as floats, At(j, c) one of them,
// Row(j) row j's first byte and `next` the next run's first row (null: none; both for
// prefetches), kBytes a row's size per channel, Vectors(lanes) whether whole vectors may be
// loaded (int8: when a vector never straddles two groups).

// int8 rows [n, d] with a scale per row and group of kGroup channels (scales [n, groups]).
struct Int8Rows {
  const int8_t* x;
  const float* scales;
  int64_t d, groups;
  const void* next;
  static constexpr int64_t kBytes = 1;
  static bool Vectors(int64_t lanes) { return lanes <= kGroup; }
  const void* Row(int64_t j) const { return x + j * d; }
  template <class D>
  HWY_INLINE hn::Vec<D> Load(D df, int64_t j, int64_t c) const {
    return hn::Mul(LoadInt8(df, x + j * d + c), hn::Set(df, scales[j * groups + c / kGroup]));
  }
  float At(int64_t j, int64_t c) const { return static_cast<float>(x[j * d + c]) * scales[j * groups + c / kGroup]; }
};

// bf16 (kF16 false) or f16 rows [n, d] as their bits, widened exactly. f16 through F16C's
// conversion on AVX2 / AVX-512 (PromoteTo; exact, inf and NaN kept), else FromHalfBits.
template <bool kF16>
struct HalfRows {
  const uint16_t* x;
  int64_t d;
  const void* next;
  static constexpr int64_t kBytes = 2;
  static bool Vectors(int64_t) { return true; }
  const void* Row(int64_t j) const { return x + j * d; }
  template <class D>
  HWY_INLINE hn::Vec<D> Load(D df, int64_t j, int64_t c) const {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX2
    if constexpr (kF16) {
      const hn::Rebind<hwy::float16_t, D> dh;
      return hn::PromoteTo(df, hn::LoadU(dh, reinterpret_cast<const hwy::float16_t*>(x + j * d + c)));
    }
#endif
    const hn::RebindToUnsigned<D> du;
    const hn::Rebind<uint16_t, D> d16;
    return kernels::HWY_NAMESPACE::FromHalfBits<kF16>(df, hn::PromoteTo(du, hn::LoadU(d16, x + j * d + c)));
  }
  float At(int64_t j, int64_t c) const {
    return kF16 ? static_cast<float>(float16::from_bits(x[j * d + c]))
                : static_cast<float>(bfloat16::from_bits(x[j * d + c]));
  }
};

// Prefetches (all cache lines of) row j + kAhead of a run of n rows, or past its end the
// next run's row j + kAhead - n: runs of a paged cache are a page long (16 rows in vLLM's
// default), shorter than the prefetch distance, and ran at half speed without it. A next run
// shorter than that prefetches rows past it: harmless, prefetches do not fault.
template <class R>
HWY_INLINE void PrefetchAhead(const R& rows, int64_t j, int64_t n) {
  const int64_t a = j + kAhead, bytes = rows.d * R::kBytes;
  const char* p = a < n ? static_cast<const char*>(rows.Row(a))
                        : (rows.next ? static_cast<const char*>(rows.next) + (a - n) * bytes : nullptr);
  if (p == nullptr) return;
  for (int64_t c = 0; c < bytes; c += 64) hwy::Prefetch(p + c);
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

// Scores of NR query rows against keys [n, d]: s[r, j] = scale (qs[r] . k[j] + qc[r]) (qc null: 0).
template <int64_t NR, class R>
HWY_INLINE void ScoreRows(const float* qs, const float* qc, const R& k, int64_t n, int64_t d, float scale, float* s,
                          int64_t lds) {
  const hn::ScalableTag<float> df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t whole = R::Vectors(lanes) ? d / lanes * lanes : 0;  // whole vectors; the rest lane by lane
  float add[NR];
  for (int64_t r = 0; r < NR; ++r) add[r] = qc ? qc[r] : 0.0f;
  for (int64_t j = 0; j < n; ++j) {
    PrefetchAhead(k, j, n);
    hn::Vec<decltype(df)> acc[NR];
    float tail[NR] = {};
    for (int64_t r = 0; r < NR; ++r) acc[r] = hn::Zero(df);
    for (int64_t c = 0; c < whole; c += lanes) {
      const auto kv = k.Load(df, j, c);  // without r and c
      for (int64_t r = 0; r < NR; ++r) acc[r] = hn::MulAdd(hn::LoadU(df, qs + r * d + c), kv, acc[r]);
    }
    for (int64_t c = whole; c < d; ++c) {
      for (int64_t r = 0; r < NR; ++r) tail[r] += qs[r * d + c] * k.At(j, c);
    }
    float sums[4];
    if constexpr (NR == 4) {
      Sum4(df, acc[0], acc[1], acc[2], acc[3], sums);
    } else {
      for (int64_t r = 0; r < NR; ++r) sums[r] = hn::GetLane(hn::SumOfLanes(df, acc[r]));
    }
    for (int64_t r = 0; r < NR; ++r) s[r * lds + j] = scale * (sums[r] + tail[r] + add[r]);
  }
}

template <class R>
HWY_INLINE void Scores(const float* qs, const float* qc, int64_t rows, const R& k, int64_t n, int64_t d, float scale,
                       float* s, int64_t lds) {
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    ScoreRows<kRows>(qs + r * d, qc ? qc + r : nullptr, k, n, d, scale, s + r * lds, lds);
  }
  for (; r < rows; ++r) ScoreRows<1>(qs + r * d, qc ? qc + r : nullptr, k, n, d, scale, s + r * lds, lds);
}

// o[r, c] += sum_j p[r, j] v[j, c] for NR rows and the channels [c0, c0 + V lanes):
// NR x V accumulators stay in registers across the keys (the chunk's rows stay in L2).
template <int64_t NR, int64_t V, class R>
HWY_INLINE void ValuePass(const float* p, int64_t ldp, const R& v, int64_t n, int64_t dv, int64_t c0, float* o) {
  const hn::ScalableTag<float> df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<decltype(df)> acc[NR][V];
  for (int64_t r = 0; r < NR; ++r) {
    for (int64_t x = 0; x < V; ++x) acc[r][x] = hn::Zero(df);
  }
  for (int64_t j = 0; j < n; ++j) {
    // the first pass brings whole rows: later passes find them in cache
    if (c0 == 0) PrefetchAhead(v, j, n);
    hn::Vec<decltype(df)> vv[V];
    for (int64_t x = 0; x < V; ++x) vv[x] = v.Load(df, j, c0 + x * lanes);
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

// NR rows: passes of 4 vectors (64 channels on AVX-512: two passes over a chunk for D = 128,
// 16 accumulators), then single vectors, then the channels left lane by lane.
template <int64_t NR, class R>
HWY_INLINE void ValueRows(const float* p, int64_t ldp, const R& v, int64_t n, int64_t dv, float* o) {
  const hn::ScalableTag<float> df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  int64_t c = 0;
  if (R::Vectors(lanes)) {
    for (; c + 4 * lanes <= dv; c += 4 * lanes) ValuePass<NR, 4>(p, ldp, v, n, dv, c, o);
    for (; c + lanes <= dv; c += lanes) ValuePass<NR, 1>(p, ldp, v, n, dv, c, o);
  }
  for (; c < dv; ++c) {
    for (int64_t j = 0; j < n; ++j) {
      const float vc = v.At(j, c);
      for (int64_t r = 0; r < NR; ++r) o[r * dv + c] += p[r * ldp + j] * vc;
    }
  }
}

template <class R>
HWY_INLINE void Values(const float* p, int64_t ldp, int64_t rows, const R& v, int64_t n, int64_t dv, float* o) {
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) ValueRows<kRows>(p + r * ldp, ldp, v, n, dv, o + r * dv);
  for (; r < rows; ++r) ValueRows<1>(p + r * ldp, ldp, v, n, dv, o + r * dv);
}

HWY_INLINE int64_t Groups(int64_t d) { return (d + kGroup - 1) / kGroup; }

void Int8Scores(const float* qs, const float* qc, int64_t rows, const int8_t* k, const float* ks, int64_t n, int64_t d,
                const int8_t* next, float scale, float* s, int64_t lds) {
  Scores(qs, qc, rows, Int8Rows{k, ks, d, Groups(d), next}, n, d, scale, s, lds);
}
void Int8Values(const float* p, int64_t ldp, int64_t rows, const int8_t* v, const float* vs, int64_t n, int64_t dv,
                const int8_t* next, float* o) {
  Values(p, ldp, rows, Int8Rows{v, vs, dv, Groups(dv), next}, n, dv, o);
}
void HalfScores(bool f16, const float* q, int64_t rows, const uint16_t* k, int64_t n, int64_t d, const uint16_t* next,
                float scale, float* s, int64_t lds) {
  if (f16) {
    Scores(q, nullptr, rows, HalfRows<true>{k, d, next}, n, d, scale, s, lds);
  } else {
    Scores(q, nullptr, rows, HalfRows<false>{k, d, next}, n, d, scale, s, lds);
  }
}
void HalfValues(bool f16, const float* p, int64_t ldp, int64_t rows, const uint16_t* v, int64_t n, int64_t dv,
                const uint16_t* next, float* o) {
  if (f16) {
    Values(p, ldp, rows, HalfRows<true>{v, dv, next}, n, dv, o);
  } else {
    Values(p, ldp, rows, HalfRows<false>{v, dv, next}, n, dv, o);
  }
}

}  // namespace qkv::attention::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
