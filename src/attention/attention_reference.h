// The float64 attention oracle (attention_reference.cc) as a kernel the dispatcher can
// pick: scaled_dot_product_attention runs it for f64 inputs and Dk == 0.
#pragma once

#include "attention/problem.h"
#include "qkv/attention.h"

namespace qkv::attention {

// attention_reference (qkv/attention.h) of a checked problem; an interrupt
// names p.op.
AttentionResult reference_attention(const Problem& p, const AttentionOptions& options);

}  // namespace qkv::attention
