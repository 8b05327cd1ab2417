// Reductions over trailing axes for einops.reduce.
#pragma once

#include <cstdint>
#include <string_view>

#include "qkv/einops.h"
#include "qkv/tensor.h"

namespace qkv::einops_detail {

// Reduces x [k0..k{n_kept-1}, r0, r1, ...] over every dim from n_kept on, giving a
// contiguous [k0..k{n_kept-1}]. Result dtypes
// follow numpy: sum/prod of bool and integers -> int64, any/all -> bool, else x's
// dtype. Floats accumulate in double. mean of a non-float tensor -> DTypeError;
// max/min over zero elements -> ShapeError. NaN propagates through max/min.
Tensor reduce_trailing(const Tensor& x, int64_t n_kept, einops::Reduction op);

}  // namespace qkv::einops_detail
