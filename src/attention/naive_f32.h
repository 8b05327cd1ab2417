// A plain, unfused float32 attention: the yardstick of FlashAttention's numerical
// criterion (tests/attention/attention_cpu_test.cc: the fused kernel's error against
// float64 must be at most twice this one's). Used only by tests.
#pragma once

#include "qkv/attention.h"

namespace qkv::attention {

// Same contract as attention_reference (qkv/attention.h), computed the unfused
// way in float32, as PyTorch's math path and FlashAttention's attention_ref:
// the whole [Lq, Lk] score matrix scale * q k^T (one qkv::gemm per batch
// entry), mask, softmax per row with std::exp and float sums, dropout, then
// weights @ v (qkv::gemm). Returns f32 output and (always) f32 weights.
AttentionResult attention_naive_f32(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options);

}  // namespace qkv::attention
