// scaled_dot_product_attention_backward: checks the call once (the forward's
// make_problem plus the saved tensors' shapes), then picks the kernel by device.
#include "qkv/attention_backward.h"
#include "attention/attention_backward_cpu.h"
#include "attention/attention_backward_cuda.h"
#include "attention/attention_backward_reference.h"
#include "attention/problem.h"

namespace qkv {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention_backward";

}  // namespace

AttentionGradients scaled_dot_product_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                         const Tensor& out, const Tensor& grad_out,
                                                         const Tensor& logsumexp, const AttentionOptions& options) {
  const attention::CallScope scope(kOp, q, k, v, options);  // names the call in out-of-memory errors
  const attention::Problem p = attention::make_problem(q, k, v, options, kOp);
  if (options.mods.score_mod || options.mods.masked_fill) {
    fail<ValueError>(kOp, ": mods.score_mod and mods.masked_fill have no backward (qkv/attention_mods.h)");
  }
  if (options.qk_quantization != QKQuantization::none) {
    fail<ValueError>(kOp, ": qk_quantization (int8 Q K^T) has no backward; differentiate the float32 forward");
  }
  Shape out_shape = p.batch, lse_shape = p.batch;  // [batch..., Lq, Dv], [batch..., Lq]
  out_shape.insert(out_shape.end(), {p.lq, p.dv});
  lse_shape.push_back(p.lq);
  attention::check_saved_shape(p, out, out_shape, "out");
  attention::check_saved_shape(p, grad_out, out_shape, "grad_out");
  attention::check_saved_shape(p, logsumexp, lse_shape, "logsumexp");
  // The saved tensors live where q does (a DeviceError naming both devices otherwise).
  (void)common_device(kOp, {&q, &out, &grad_out, &logsumexp});
  switch (p.device.kind) {
    case DeviceKind::cpu:
      require_cpu(kOp, {&out, &grad_out, &logsumexp});
      // The fused FlashAttention-2 backward (f64 in float64, the rest in float32). Dk == 0:
      // every score is the empty sum 0 and dq, dk are empty; dv from the fused kernel on one
      // zero column (as the forward), not the single-threaded float64 reference.
      if (p.dk == 0) {
        AttentionOptions zero = options;
        const attention::Problem z = attention::zero_dk_problem(q, k, v, zero, kOp);
        const AttentionGradients g = attention::flash_attention_backward_cpu(z, out, grad_out, logsumexp, zero);
        return {Tensor::zeros(q.shape(), q.dtype()), Tensor::zeros(k.shape(), k.dtype()), g.dv};
      }
      return attention::flash_attention_backward_cpu(p, out, grad_out, logsumexp, options);
    case DeviceKind::cuda: return attention::flash_attention_backward_cuda(p, out, grad_out, logsumexp, options);
  }
  fail_no_kernel(kOp, p.device);
}

}  // namespace qkv
