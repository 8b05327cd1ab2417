// The fused CPU attention backward (attention_backward_cpu.cc): FlashAttention-2's
// backward on qkv::gemm tiles. Internal: users call
// qkv::scaled_dot_product_attention_backward.
#pragma once

#include "attention/problem.h"
#include "qkv/attention_backward.h"

namespace qkv::attention {

// Same contract as scaled_dot_product_attention_backward (qkv/attention_backward.h)
// for a checked problem with Dk >= 1 whose out, grad_out and logsumexp have been
// checked to have the forward's shapes. f64 in float64; f32, f16 and bf16 in float32
// (16-bit q, k, v, out and grad_out converted to f32 once, whole tensors); gradients
// returned in the inputs' dtypes. Never materialises [Lq, Lk].
AttentionGradients flash_attention_backward_cpu(const Problem& p, const Tensor& out, const Tensor& grad_out,
                                                const Tensor& logsumexp, const AttentionOptions& options);

}  // namespace qkv::attention
