// The copy engine's entry point (copy.h): plans the loop nest once and hands it
// to the kernels of copy_cpu.cc.
#include "kernels/cpu/copy.h"

#include <algorithm>
#include <cstdlib>

#include "kernels/cpu/copy_cpu.h"

namespace qkv::kernels {

namespace {

// The dims in the order dst is written (decreasing |dst stride|; the stable sort
// keeps row-major order among equal strides, zero strides included), coalesced.
// Walking dst in its own order lets the kernels treat any dst layout, a slice or a
// permuted view, like the contiguous one: rows along its stride-1 dim.
detail::CopyDims plan_copy(std::span<const int64_t> shape, std::span<const int64_t> src, std::span<const int64_t> dst) {
  detail::CopyDims dims;
  for (size_t d = 0; d < shape.size(); ++d) dims.push_back({shape[d], {src[d], dst[d]}});
  std::stable_sort(dims.begin(), dims.end(), [](const WalkDim<2>& a, const WalkDim<2>& b) {
    return std::abs(a.stride[1]) > std::abs(b.stride[1]);
  });
  return coalesce_walk<2>(dims);
}

}  // namespace

void strided_copy(std::span<const int64_t> shape, const CopySrc& src, const CopyDst& dst) {
  for (const int64_t n : shape) {
    if (n == 0) return;
  }
  const detail::CopyDims dims = plan_copy(shape, src.strides, dst.strides);
  if (src.dtype == dst.dtype) {
    detail::copy_same_width(dims, itemsize(src.dtype), src.data, dst.data);
  } else {
    detail::copy_converting(dims, src.dtype, src.data, dst.dtype, dst.data);
  }
}

}  // namespace qkv::kernels
