// decode_attention's kernels on cache rows in place (decode_rows-inl.h, Highway, dispatched at
// run time): the two products of a work item, float32 accumulation. Each call takes one run
// of consecutive rows and `next`, the first row of the item's next run (null: none), which
// its prefetches reach into when the run is shorter than their distance (a cache's pages). int8 rows: groups of
// KVCache::kInt8Group channels dequantized in registers (qkv/kv_cache.h: k = q s r + c,
// v = q s). bf16 / f16 rows: widened to float32 in registers, exactly (the same products as
// float32 GEMMs on the widened rows, summed in another order).
#pragma once

#include <cstdint>

#include "qkv/half.h"

namespace qkv::attention {

// Query rows the kernels take together (each key or value row loaded feeds them all): more rows
// take more passes over the keys and values.
constexpr int64_t kRowsPerPass = 4;

// int8 caches' query rows for the keys, built once per work item (decode_cpu.cc): qs = q r (the
// query times the key spreads) rounded to int16 with one scale per row, qs ~ sigma q_hat
// (quantize_query_row), and qc = q . c (the offsets' share, the same for every key). The keys'
// products are then integer products (decode_rows-inl.h).
struct Int8Query {
  const int16_t* q16 = nullptr;  // [rows, D] q_hat, per 64 channels the 32 even then the 32 odd ones; null: D % 64 != 0
  const float* qf = nullptr;     // [rows, D] q_hat as floats, in channel order
  const float* scale = nullptr;  // [rows] sigma
  const float* offset = nullptr;  // [rows] qc
};

// q_hat [d] = round(qs / sigma), sigma = max |qs| / 32767 (float32; 0 and q_hat 0 for a zero row):
// 15 bits below the row's largest |q r|. The float64 reference rounds the same way.
float quantize_query_row(const float* qs, int64_t d, int16_t* q_hat);

// Scores of `rows` queries against n keys [n, d] with bfloat16 scales ks [n, groups]:
// s[r * lds + j] = scale (sigma[r] sum_c q_hat[r, c] ks[j, c / 16] k[j, c] + qc[r]).
void int8_scores(const Int8Query& q, int64_t rows, const int8_t* k, const bfloat16* ks, int64_t n, int64_t d,
                 const int8_t* next, float scale, float* s, int64_t lds);

// o[r, c] += sum_j p[r * ldp + j] vs[j, c / 16] v[j, c] for `rows` rows, n values [n, dv]
// with bfloat16 scales vs [n, groups]; o [rows, dv]. On AVX2 / AVX-512 with dv a multiple of 64
// (decode_rows_int8-inl.h) as integer products over pairs of keys: per row and block of
// kInt8ValueKeys keys from the first (the last one shorter), with big = max_j p[j] max_(j, g) vs[j, g]
// and tau = big / 32767, inv = 32767 / big in float32, each weight p vs is w tau, w =
// round((p inv) vs) (p inv in float32, the product rounded once, to nearest even), and the
// block adds tau sum_j w v; an odd last key of a run is p vs v in float. Elsewhere exactly
// p vs v in float. So each product moves by at most tau / 2 |v| (tests/attention/decode_int8_test.cc).
constexpr int64_t kInt8ValueKeys = 128;
void int8_values(const float* p, int64_t ldp, int64_t rows, const int8_t* v, const bfloat16* vs, int64_t n, int64_t dv,
                 const int8_t* next, float* o);

// s[r * lds + j] = scale (q[r] . k[j]) for `rows` queries q [rows, d] and n keys [n, d]: bf16 / f16
// keys widened in registers, float32 keys as they are (the names say "half" for the widening;
// float32 takes the same loops).
void half_scores(const float* q, int64_t rows, const float* k, int64_t n, int64_t d, const float* next, float scale,
                 float* s, int64_t lds);
void half_scores(const float* q, int64_t rows, const bfloat16* k, int64_t n, int64_t d, const bfloat16* next,
                 float scale, float* s, int64_t lds);
void half_scores(const float* q, int64_t rows, const float16* k, int64_t n, int64_t d, const float16* next, float scale,
                 float* s, int64_t lds);

// o[r, c] += sum_j p[r * ldp + j] v[j, c] for `rows` rows and n values [n, dv]; o [rows, dv].
void half_values(const float* p, int64_t ldp, int64_t rows, const float* v, int64_t n, int64_t dv, const float* next,
                 float* o);
void half_values(const float* p, int64_t ldp, int64_t rows, const bfloat16* v, int64_t n, int64_t dv,
                 const bfloat16* next, float* o);
void half_values(const float* p, int64_t ldp, int64_t rows, const float16* v, int64_t n, int64_t dv,
                 const float16* next, float* o);

}  // namespace qkv::attention
