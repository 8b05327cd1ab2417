// The CUDA kernel of the attention backward (attention_backward_cuda.cc,
// attention_backward_cuda_kernel.cu): the dispatcher (attention_backward.cc) calls it for
// tensors on cuda:N. A build without the CUDA backend defines it in
// attention_backward_cuda_none.cc, where it throws DeviceError (no kernel for the device).
#pragma once

#include "attention/problem.h"
#include "qkv/attention_backward.h"

namespace qkv::attention {

// FlashAttention-2's backward on the GPU for a checked problem, from the forward's saved
// `out` [batch..., Lq, Dv] (q's dtype), `logsumexp` [batch..., Lq] (float32, natural log,
// as the GPU forward returns it) and `grad_out` (out's shape and dtype), all on q's
// device (the dispatcher checked the shapes and devices). What the forward kernel takes
// (flash_attention_cuda) but dropout: ValueError / DTypeError naming p.op otherwise.
// The gradients have the shapes of q, k, v and q's dtype.
AttentionGradients flash_attention_backward_cuda(const Problem& p, const Tensor& out, const Tensor& grad_out,
                                                 const Tensor& logsumexp, const AttentionOptions& options);

}  // namespace qkv::attention
