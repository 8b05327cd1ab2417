// decode_attention's int8 kernels (decode_int8-inl.h, Highway, dispatched at run time): the
// two products of a work item on int8 cache rows in place, groups of KVCache::kInt8Group
// channels dequantized in registers (qkv/kv_cache.h: k = q s r + c, v = q s).
#pragma once

#include <cstdint>

namespace qkv::attention {

// Scores of `rows` queries against n keys [n, d] with scales ks [n, groups]:
// s[r * lds + j] = scale (sum_c qs[r, c] ks[j, c / 16] k[j, c] + qc[r]), where qs = q r (the
// query times the key spreads) and qc = q . c (the offsets' share, the same for every key).
void int8_scores(const float* qs, const float* qc, int64_t rows, const int8_t* k, const float* ks, int64_t n, int64_t d,
                 float scale, float* s, int64_t lds);

// o[r, c] += sum_j p[r * ldp + j] vs[j, c / 16] v[j, c] for `rows` rows, n values [n, dv]
// with scales vs [n, groups]; o [rows, dv].
void int8_values(const float* p, int64_t ldp, int64_t rows, const int8_t* v, const float* vs, int64_t n, int64_t dv,
                 float* o);

}  // namespace qkv::attention
