// The CPU kernels of the copy engine (copy_cpu.cc), called by strided_copy (copy.cc)
// once it has planned the loop nest.
#pragma once

#include <cstddef>

#include "kernels/cpu/strided_walk.h"
#include "qkv/dtype.h"

namespace qkv::kernels::detail {

// A planned copy: dims in the order dst is written (decreasing |dst stride|),
// coalesced, every size >= 1; stride[0] is src's, stride[1] dst's, in elements.
using CopyDims = WalkDims<2>;

// Bit-exact copy of elements `width` bytes wide (1, 2, 4 or 8): rows or SIMD tiles.
void copy_same_width(const CopyDims& dims, size_t width, const void* src, void* dst);

// Element-wise conversion from `from` to `to` (convert_element), row by row.
void copy_converting(const CopyDims& dims, DType from, const void* src, DType to, void* dst);

}  // namespace qkv::kernels::detail
