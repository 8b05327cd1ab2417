// Runtime dispatch of the decode kernels on cache rows in place (decode_rows-inl.h, compiled
// once per SIMD target here and nowhere else).
#include "kernels/cpu/hwy_targets.h"  // the target list, before any hwy/ header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/decode_rows-inl.h"
// The kernels after foreach_target.h and highway.h (an order clang-format would sort away):
// clang-format off
#include "hwy/foreach_target.h"  // must come before highway.h
#include "hwy/highway.h"
#include "attention/decode_rows-inl.h"
// clang-format on

#if HWY_ONCE

#include "attention/decode_rows.h"

namespace qkv::attention {

HWY_EXPORT(Int8Scores);
HWY_EXPORT(Int8Values);
HWY_EXPORT(HalfScores);
HWY_EXPORT(HalfValues);

void int8_scores(const float* qs, const float* qc, int64_t rows, const int8_t* k, const float* ks, int64_t n, int64_t d,
                 const int8_t* next, float scale, float* s, int64_t lds) {
  HWY_DYNAMIC_DISPATCH(Int8Scores)(qs, qc, rows, k, ks, n, d, next, scale, s, lds);
}

void int8_values(const float* p, int64_t ldp, int64_t rows, const int8_t* v, const float* vs, int64_t n, int64_t dv,
                 const int8_t* next, float* o) {
  HWY_DYNAMIC_DISPATCH(Int8Values)(p, ldp, rows, v, vs, n, dv, next, o);
}

void half_scores(const float* q, int64_t rows, const bfloat16* k, int64_t n, int64_t d, const bfloat16* next,
                 float scale, float* s, int64_t lds) {
  HWY_DYNAMIC_DISPATCH(HalfScores)(false, q, rows, &k->bits, n, d, next ? &next->bits : nullptr, scale, s, lds);
}
void half_scores(const float* q, int64_t rows, const float16* k, int64_t n, int64_t d, const float16* next, float scale,
                 float* s, int64_t lds) {
  HWY_DYNAMIC_DISPATCH(HalfScores)(true, q, rows, &k->bits, n, d, next ? &next->bits : nullptr, scale, s, lds);
}

void half_values(const float* p, int64_t ldp, int64_t rows, const bfloat16* v, int64_t n, int64_t dv,
                 const bfloat16* next, float* o) {
  HWY_DYNAMIC_DISPATCH(HalfValues)(false, p, ldp, rows, &v->bits, n, dv, next ? &next->bits : nullptr, o);
}
void half_values(const float* p, int64_t ldp, int64_t rows, const float16* v, int64_t n, int64_t dv,
                 const float16* next, float* o) {
  HWY_DYNAMIC_DISPATCH(HalfValues)(true, p, ldp, rows, &v->bits, n, dv, next ? &next->bits : nullptr, o);
}

}  // namespace qkv::attention

#endif  // HWY_ONCE
