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

#include <algorithm>
#include <cmath>
#include <limits>

#include "attention/decode_rows.h"

namespace qkv::attention {

HWY_EXPORT(Int8Scores);
HWY_EXPORT(Int8Values);
HWY_EXPORT(HalfScores);
HWY_EXPORT(HalfValues);
HWY_EXPORT(FloatScores);
HWY_EXPORT(FloatValues);

float quantize_query_row(const float* qs, int64_t d, int16_t* q_hat) {
  float big = 0.0f;
  bool finite = true;
  for (int64_t c = 0; c < d; ++c) big = std::max(big, std::fabs(qs[c])), finite = finite && std::isfinite(qs[c]);
  // a NaN or infinite query: NaN scores, as the float product gave
  const float sigma = finite ? big / 32767.0f : std::numeric_limits<float>::quiet_NaN();
  if (!finite) {
    std::fill(q_hat, q_hat + d, int16_t{0});
    return sigma;
  }
  for (int64_t c = 0; c < d; ++c) {
    const float x = sigma > 0.0f ? std::nearbyint(qs[c] / sigma) : 0.0f;
    q_hat[c] = static_cast<int16_t>(std::clamp(x, -32767.0f, 32767.0f));
  }
  return sigma;
}

void int8_scores(const Int8Query& q, int64_t rows, const int8_t* k, const bfloat16* ks, int64_t n, int64_t d,
                 const int8_t* next, float scale, float* s, int64_t lds) {
  QKV_DYNAMIC_DISPATCH(Int8Scores)(q, rows, k, &ks->bits, n, d, next, scale, s, lds);
}

void int8_values(const float* p, int64_t ldp, int64_t rows, const int8_t* v, const bfloat16* vs, int64_t n, int64_t dv,
                 const int8_t* next, float* o) {
  QKV_DYNAMIC_DISPATCH(Int8Values)(p, ldp, rows, v, &vs->bits, n, dv, next, o);
}

void half_scores(const float* q, int64_t rows, const bfloat16* k, int64_t n, int64_t d, const bfloat16* next,
                 float scale, float* s, int64_t lds) {
  QKV_DYNAMIC_DISPATCH(HalfScores)(false, q, rows, &k->bits, n, d, next ? &next->bits : nullptr, scale, s, lds);
}
void half_scores(const float* q, int64_t rows, const float16* k, int64_t n, int64_t d, const float16* next, float scale,
                 float* s, int64_t lds) {
  QKV_DYNAMIC_DISPATCH(HalfScores)(true, q, rows, &k->bits, n, d, next ? &next->bits : nullptr, scale, s, lds);
}

void half_values(const float* p, int64_t ldp, int64_t rows, const bfloat16* v, int64_t n, int64_t dv,
                 const bfloat16* next, float* o) {
  QKV_DYNAMIC_DISPATCH(HalfValues)(false, p, ldp, rows, &v->bits, n, dv, next ? &next->bits : nullptr, o);
}
void half_values(const float* p, int64_t ldp, int64_t rows, const float16* v, int64_t n, int64_t dv,
                 const float16* next, float* o) {
  QKV_DYNAMIC_DISPATCH(HalfValues)(true, p, ldp, rows, &v->bits, n, dv, next ? &next->bits : nullptr, o);
}

void half_scores(const float* q, int64_t rows, const float* k, int64_t n, int64_t d, const float* next, float scale,
                 float* s, int64_t lds) {
  QKV_DYNAMIC_DISPATCH(FloatScores)(q, rows, k, n, d, next, scale, s, lds);
}
void half_values(const float* p, int64_t ldp, int64_t rows, const float* v, int64_t n, int64_t dv, const float* next,
                 float* o) {
  QKV_DYNAMIC_DISPATCH(FloatValues)(p, ldp, rows, v, n, dv, next, o);
}

}  // namespace qkv::attention

#endif  // HWY_ONCE
