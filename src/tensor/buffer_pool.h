// Result buffers of the ops that write large new tensors (einsum, einops' copies):
// buffers of 4 MB and more are 2 MB aligned, advised as transparent huge pages (as
// numpy does for its arrays), and recycled through a small pool, so that a loop of
// calls (attention scores of 100 MB per call, a rearrange per layer) does not
// page-fault and zero fresh memory on every call: for a 64 MB copy that alone is 40%
// of the time. Small buffers come from Tensor::empty.
#pragma once

#include "qkv/tensor.h"

namespace qkv::kernels {

// An uninitialised contiguous tensor; its storage returns to the pool when the
// last view of it dies (the pool keeps at most 4 buffers, 1 GiB in all, and hands
// out a buffer for a request of at least half its size). Sizes are checked first
// (qkv/size.h: OutOfMemoryError naming the AllocationScope's op and `role`).
Tensor empty_pooled(const Shape& shape, DType dtype, const char* role = "output");

}  // namespace qkv::kernels
