// Runtime dispatch of the Highway pieces of the permuted copy (copy_transpose-inl.h,
// compiled once per SIMD target here and nowhere else).
#include <cstddef>
#include <cstdint>

#include "kernels/cpu/hwy_targets.h"  // the target list, before any hwy/ header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/copy_transpose-inl.h"
#include "hwy/foreach_target.h"  // must come before highway.h
#include "hwy/highway.h"
#include "kernels/cpu/copy_transpose-inl.h"

#if HWY_ONCE

#include <hwy/cache_control.h>

#include "kernels/cpu/copy_transpose.h"

namespace qkv::kernels::detail {

HWY_EXPORT(TransposeTile8);
HWY_EXPORT(TransposeTile16);
HWY_EXPORT(TransposeTile32);
HWY_EXPORT(TransposeTile64);
HWY_EXPORT(StreamCopy);

void transpose_tile(size_t width, const void* tile, int64_t tile_stride, void* dst, int64_t dst_stride, int64_t rows,
                    int64_t cols, bool stream) {
  switch (width) {
    case 1:
      return QKV_DYNAMIC_DISPATCH(TransposeTile8)(static_cast<const uint8_t*>(tile), tile_stride,
                                                  static_cast<uint8_t*>(dst), dst_stride, rows, cols, stream);
    case 2:
      return QKV_DYNAMIC_DISPATCH(TransposeTile16)(static_cast<const uint16_t*>(tile), tile_stride,
                                                   static_cast<uint16_t*>(dst), dst_stride, rows, cols, stream);
    case 4:
      return QKV_DYNAMIC_DISPATCH(TransposeTile32)(static_cast<const uint32_t*>(tile), tile_stride,
                                                   static_cast<uint32_t*>(dst), dst_stride, rows, cols, stream);
    default:
      return QKV_DYNAMIC_DISPATCH(TransposeTile64)(static_cast<const uint64_t*>(tile), tile_stride,
                                                   static_cast<uint64_t*>(dst), dst_stride, rows, cols, stream);
  }
}

void stream_copy(void* dst, const void* src, int64_t bytes) {
  QKV_DYNAMIC_DISPATCH(StreamCopy)(static_cast<uint8_t*>(dst), static_cast<const uint8_t*>(src), bytes);
}

void stream_fence() { hwy::FlushStream(); }

}  // namespace qkv::kernels::detail

#endif  // HWY_ONCE
