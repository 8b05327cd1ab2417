// The float64 attention oracle (attention_reference.cc) as a kernel the dispatcher can
// call: attention_reference (scaled_dot_product_attention runs the fused kernels, Dk == 0 too).
#pragma once

#include "attention/problem.h"
#include "qkv/attention.h"

namespace qkv::attention {

// attention_reference (qkv/attention.h) of a checked problem; an interrupt
// names p.op.
AttentionResult reference_attention(const Problem& p, const AttentionOptions& options);

}  // namespace qkv::attention
