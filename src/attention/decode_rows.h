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
// with bfloat16 scales vs [n, groups]; o [rows, dv].
void int8_values(const float* p, int64_t ldp, int64_t rows, const int8_t* v, const bfloat16* vs, int64_t n, int64_t dv,
                 const int8_t* next, float* o);

// s[r * lds + j] = scale (q[r] . k[j]) for `rows` queries q [rows, d] and n keys [n, d].
void half_scores(const float* q, int64_t rows, const bfloat16* k, int64_t n, int64_t d, const bfloat16* next,
                 float scale, float* s, int64_t lds);
void half_scores(const float* q, int64_t rows, const float16* k, int64_t n, int64_t d, const float16* next, float scale,
                 float* s, int64_t lds);

// o[r, c] += sum_j p[r * ldp + j] v[j, c] for `rows` rows and n values [n, dv]; o [rows, dv].
void half_values(const float* p, int64_t ldp, int64_t rows, const bfloat16* v, int64_t n, int64_t dv,
                 const bfloat16* next, float* o);
void half_values(const float* p, int64_t ldp, int64_t rows, const float16* v, int64_t n, int64_t dv,
                 const float16* next, float* o);

}  // namespace qkv::attention
