// scaled_dot_product_attention: picks the kernel for the inputs and options.
#include "attention/flash_cpu.h"
#include "attention/problem.h"
#include "qkv/attention.h"

namespace qkv {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

// f64 inputs keep float64 arithmetic (the reference); its logsumexp, which the
// reference does not produce, comes from the fused kernel on f32 copies.
AttentionResult sdpa_f64(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options) {
  AttentionResult r = attention_reference(q, k, v, options);
  if (options.return_logsumexp) {
    AttentionOptions o = options;
    o.return_weights = false;
    o.dropout_p = 0.0;
    r.logsumexp =
        attention::flash_attention_cpu(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), o, kOp).logsumexp;
  }
  return r;
}

}  // namespace

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options) {
  // The shared checks first, so that every path reports errors under this name.
  const attention::Problem p = attention::make_problem(q, k, v, options, kOp);
  // Dk == 0: the reference's 0 * (1/sqrt(0)) scores, which the GEMM tiles would not reproduce.
  if (p.out_dtype == DType::f64 || p.dk == 0) return sdpa_f64(q, k, v, options);
  return attention::flash_attention_cpu(q, k, v, options, kOp);
}

}  // namespace qkv
