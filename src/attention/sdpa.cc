// scaled_dot_product_attention: picks the kernel for the inputs and options.
#include "attention/flash_cpu.h"
#include "attention/problem.h"
#include "qkv/attention.h"

namespace qkv {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

}  // namespace

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options) {
  // The shared checks first, so that every path reports errors under this name.
  const attention::Problem p = attention::make_problem(q, k, v, options, kOp);
  // f64 inputs keep float64 arithmetic (the reference, which also gives their
  // logsumexp in float64). Dk == 0: every score is the empty sum 0 (whatever the
  // scale, 1/sqrt(0) by default), which the reference spells out.
  if (p.out_dtype == DType::f64 || p.dk == 0) return attention_reference(q, k, v, options);
  return attention::flash_attention_cpu(q, k, v, options, kOp);
}

}  // namespace qkv
