// The fused CPU attention forward (attention_cpu.cc): FlashAttention-2's schedule on
// qkv::gemm tiles. Internal: users call qkv::scaled_dot_product_attention.
#pragma once

#include "attention/problem.h"
#include "qkv/attention.h"

namespace qkv::attention {

// Same contract as scaled_dot_product_attention (qkv/attention.h) for a checked
// problem with Dk >= 1: f32 inputs computed in float32; f16 and bf16 inputs in their
// type (tile GEMMs on the 16-bit operands with float32 accumulation where qkv::gemm has
// a native kernel, else on float32 tiles widened per tile; softmax and the output
// accumulator in float32, the output rounded to q's dtype, logsumexp float32); f64
// inputs in float64 (OpenBLAS tiles, double row kernels). Never materialises the
// [Lq, Lk] scores unless return_weights asks for them (a second fused pass). Tiles
// from options.tuning (flash_tiles.h).
AttentionResult flash_attention_cpu(const Problem& p, const AttentionOptions& options);

}  // namespace qkv::attention
