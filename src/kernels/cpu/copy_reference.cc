// The copy engine's reference (copy.h): one element at a time, in row-major order
// of the given dims, on one thread, through convert_element.
#include <cstddef>

#include "kernels/cpu/copy.h"
#include "kernels/cpu/strided_walk.h"

namespace qkv::kernels {

void strided_copy_reference(std::span<const int64_t> shape, const CopySrc& src, const CopyDst& dst) {
  WalkDims<2> dims;
  for (size_t d = 0; d < shape.size(); ++d) dims.push_back({shape[d], {src.strides[d], dst.strides[d]}});
  const int64_t n = walk_count<2>(dims);
  dispatch_dtype(dst.dtype, [&](auto to_tag) {
    using To = typename decltype(to_tag)::type;
    dispatch_dtype(src.dtype, [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      const auto* s = static_cast<const From*>(src.data);
      auto* d = static_cast<To*>(dst.data);
      if (n > 0) {
        for_each_walk_offset<2>(dims, 0, n,
                                [&](const WalkOffsets<2>& off) { d[off[1]] = convert_element<To>(s[off[0]]); });
      }
    });
  });
}

}  // namespace qkv::kernels
