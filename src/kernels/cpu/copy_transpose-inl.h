// Per-target pieces of the permuted copy (Highway): an in-register transpose of
// square blocks and a streaming row copy. copy_transpose.cc re-includes this file
// once per SIMD target via hwy/foreach_target.h; no other file includes it.
// Highway's include guard convention: toggled per target.
#if defined(QKV_KERNELS_CPU_TRANSPOSE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_KERNELS_CPU_TRANSPOSE_INL_H_
#undef QKV_KERNELS_CPU_TRANSPOSE_INL_H_
#else
#define QKV_KERNELS_CPU_TRANSPOSE_INL_H_
#endif

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "hwy/cache_control.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// Element-wise scalar transpose of a rows x cols corner; the blocked code's edges.
template <class T>
HWY_INLINE void TransposeScalar(const T* HWY_RESTRICT tile, int64_t tile_stride, T* HWY_RESTRICT dst,
                                int64_t dst_stride, int64_t rows, int64_t cols) {
  for (int64_t i = 0; i < rows; ++i) {
    T* out = dst + i * dst_stride;
    for (int64_t j = 0; j < cols; ++j) out[j] = tile[j * tile_stride + i];
  }
}

#if HWY_TARGET == HWY_SCALAR

template <class T>
void TransposeTileT(const T* HWY_RESTRICT tile, int64_t tile_stride, T* HWY_RESTRICT dst, int64_t dst_stride,
                    int64_t rows, int64_t cols, bool /*stream*/) {
  TransposeScalar(tile, tile_stride, dst, dst_stride, rows, cols);
}

#else

// Blocks of kLanes x kLanes elements: vectors of at most 16 lanes (so at most 16
// registers per block) and 64 bytes. On AVX-512 a 4-byte block row is a whole cache
// line, so each src line is consumed by one load and each dst line written by one
// store; smaller vectors store a dst line in pieces, back to back.
template <class T>
using BlockTag = hn::CappedTag<T, HWY_MIN(16, 64 / sizeof(T))>;

// One butterfly stage: rows k and k + kStep exchange elements in groups of kStep
// lanes (InterleaveLower/Upper of groups within a unit). Groups under 16 bytes
// interleave within 128-bit blocks; 16-byte groups of a 64-byte vector within its
// 256-bit halves; the last stage, groups of half a vector, concatenates halves.
template <size_t kStep, class D, class V>
HWY_INLINE void TransposeStage(D d, V* v) {
  constexpr size_t kLanes = hn::MaxLanes(D());
  constexpr size_t kGroupBytes = kStep * sizeof(hn::TFromD<D>);
  for (size_t k = 0; k < kLanes; ++k) {
    if (k & kStep) continue;
    const V a = v[k], b = v[k + kStep];
    if constexpr (kGroupBytes < 16) {
      const hn::Repartition<hwy::UnsignedFromSize<kGroupBytes>, D> dg;
      const auto ga = hn::BitCast(dg, a), gb = hn::BitCast(dg, b);
      v[k] = hn::BitCast(d, hn::InterleaveLower(ga, gb));
      v[k + kStep] = hn::BitCast(d, hn::InterleaveUpper(dg, ga, gb));
    } else if constexpr (2 * kStep < kLanes) {  // 16-byte groups of a 64-byte vector
      v[k] = hn::OddEvenBlocks(hn::SwapAdjacentBlocks(b), a);
      v[k + kStep] = hn::OddEvenBlocks(b, hn::SwapAdjacentBlocks(a));
    } else {
      v[k] = hn::ConcatLowerLower(d, b, a);
      v[k + kStep] = hn::ConcatUpperUpper(d, b, a);
    }
  }
  if constexpr (2 * kStep < kLanes) TransposeStage<2 * kStep>(d, v);
}

// ColumnOrder()[k]: the column v[k] holds after the stages, found by applying the
// stages' lane moves to column labels (the rows come out in lane order).
template <size_t kLanes, size_t kSize>
constexpr std::array<size_t, kLanes> ColumnOrder() {
  std::array<std::array<size_t, kLanes>, kLanes> label{};
  for (size_t k = 0; k < kLanes; ++k)
    for (size_t x = 0; x < kLanes; ++x) label[k][x] = x;
  for (size_t step = 1; step < kLanes; step *= 2) {
    const size_t block = 16 / kSize < kLanes ? 16 / kSize : kLanes;
    const size_t unit = step * kSize < 16 ? block : 2 * step;
    for (size_t k = 0; k < kLanes; ++k) {
      if (k & step) continue;
      const auto a = label[k], b = label[k + step];
      for (size_t base = 0; base < kLanes; base += unit) {
        for (size_t g = 0; g < unit / (2 * step); ++g) {
          for (size_t t = 0; t < step; ++t) {
            label[k][base + 2 * g * step + t] = a[base + g * step + t];
            label[k][base + (2 * g + 1) * step + t] = b[base + g * step + t];
            label[k + step][base + 2 * g * step + t] = a[base + unit / 2 + g * step + t];
            label[k + step][base + (2 * g + 1) * step + t] = b[base + unit / 2 + g * step + t];
          }
        }
      }
    }
  }
  std::array<size_t, kLanes> column{};
  for (size_t k = 0; k < kLanes; ++k) column[k] = label[k][0];
  return column;
}

// The inverse: RowOfColumn()[c] is the k with ColumnOrder()[k] == c.
template <size_t kLanes, size_t kSize>
constexpr std::array<size_t, kLanes> RowOfColumn() {
  const std::array<size_t, kLanes> column = ColumnOrder<kLanes, kSize>();
  std::array<size_t, kLanes> row{};
  for (size_t k = 0; k < kLanes; ++k) row[column[k]] = k;
  return row;
}

// Loads the kLanes x kLanes block at tile[j0.., i0..] (rows along j) and
// transposes it: v[k] then holds dst row i0 + ColumnOrder()[k], columns j0...
template <class D, class T, class V>
HWY_INLINE void LoadTransposed(D d, const T* HWY_RESTRICT tile, int64_t tile_stride, V* v) {
  constexpr size_t kLanes = hn::MaxLanes(D());
  for (size_t k = 0; k < kLanes; ++k, tile += tile_stride) v[k] = hn::LoadU(d, tile);
  TransposeStage<1>(d, v);
}

// dst[i * dst_stride + j] = tile[j * tile_stride + i] for the rows i < rows rounded
// down to whole blocks (returned) and j < cols. A dst row gets a whole 64-byte line
// at a time (kPerLine blocks side by side, stored back to back): with `stream`
// (non-temporal stores, used when dst rows are aligned to the vector size) a line
// left half-written while others are filled can be flushed to memory as a partial
// write, which measured up to 3x slower.
template <class D, class T>
int64_t TransposeBlocks(D d, const T* HWY_RESTRICT tile, int64_t tile_stride, T* HWY_RESTRICT dst, int64_t dst_stride,
                        int64_t rows, int64_t cols, bool stream) {
  using V = hn::Vec<D>;
  constexpr size_t kLanes = hn::MaxLanes(d);
  constexpr int64_t kN = static_cast<int64_t>(kLanes);
  static constexpr std::array<size_t, kLanes> kRowOf = RowOfColumn<kLanes, sizeof(T)>();
  constexpr size_t kVectorBytes = kLanes * sizeof(T);
  constexpr size_t kPerLine = kVectorBytes >= 64 ? 1 : 64 / kVectorBytes;
  constexpr int64_t kLineCols = kN * static_cast<int64_t>(kPerLine);
  // Stream writes at least HWY_STREAM_MULTIPLE bytes, more than a smaller vector.
  const bool aligned = stream && kVectorBytes >= HWY_STREAM_MULTIPLE &&
                       reinterpret_cast<uintptr_t>(dst) % kVectorBytes == 0 &&
                       (dst_stride * static_cast<int64_t>(sizeof(T))) % static_cast<int64_t>(kVectorBytes) == 0;
  const auto store = [&](V v, T* out) {
    if (aligned) {
      hn::Stream(v, d, out);
    } else {
      hn::StoreU(v, d, out);
    }
  };
  int64_t i0 = 0;
  for (; i0 + kN <= rows; i0 += kN) {
    int64_t j0 = 0;
    for (; j0 + kLineCols <= cols; j0 += kLineCols) {
      V v[kPerLine][kLanes];
      for (size_t b = 0; b < kPerLine; ++b) {
        LoadTransposed(d, tile + (j0 + static_cast<int64_t>(b) * kN) * tile_stride + i0, tile_stride, v[b]);
      }
      T* out = dst + i0 * dst_stride + j0;  // dst rows in order, v in column order
      for (size_t c = 0; c < kLanes; ++c, out += dst_stride) {
        for (size_t b = 0; b < kPerLine; ++b) store(v[b][kRowOf[c]], out + static_cast<int64_t>(b) * kN);
      }
    }
    for (; j0 + kN <= cols; j0 += kN) {
      V v[kLanes];
      LoadTransposed(d, tile + j0 * tile_stride + i0, tile_stride, v);
      T* out = dst + i0 * dst_stride + j0;
      for (size_t c = 0; c < kLanes; ++c, out += dst_stride) store(v[kRowOf[c]], out);
    }
    TransposeScalar(tile + j0 * tile_stride + i0, tile_stride, dst + i0 * dst_stride + j0, dst_stride, kN, cols - j0);
  }
  return i0;
}

// TransposeBlocks with blocks of kLanes (at most), then of half as many lanes for
// the rows left over, and so on down to 8-byte vectors (so that, e.g., 8 rows of
// floats still go through 8x8 blocks on AVX-512, and 8 rows of bytes through 8x8).
// Returns the rows done.
template <class T, size_t kLanes>
int64_t TransposeHalving(const T* HWY_RESTRICT tile, int64_t tile_stride, T* HWY_RESTRICT dst, int64_t dst_stride,
                         int64_t rows, int64_t cols, bool stream) {
  const hn::CappedTag<T, kLanes> d;
  int64_t done = TransposeBlocks(d, tile, tile_stride, dst, dst_stride, rows, cols, stream);
  constexpr size_t kHalf = hn::MaxLanes(d) / 2;
  if constexpr (kHalf >= 2 && kHalf * sizeof(T) >= 8) {
    done += TransposeHalving<T, kHalf>(tile + done, tile_stride, dst + done * dst_stride, dst_stride, rows - done, cols,
                                       stream);
  }
  return done;
}

// dst[i * dst_stride + j] = tile[j * tile_stride + i] for i < rows, j < cols.
template <class T>
void TransposeTileT(const T* HWY_RESTRICT tile, int64_t tile_stride, T* HWY_RESTRICT dst, int64_t dst_stride,
                    int64_t rows, int64_t cols, bool stream) {
  const int64_t done =
      TransposeHalving<T, hn::MaxLanes(BlockTag<T>())>(tile, tile_stride, dst, dst_stride, rows, cols, stream);
  TransposeScalar(tile + done, tile_stride, dst + done * dst_stride, dst_stride, rows - done, cols);
}

#endif  // HWY_TARGET == HWY_SCALAR

// dst[0, bytes) = src[0, bytes) with non-temporal stores where dst is aligned to
// the vector size; the unaligned head and the tail use plain stores.
void StreamCopy(uint8_t* HWY_RESTRICT dst, const uint8_t* HWY_RESTRICT src, int64_t bytes) {
#if HWY_TARGET == HWY_SCALAR
  std::memcpy(dst, src, static_cast<size_t>(bytes));
#else
  const hn::ScalableTag<uint8_t> d;
  const auto n = static_cast<int64_t>(hn::Lanes(d));
  int64_t head = static_cast<int64_t>((n - reinterpret_cast<uintptr_t>(dst) % static_cast<uintptr_t>(n)) %
                                      static_cast<uintptr_t>(n));
  head = head < bytes ? head : bytes;
  std::memcpy(dst, src, static_cast<size_t>(head));
  int64_t i = head;
  for (; i + 2 * n <= bytes; i += 2 * n) {
    const auto a = hn::LoadU(d, src + i), b = hn::LoadU(d, src + i + n);
    hn::Stream(a, d, dst + i);
    hn::Stream(b, d, dst + i + n);
  }
  for (; i + n <= bytes; i += n) hn::Stream(hn::LoadU(d, src + i), d, dst + i);
  std::memcpy(dst + i, src + i, static_cast<size_t>(bytes - i));
#endif
}

// Exported per element width (HWY_EXPORT takes no templates).
void TransposeTile8(const uint8_t* tile, int64_t tile_stride, uint8_t* dst, int64_t dst_stride, int64_t rows,
                    int64_t cols, bool stream) {
  TransposeTileT(tile, tile_stride, dst, dst_stride, rows, cols, stream);
}
void TransposeTile16(const uint16_t* tile, int64_t tile_stride, uint16_t* dst, int64_t dst_stride, int64_t rows,
                     int64_t cols, bool stream) {
  TransposeTileT(tile, tile_stride, dst, dst_stride, rows, cols, stream);
}
void TransposeTile32(const uint32_t* tile, int64_t tile_stride, uint32_t* dst, int64_t dst_stride, int64_t rows,
                     int64_t cols, bool stream) {
  TransposeTileT(tile, tile_stride, dst, dst_stride, rows, cols, stream);
}
void TransposeTile64(const uint64_t* tile, int64_t tile_stride, uint64_t* dst, int64_t dst_stride, int64_t rows,
                     int64_t cols, bool stream) {
  TransposeTileT(tile, tile_stride, dst, dst_stride, rows, cols, stream);
}

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // include guard
