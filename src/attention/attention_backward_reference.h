// The float64 attention-backward oracle (attention_backward_reference.cc) as a kernel
// the dispatcher (attention_backward.cc) can pick.
#pragma once

#include "attention/problem.h"
#include "qkv/attention_backward.h"

namespace qkv::attention {

// attention_backward_reference (qkv/attention_backward.h) of a checked problem;
// `grad_out` has been checked to have the output's shape [batch..., Lq, Dv].
AttentionGradients reference_attention_backward(const Problem& p, const Tensor& grad_out,
                                                const AttentionOptions& options);

// ShapeError naming p.op unless `t` ("grad_out", "out", "logsumexp") has `expected`.
void check_saved_shape(const Problem& p, const Tensor& t, const Shape& expected, const char* name);

}  // namespace qkv::attention
