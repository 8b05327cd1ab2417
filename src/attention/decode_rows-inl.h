// Per-target decode kernels (Highway) on cache rows in place: Q K^T and P V read int8 rows,
// dequantizing each group of KVCache::kInt8Group channels in registers, bf16 / f16 rows,
// widened to float32 in registers, and float32 rows (decode_rows.h); float32 accumulation
// throughout. One loop per product, templated over a row type (Int8Rows, HalfRows, FloatRows)
// that loads lanes of a row as floats; for int8 rows with D a multiple of 64 (not on the scalar
// target) integer score loops (ScoreRowsInt) on a query rounded to int16 and the value products
// of decode_rows_int8-inl.h (included at the end: integer products over pairs of keys, or float passes that split the
// bytes by shifts) take their place. The int8 scalar loop that widened each chunk into scratch
// before two f32 GEMMs read int8 at 6.5 GB/s, the bf16 widening at 73-78% of memcpy
// (docs/decode_performance.md). decode_rows.cc re-includes this file once per SIMD target via
// hwy/foreach_target.h; no other file includes it (nor decode_rows_int8-inl.h). Include guard
// toggled per target.
#if defined(QKV_ATTENTION_DECODE_ROWS_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_ATTENTION_DECODE_ROWS_INL_H_
#undef QKV_ATTENTION_DECODE_ROWS_INL_H_
#else
#define QKV_ATTENTION_DECODE_ROWS_INL_H_
#endif

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "attention/decode_rows.h"
#include "hwy/cache_control.h"
#include "hwy/highway.h"
#include "kernels/cpu/half_bits-inl.h"
#include "qkv/kv_cache.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::attention::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

constexpr int64_t kGroup = KVCache::kInt8Group;  // channels per scale
constexpr int64_t kRows = kRowsPerPass;          // query rows per pass: each row vector loaded feeds kRows FMAs
constexpr int64_t kAhead = 32;  // rows prefetched ahead (16: int8's 1-thread 32k step 10.2 ms, 32: 8.7; 64: the same)

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

// int8 rows [n, d] with a bfloat16 scale per row and group of kGroup channels (scales [n, groups], bits).
struct Int8Rows {
  const int8_t* x;
  const uint16_t* scales;
  int64_t d, groups;
  const void* next;
  static constexpr int64_t kBytes = 1;
  static bool Vectors(int64_t lanes) { return lanes <= kGroup; }
  const void* Row(int64_t j) const { return x + j * d; }
  template <class D>
  HWY_INLINE hn::Vec<D> Load(D df, int64_t j, int64_t c) const {
    return hn::Mul(LoadInt8(df, x + j * d + c), hn::Set(df, Scale(j, c)));
  }
  float Scale(int64_t j, int64_t c) const {
    return static_cast<float>(bfloat16::from_bits(scales[j * groups + c / kGroup]));
  }
  float At(int64_t j, int64_t c) const { return static_cast<float>(x[j * d + c]) * Scale(j, c); }
  void Skip(int64_t j) { x += j * d, scales += j * groups; }  // rows from j on
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
#if QKV_HWY_AVX2_OR_AVX512
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
  void Skip(int64_t j) { x += j * d; }  // rows from j on
};

// float32 rows [n, d], read as they are (the f32 cache: a plain load where the others widen).
struct FloatRows {
  const float* x;
  int64_t d;
  const void* next;
  static constexpr int64_t kBytes = 4;
  static bool Vectors(int64_t) { return true; }
  const void* Row(int64_t j) const { return x + j * d; }
  template <class D>
  HWY_INLINE hn::Vec<D> Load(D df, int64_t j, int64_t c) const {
    return hn::LoadU(df, x + j * d + c);
  }
  float At(int64_t j, int64_t c) const { return x[j * d + c]; }
  void Skip(int64_t j) { x += j * d; }  // rows from j on
};

// Prefetches (all cache lines of) row j + kAhead of a run of n rows, or past its end the
// next run's row j + kAhead - n: runs of a paged cache are a page long (16 rows in vLLM's
// default), shorter than the prefetch distance, and ran at half speed without it. A next run
// shorter than that prefetches rows past it: harmless, prefetches do not fault.
template <class R>
HWY_INLINE void PrefetchAhead(const R& rows, int64_t j, int64_t n, int64_t ahead = kAhead) {
  const int64_t a = j + ahead, bytes = rows.d * R::kBytes;
  const char* p = a < n ? static_cast<const char*>(rows.Row(a))
                        : (rows.next ? static_cast<const char*>(rows.next) + (a - n) * bytes : nullptr);
  if (p == nullptr) return;
  for (int64_t c = 0; c < bytes; c += 64) hwy::Prefetch(p + c);
}

#if QKV_HWY_AVX2_OR_AVX512
// Per 128-bit block, the sums of that block's 4 lanes of a, b, c and d, in that order (float or
// int32 lanes).
template <class D, class V>
HWY_INLINE V BlockSums4(D d, V a, V b, V c, V e) {
  const hn::Repartition<uint64_t, D> d64;
  const auto ab = hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));  // a b a b per block
  const auto ce = hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e));  // c e c e
  const auto lo = hn::InterleaveLower(d64, hn::BitCast(d64, ab), hn::BitCast(d64, ce));
  const auto hi = hn::InterleaveUpper(d64, hn::BitCast(d64, ab), hn::BitCast(d64, ce));
  return hn::Add(hn::BitCast(d, lo), hn::BitCast(d, hi));
}
#endif

// The lane sums of a, b, c and d (one query row's products with one key each) into out[0..3]:
// on AVX2 and AVX-512 with interleaves and one block reduction (13 operations where four
// SumOfLanes took 32: the reductions had been a third of the scores' time), else lane by lane.
template <class D, class V>
HWY_INLINE void Sum4(D df, V a, V b, V c, V d, float* out) {
#if QKV_HWY_AVX2_OR_AVX512
  const auto blocks = BlockSums4(df, a, b, c, d);  // a b c d per 128-bit block
  const hn::Half<D> dh;
  const auto half = hn::Add(hn::LowerHalf(dh, blocks), hn::UpperHalf(dh, blocks));
#if QKV_HWY_AVX512
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

// Scores of NR query rows against keys [n, d]: s[r, j] = scale (qm[r] qs[r] . k[j] + qc[r])
// (qm, qc null: 1, 0).
template <int64_t NR, class R>
HWY_INLINE void ScoreRows(const float* qs, const float* qm, const float* qc, const R& k, int64_t n, int64_t d,
                          float scale, float* s, int64_t lds) {
  const hn::ScalableTag<float> df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t whole = R::Vectors(lanes) ? d / lanes * lanes : 0;  // whole vectors; the rest lane by lane
  float add[NR], mul[NR];
  for (int64_t r = 0; r < NR; ++r) add[r] = qc ? qc[r] : 0.0f, mul[r] = qm ? qm[r] : 1.0f;
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
    for (int64_t r = 0; r < NR; ++r) s[r * lds + j] = scale * (mul[r] * (sums[r] + tail[r]) + add[r]);
  }
}

// Scores of 4 query rows against keys [n, d] (d whole vectors), 4 keys at a time: 16
// accumulators, each query vector loaded once for 4 keys and each key vector once for 4 rows,
// and one Sum4 per row gives its 4 keys' sums (one key at a time, the channel loop's 4 chains
// waited on the FMA latency and each key's reduction on the last FMA: the int8 32k step went
// 5.09 -> 4.61 ms when this was its score loop, perf record on Zen 4). The keys past a multiple
// of 4 by ScoreRows. bf16 / f16 rows, and int8 rows whose D is not a multiple of 64.
template <class R>
HWY_INLINE void ScoreRows4x4(const float* qs, const float* qm, const float* qc, const R& k, int64_t n, int64_t d,
                             float scale, float* s, int64_t lds) {
  const hn::ScalableTag<float> df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  const int64_t blocked = n / 4 * 4;
  for (int64_t j = 0; j < blocked; j += 4) {
    for (int64_t x = 0; x < 4; ++x) PrefetchAhead(k, j + x, n);
    hn::Vec<decltype(df)> acc[4][4];  // [row][key]
    for (auto& row : acc) {
      for (auto& a : row) a = hn::Zero(df);
    }
    for (int64_t c = 0; c < d; c += lanes) {
      hn::Vec<decltype(df)> kv[4];
      for (int64_t x = 0; x < 4; ++x) kv[x] = k.Load(df, j + x, c);
      for (int64_t r = 0; r < 4; ++r) {
        const auto qv = hn::LoadU(df, qs + r * d + c);
        for (int64_t x = 0; x < 4; ++x) acc[r][x] = hn::MulAdd(qv, kv[x], acc[r][x]);
      }
    }
    for (int64_t r = 0; r < 4; ++r) Sum4(df, acc[r][0], acc[r][1], acc[r][2], acc[r][3], s + r * lds + j);
  }
  for (int64_t r = 0; r < 4; ++r) {  // s = scale (qm sum + qc)
    const float add = qc ? qc[r] : 0.0f, mul = qm ? qm[r] : 1.0f;
    for (int64_t j = 0; j < blocked; ++j) s[r * lds + j] = scale * (mul * s[r * lds + j] + add);
  }
  if (blocked < n) {
    R rest = k;
    rest.Skip(blocked);
    ScoreRows<4>(qs, qm, qc, rest, n - blocked, d, scale, s + blocked, lds);
  }
}

template <class R>
HWY_INLINE void Scores(const float* qs, const float* qm, const float* qc, int64_t rows, const R& k, int64_t n,
                       int64_t d, float scale, float* s, int64_t lds) {
  const hn::ScalableTag<float> df;
  const bool whole = R::Vectors(static_cast<int64_t>(hn::Lanes(df))) && d % static_cast<int64_t>(hn::Lanes(df)) == 0;
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) {
    const float* m = qm ? qm + r : nullptr;
    if (whole) {
      ScoreRows4x4(qs + r * d, m, qc ? qc + r : nullptr, k, n, d, scale, s + r * lds, lds);
    } else {
      ScoreRows<kRows>(qs + r * d, m, qc ? qc + r : nullptr, k, n, d, scale, s + r * lds, lds);
    }
  }
  for (; r < rows; ++r) {
    ScoreRows<1>(qs + r * d, qm ? qm + r : nullptr, qc ? qc + r : nullptr, k, n, d, scale, s + r * lds, lds);
  }
}

// o[r, c] += sum_j p[r, j] v[j, c] for NR rows and the channels [c0, c0 + V lanes):
// NR x V accumulators stay in registers across the keys (the chunk's rows stay in L2). They
// start from o, so that an item read run by run (pages, a ring's wrap) makes the FMAs of one
// run over all its keys: a paged cache decodes to the contiguous cache's bits (accumulators
// from 0, added to o per run, differed by an ulp: D = 128 on every target, D = 8 on AVX2).
template <int64_t NR, int64_t V, class R>
HWY_INLINE void ValuePass(const float* p, int64_t ldp, const R& v, int64_t n, int64_t dv, int64_t c0, float* o) {
  const hn::ScalableTag<float> df;
  const auto lanes = static_cast<int64_t>(hn::Lanes(df));
  hn::Vec<decltype(df)> acc[NR][V];
  for (int64_t r = 0; r < NR; ++r) {
    for (int64_t x = 0; x < V; ++x) acc[r][x] = hn::LoadU(df, o + r * dv + c0 + x * lanes);
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
    for (int64_t x = 0; x < V; ++x) hn::StoreU(acc[r][x], df, o + r * dv + c0 + x * lanes);
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

#if HWY_TARGET != HWY_SCALAR
// Scores of NR int16 query rows (decode_rows.h's Int8Query layout: per 64 channels the 32 even
// ones, then the 32 odd ones) against int8 keys, as integer dot products: a vector of int16
// lanes holds pairs of key bytes; shifts split it into the even and the odd channels (sign-
// extended), and two multiply-adds of int16 pairs (ReorderWidenMulAccumulate: vpmaddwd) give
// int32 lane i the sum over channels c + 4i .. c + 4i + 3, of one group. Lane i is then
// converted, scaled by its group's scale and accumulated in float. On Zen 4 the float loop's
// 32 FMAs, 8 scale multiplies and 8 byte widenings per key row (vpmovsxbd) all ran on the two
// FMA pipes (measured: 1 zmm FMA a cycle, halved by a vpmaddwd or a vpmovsxbd beside it, not by
// shifts, conversions or adds); this takes 16 multiply-adds and 8 FMAs a key row.
// The 4 bfloat16 scales at p as floats, in every 128-bit block (s0 s1 s2 s3): lane i of a
// vector of int8 lanes split by 4 (ScoreRowsInt, ValuePassInt) then takes scale i / 4 of its
// block of 64 channels by a table lookup.
template <class DF>
HWY_INLINE hn::Vec<DF> ScaleBlock(DF df, const uint16_t* p) {
  const hn::Repartition<uint64_t, DF> d64;
  const hn::Repartition<uint16_t, DF> d16;
  uint64_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return hn::BitCast(df, hn::InterleaveLower(d16, hn::Zero(d16), hn::BitCast(d16, hn::Set(d64, bits))));
}

template <class DF>
using TableIndices = decltype(hn::SetTableIndices(DF(), static_cast<const int32_t*>(nullptr)));

// A vector of key bytes (int16 lanes holding pairs) split into its even and odd channels,
// sign-extended to int16 lanes; and int32 lane i = the sum of the 4 products of those
// channels 4i .. 4i + 3 with the query's even and odd int16 lanes (two vpmaddwd).
template <class VW>
HWY_INLINE void SplitBytes(VW x, VW& even, VW& odd) {
  even = hn::ShiftRight<8>(hn::ShiftLeft<8>(x)), odd = hn::ShiftRight<8>(x);
}
template <class DI, class VW>
HWY_INLINE hn::Vec<DI> PairDots(DI di, VW even, VW odd, VW q_even, VW q_odd) {
  auto sum1 = hn::Zero(di);
  const auto sum0 = hn::ReorderWidenMulAccumulate(di, even, q_even, hn::Zero(di), sum1);
  return hn::RearrangeToOddPlusEven(hn::ReorderWidenMulAccumulate(di, odd, q_odd, sum0, sum1), sum1);
}

// f[r] += the lanes of query row r's products with key row j (summing f's lanes gives the dot).
template <int64_t NR, class DF>
HWY_INLINE void KeyDots(DF df, const int16_t* q16, const Int8Rows& k, int64_t j, int64_t d, const TableIndices<DF>* idx,
                        hn::Vec<DF>* f) {
  const hn::RebindToSigned<DF> di;                               // int32
  const hn::Repartition<int16_t, decltype(di)> dw;               // int16
  const int64_t step = 4 * static_cast<int64_t>(hn::Lanes(di));  // channels (key bytes) per vector: 64 on AVX-512
  const int8_t* row = k.x + j * d;
  const uint16_t* sc = k.scales + j * k.groups;
  for (int64_t c = 0; c < d; c += step) {
    hn::Vec<decltype(dw)> even, odd;
    SplitBytes(hn::LoadU(dw, reinterpret_cast<const int16_t*>(row + c)), even, odd);
    const int64_t block = c / 64, at = c % 64;
    const auto sv = hn::TableLookupLanes(ScaleBlock(df, sc + block * 4), idx[at / step]);
    const int16_t* qe = q16 + block * 64 + at / 2;  // even channels; odd: qe + 32
    for (int64_t r = 0; r < NR; ++r) {
      const auto dot = PairDots(di, even, odd, hn::LoadU(dw, qe + r * d), hn::LoadU(dw, qe + r * d + 32));
      f[r] = hn::MulAdd(hn::ConvertTo(df, dot), sv, f[r]);
    }
  }
}

// The scores of NR rows of q16 against keys [n, d]: 4 keys at a time for 4 rows (16 accumulators,
// one Sum4 a row for 4 keys: one key at a time, each key's reduction waited on its last
// product and took 60% of the scores' samples), else one key at a time. With 4 rows the last 1
// to 3 keys are summed by Sum4 too (beside zeros): a key's score is then the same whether it is
// in a group of 4 or not, so an item read run by run (pages) gives the contiguous cache's bits.
template <int64_t NR>
HWY_INLINE void ScoreRowsInt(const int16_t* q16, const float* qm, const float* qc, const Int8Rows& k, int64_t n,
                             int64_t d, float scale, float* s, int64_t lds) {
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const auto n32 = static_cast<int64_t>(hn::Lanes(di));
  // lane i of the vector at channel c has group c / 16 + i / 4: lane (c % 64) / 16 + i / 4 of the
  // 4 scales of c's block of 64 channels (ScaleBlock); a table per position in the block
  TableIndices<decltype(df)> idx[4];
  for (int64_t p = 0; p < 64 / (4 * n32); ++p) {
    HWY_ALIGN int32_t lanes[hn::MaxLanes(di)];
    for (int64_t i = 0; i < n32; ++i) lanes[i] = static_cast<int32_t>(p * 4 * n32 / kGroup + i / 4);
    idx[p] = hn::SetTableIndices(df, lanes);
  }
  int64_t j = 0;
  if constexpr (NR == 4) {
    for (; j + 4 <= n; j += 4) {
      hn::Vec<decltype(df)> f[4][4];  // [key][row]
      for (int64_t x = 0; x < 4; ++x) {
        PrefetchAhead(k, j + x, n);
        for (auto& v : f[x]) v = hn::Zero(df);
        KeyDots<4>(df, q16, k, j + x, d, idx, f[x]);
      }
      for (int64_t r = 0; r < 4; ++r) Sum4(df, f[0][r], f[1][r], f[2][r], f[3][r], s + r * lds + j);
    }
    if (j < n) {                      // the last 1 to 3 keys
      hn::Vec<decltype(df)> f[4][4];  // [key][row]
      for (int64_t x = 0; x < 4; ++x) {
        for (auto& v : f[x]) v = hn::Zero(df);
        if (j + x < n) KeyDots<4>(df, q16, k, j + x, d, idx, f[x]);
      }
      for (int64_t r = 0; r < 4; ++r) {
        float sums[4];
        Sum4(df, f[0][r], f[1][r], f[2][r], f[3][r], sums);
        std::copy(sums, sums + (n - j), s + r * lds + j);
      }
      j = n;
    }
  }
  for (int64_t r = 0; r < NR; ++r) {  // s = scale (sigma sum + qc)
    const float mul = scale * qm[r], add = scale * qc[r];
    for (int64_t x = 0; x < j; ++x) s[r * lds + x] = mul * s[r * lds + x] + add;
  }
  for (; j < n; ++j) {
    PrefetchAhead(k, j, n);
    hn::Vec<decltype(df)> f[NR];
    for (auto& v : f) v = hn::Zero(df);
    KeyDots<NR>(df, q16, k, j, d, idx, f);
    for (int64_t r = 0; r < NR; ++r)
      s[r * lds + j] = scale * qm[r] * hn::GetLane(hn::SumOfLanes(df, f[r])) + scale * qc[r];
  }
}

// ScoreRowsInt for 4 rows and d = 64 NB on AVX-512 (one vector a block of 64 channels): the 4 NB
// query vectors (even and odd channels of each row and block) stay in registers for the whole
// run. A block's 4 rows of int32 lane sums are summed per group in integers first (lanes 4g ..
// 4g + 3 hold group g's 16 channels: BlockSums4 gives block g the 4 rows' sums of group g), then
// converted and scaled once: 2 conversions and 2 FMAs a key instead of 8 and 8, the FMA pipes'
// share of a key row 26 -> 20 operations (Zen 4 runs the multiply-adds on the FMA pipes too),
// but 35.7 -> 34.6 cycles a key row on a 1024-key chunk in L2: the loop is bound by all its
// vector operations (shifts, interleaves, lookups) on the 4 pipes, not by the FMA pipes alone.
// 4 keys' vectors [group][row] are then summed over their blocks together (KeySums4) into a
// [keys, 4] buffer, turned into the rows of s per 64 keys. The generic loop (q16 reloaded for
// every key, f spilled between keys) took 64 cycles a key row on an L2-resident chunk (Zen 4,
// 3.6 GHz), the float loop 57, this with float scaling per row and block 38.
#if QKV_HWY_AVX512  // (only AVX-512 calls it)
template <class DF>
HWY_INLINE void KeySums4(DF df, hn::Vec<DF> f0, hn::Vec<DF> f1, hn::Vec<DF> f2, hn::Vec<DF> f3, float* out) {
  // f_x: 4 blocks of the 4 rows' partial sums of key x -> out [4 keys, 4 rows]
  const auto s01 = hn::Add(hn::ConcatLowerLower(df, f1, f0), hn::ConcatUpperUpper(df, f1, f0));  // f0 a b, f1 a b
  const auto s23 = hn::Add(hn::ConcatLowerLower(df, f3, f2), hn::ConcatUpperUpper(df, f3, f2));  // f2 a b, f3 a b
  const auto x = hn::ConcatLowerLower(df, s23, s01), y = hn::ConcatUpperUpper(df, s23, s01);     // f0 f2, f1 f3 (a b)
  const auto first = hn::OddEvenBlocks(y, x);                                                    // f0a f1b f2a f3b
  const auto second = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(y), hn::SwapAdjacentBlocks(x));   // f0b f1a f2b f3a
  hn::StoreU(hn::Add(first, second), df, out);
}

template <int64_t NB>
HWY_INLINE void ScoreRowsInt4(const int16_t* q16, const float* qm, const float* qc, const Int8Rows& k, int64_t n,
                              int64_t d, float scale, float* s, int64_t lds) {
  static_assert(kGroup == 16, "a 128-bit block of int32 lane sums is one group");
  const hn::ScalableTag<float> df;
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Repartition<int16_t, decltype(di)> dw;
  HWY_ALIGN int32_t lanes[hn::MaxLanes(di)];
  for (size_t i = 0; i < hn::Lanes(di); ++i) lanes[i] = static_cast<int32_t>(i / 4);
  const auto idx = hn::SetTableIndices(df, lanes);
  hn::Vec<decltype(dw)> qv[4][NB][2];  // [row][block][even, odd]
  for (int64_t r = 0; r < 4; ++r) {
    for (int64_t b = 0; b < NB; ++b) {
      qv[r][b][0] = hn::LoadU(dw, q16 + r * d + b * 64), qv[r][b][1] = hn::LoadU(dw, q16 + r * d + b * 64 + 32);
    }
  }
  // key j's 4 rows, per block g the sums of groups g, g + 4, ..
  const auto key = [&](int64_t j) HWY_ATTR {
    PrefetchAhead(k, j, n);
    const int8_t* row = k.x + j * d;
    const uint16_t* sc = k.scales + j * k.groups;
    hn::Vec<decltype(df)> f = hn::Zero(df);
    for (int64_t b = 0; b < NB; ++b) {
      hn::Vec<decltype(dw)> even, odd;
      SplitBytes(hn::LoadU(dw, reinterpret_cast<const int16_t*>(row + b * 64)), even, odd);
      hn::Vec<decltype(di)> dot[4];  // lane i: channels 4i .. 4i + 3 of the block
      for (int64_t r = 0; r < 4; ++r) dot[r] = PairDots(di, even, odd, qv[r][b][0], qv[r][b][1]);
      const auto t = hn::ConvertTo(df, BlockSums4(di, dot[0], dot[1], dot[2], dot[3]));
      const auto sv = hn::TableLookupLanes(ScaleBlock(df, sc + b * 4), idx);  // block g: group 4 b + g's scale
      f = b == 0 ? hn::Mul(t, sv) : hn::MulAdd(t, sv, f);
    }
    return f;
  };
  constexpr int64_t kKeys = 64;
  HWY_ALIGN float sums[kKeys][4];  // [key][row]
  for (int64_t j0 = 0; j0 < n; j0 += kKeys) {
    const int64_t m = std::min(kKeys, n - j0);
    int64_t x = 0;
    for (; x + 4 <= m; x += 4) {
      const auto f0 = key(j0 + x), f1 = key(j0 + x + 1), f2 = key(j0 + x + 2), f3 = key(j0 + x + 3);
      KeySums4(df, f0, f1, f2, f3, sums[x]);
    }
    if (x < m) {  // the last 1 to 3 keys (the rest of sums unused)
      const auto z = hn::Zero(df);
      KeySums4(df, key(j0 + x), x + 1 < m ? key(j0 + x + 1) : z, x + 2 < m ? key(j0 + x + 2) : z, z, sums[x]);
    }
    for (int64_t r = 0; r < 4; ++r) {  // s = scale (sigma sum + qc)
      const float mul = scale * qm[r], add = scale * qc[r];
      for (int64_t i = 0; i < m; ++i) s[r * lds + j0 + i] = mul * sums[i][r] + add;
    }
  }
}
#endif  // QKV_HWY_AVX512
#endif

// int8 keys: the integer path where the query is in Int8Query's layout (d a multiple of 64)
// and the target has 4 int32 lanes or more, else the float loops on q_hat as floats.
void Int8Scores(const Int8Query& q, int64_t rows, const int8_t* k, const uint16_t* ks, int64_t n, int64_t d,
                const int8_t* next, float scale, float* s, int64_t lds) {
  const Int8Rows keys{k, ks, d, Groups(d), next};
#if HWY_TARGET != HWY_SCALAR
  if (q.q16 != nullptr && d % 64 == 0) {
    int64_t r = 0;
    for (; r + kRows <= rows; r += kRows) {
#if QKV_HWY_AVX512
      if (d == 128) {
        ScoreRowsInt4<2>(q.q16 + r * d, q.scale + r, q.offset + r, keys, n, d, scale, s + r * lds, lds);
        continue;
      }
#endif
      ScoreRowsInt<kRows>(q.q16 + r * d, q.scale + r, q.offset + r, keys, n, d, scale, s + r * lds, lds);
    }
    for (; r < rows; ++r)
      ScoreRowsInt<1>(q.q16 + r * d, q.scale + r, q.offset + r, keys, n, d, scale, s + r * lds, lds);
    return;
  }
#endif
  Scores(q.qf, q.scale, q.offset, rows, keys, n, d, scale, s, lds);
}

void HalfScores(bool f16, const float* q, int64_t rows, const uint16_t* k, int64_t n, int64_t d, const uint16_t* next,
                float scale, float* s, int64_t lds) {
  if (f16) {
    Scores(q, nullptr, nullptr, rows, HalfRows<true>{k, d, next}, n, d, scale, s, lds);
  } else {
    Scores(q, nullptr, nullptr, rows, HalfRows<false>{k, d, next}, n, d, scale, s, lds);
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

void FloatScores(const float* q, int64_t rows, const float* k, int64_t n, int64_t d, const float* next, float scale,
                 float* s, int64_t lds) {
  Scores(q, nullptr, nullptr, rows, FloatRows{k, d, next}, n, d, scale, s, lds);
}
void FloatValues(const float* p, int64_t ldp, int64_t rows, const float* v, int64_t n, int64_t dv, const float* next,
                 float* o) {
  Values(p, ldp, rows, FloatRows{v, dv, next}, n, dv, o);
}

}  // namespace qkv::attention::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// Int8Values (the value products of int8 rows), on the helpers above
#include "attention/decode_rows_int8-inl.h"

#endif  // include guard
