// Result buffers for einsum: large ones are 2 MB aligned, advised as transparent
// huge pages, and recycled through a small pool, so that a loop of einsum calls
// (attention scores of 100 MB per call) does not page-fault and zero fresh memory
// on every call. Small ones come from Tensor::empty.
#pragma once

#include "qkv/tensor.h"

namespace qkv::einsum_detail {

// An uninitialised contiguous tensor; its storage returns to the pool when the
// last view of it dies (the pool keeps at most 4 buffers, 1 GiB in all).
Tensor pooled_empty(const Shape& shape, DType dtype);

}  // namespace qkv::einsum_detail
