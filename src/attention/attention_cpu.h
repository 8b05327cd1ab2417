// The fused CPU attention forward (attention_cpu.cc): FlashAttention-2's schedule on
// qkv::gemm tiles. Internal: users call qkv::scaled_dot_product_attention.
#pragma once

#include "attention/problem.h"
#include "qkv/attention.h"

namespace qkv::attention {

// Same contract as scaled_dot_product_attention (qkv/attention.h) for a checked
// problem with Dk >= 1: f32, f16 and bf16 inputs computed in float32 (f16/bf16
// converted to f32 once, whole tensors, and the results converted back to q's
// dtype), f64 inputs in float64 (OpenBLAS tile GEMMs, double row kernels). Never
// materialises the [Lq, Lk] scores unless return_weights asks for them (a
// second fused pass). Tiles from options.tuning (flash_tiles.h).
AttentionResult flash_attention_cpu(const Problem& p, const AttentionOptions& options);

}  // namespace qkv::attention
