// Permuted (strided -> contiguous) copies: the kernel behind einops' copies.
#pragma once

#include "qkv/tensor.h"

namespace qkv::kernels {

// dst[i...] = src[i...]. dst must be contiguous with src's shape and dtype; src may
// have any strides (zero strides broadcast). Large results are best allocated with
// kernels::empty_pooled (kernels/cpu/buffer_pool.h). Dims are coalesced first; then either
// contiguous rows are copied, or, when src's stride-1 dim is not dst's last dim,
// cache-blocked 2-D tiles between those two dims are transposed in SIMD blocks.
// Results of 8 MB and more are written with non-temporal stores either way. Work is
// split over qkv::parallel_for. Bit-exact copy of every dtype (by element width).
void permuted_copy(const Tensor& src, const Tensor& dst);

// The same result, one element at a time in row-major order on one thread: the
// reference the blocked kernel is tested against.
void permuted_copy_reference(const Tensor& src, const Tensor& dst);

}  // namespace qkv::kernels
