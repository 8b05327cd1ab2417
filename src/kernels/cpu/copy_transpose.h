// SIMD pieces of the copy engine (copy_cpu.cc; copy_transpose-inl.h, dispatched at run time
// to the best target the CPU supports).
#pragma once

#include <cstddef>
#include <cstdint>

namespace qkv::kernels::detail {

// dst[i * dst_stride + j] = tile[j * tile_stride + i] for i < rows, j < cols, on
// elements of `width` bytes (1, 2, 4 or 8); strides count elements. With `stream`
// the stores bypass the cache where dst allows it; call stream_fence() before
// another thread reads dst.
void transpose_tile(size_t width, const void* tile, int64_t tile_stride, void* dst, int64_t dst_stride, int64_t rows,
                    int64_t cols, bool stream);

// memcpy with non-temporal stores (where dst is aligned to the vector size): for
// copies whose destination will not be read again while it would still be cached.
void stream_copy(void* dst, const void* src, int64_t bytes);

// Orders earlier non-temporal stores of this thread before its later stores.
void stream_fence();

}  // namespace qkv::kernels::detail
