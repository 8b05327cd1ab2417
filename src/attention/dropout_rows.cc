// Runtime dispatch of the dropout kernel (dropout_rows-inl.h, compiled once per SIMD target
// here and nowhere else).
#include "kernels/cpu/hwy_targets.h"  // the target list, before any hwy/ header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "attention/dropout_rows-inl.h"
// clang-format off
#include "hwy/foreach_target.h"  // must come before highway.h
#include "hwy/highway.h"
#include "attention/dropout_rows-inl.h"
// clang-format on

#if HWY_ONCE

#include "attention/dropout_rows.h"

namespace qkv::attention {

HWY_EXPORT(DropoutRow);

void dropout_row(float* row, int64_t n, uint64_t seed, uint64_t index, double p, float scale, float* row2) {
  QKV_DYNAMIC_DISPATCH(DropoutRow)(row, row2, n, seed, index, p, scale);
}

}  // namespace qkv::attention

#endif  // HWY_ONCE
