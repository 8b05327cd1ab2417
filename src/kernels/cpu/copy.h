// The copy engine: every element-wise copy between strided arrays in qkv
// (Tensor::copy_from and through it contiguous, clone, reshape, to(dtype), fill;
// einops' and einsum's copies). Raw pointers and strides, no Tensor: it sits below
// the tensor layer.
#pragma once

#include <cstdint>
#include <span>

#include "qkv/dtype.h"

namespace qkv::kernels {

// One side of a copy: the address of element [0, ..., 0], its dtype, and an element
// stride per dim of the copy's shape (any sign; zero strides broadcast a source).
struct CopySrc {
  const void* data;
  DType dtype;
  std::span<const int64_t> strides;
};
struct CopyDst {
  void* data;
  DType dtype;
  std::span<const int64_t> strides;
};

// dst[i...] = convert_element<dst dtype>(src[i...]) for every multi-index i of `shape`
// (qkv/dtype.h's conversion; a bit-exact copy when the dtypes are equal). The
// arrays must not overlap unless they are the same elements. Callers check shapes,
// strides and writability (Tensor::copy_from does).
//
// How (copy.cc, copy_cpu.cc): dims are reordered by decreasing |dst stride| (the
// order dst is written in), size-1 dims dropped and dims merged where both sides
// allow. Same dtype: rows along dst's stride-1 dim are memcpy'd when src is also
// contiguous along it; when src's stride-1 dim is another one, cache-blocked 2-D
// tiles between the two are transposed in SIMD blocks (copy_transpose-inl.h); results of
// 8 MB and more are written with non-temporal stores. Different dtypes: rows are
// converted element by element. Work is split over qkv::parallel_for.
void strided_copy(std::span<const int64_t> shape, const CopySrc& src, const CopyDst& dst);

// The same result, one element at a time in row-major order on one thread: the
// reference the engine is tested against (copy_reference.cc).
void strided_copy_reference(std::span<const int64_t> shape, const CopySrc& src, const CopyDst& dst);

}  // namespace qkv::kernels
