// Internal to linear attention (qkv/linear_attention.h): the checked problem shared by the
// dispatcher (linear_attention.cc), the CPU kernel (linear_attention_cpu.cc) and the
// reference (linear_attention_reference.cc).
#pragma once

#include <cstdint>

#include "qkv/linear_attention.h"

namespace qkv::attention {

struct LinearProblem {
  int64_t batch = 1, lq = 0, lk = 0, d = 0, dv = 0;
  Shape out_shape;  // [..., Lq, Dv]
  DType out_dtype;  // q's
  Tensor q, k, v;   // contiguous [batch, L, D|Dv] in the compute dtype (f32 or f64)
};

// Checks q, k, v and the options (errors name `op` and the shapes) and lays the operands out
// in `compute` (f32 or f64).
LinearProblem make_linear_problem(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const LinearAttentionOptions& options, const char* op, DType compute);

// The fused kernel: [batch, Lq, Dv] in the problem's compute dtype.
Tensor linear_attention_cpu(const LinearProblem& p, const LinearAttentionOptions& options);

}  // namespace qkv::attention
