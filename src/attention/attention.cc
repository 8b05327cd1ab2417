// scaled_dot_product_attention: checks the call once, then picks the kernel by
// the inputs' device and dtype and hands it the checked problem.
#include "qkv/attention.h"
#include "attention/attention_cpu.h"
#include "attention/attention_cuda.h"
#include "attention/problem.h"

namespace qkv {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention";

}  // namespace

MatmulPrecision matmul_precision_from_name(std::string_view name, std::string_view what) {
  if (name == "highest") return MatmulPrecision::highest;
  if (name == "high") return MatmulPrecision::high;
  if (name == "medium") return MatmulPrecision::medium;
  fail<ValueError>(what, " must be 'highest', 'high' or 'medium', got '", name, "'");
}

QKQuantization qk_quantization_from_name(std::string_view name) {
  if (name == "none") return QKQuantization::none;
  if (name == "int8") return QKQuantization::int8;
  if (name == "int8_unsmoothed") return QKQuantization::int8_unsmoothed;
  fail<ValueError>(kOp, ": qk_quantization must be 'none', 'int8' or 'int8_unsmoothed', got '", name, "'");
}

std::string_view qk_quantization_name(QKQuantization quantization) {
  switch (quantization) {
    case QKQuantization::int8: return "int8";
    case QKQuantization::int8_unsmoothed: return "int8_unsmoothed";
    case QKQuantization::none: break;
  }
  return "none";
}

std::string_view matmul_precision_name(MatmulPrecision precision) {
  switch (precision) {
    case MatmulPrecision::high: return "high";
    case MatmulPrecision::medium: return "medium";
    case MatmulPrecision::highest: break;
  }
  return "highest";
}

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options) {
  const attention::CallScope scope(kOp, q, k, v, options);  // names the call in out-of-memory errors
  // The one check of the call: every kernel reports errors under this name.
  const attention::Problem p = attention::make_problem(q, k, v, options, kOp);
  // The kernel by device, then dtype (docs/architecture.md, "Devices and backends").
  switch (p.device.kind) {
    case DeviceKind::cpu:
      // f32/f16/bf16 run the fused kernel in float32, f64 in float64 (its logsumexp in
      // float64 too). Dk == 0: every score is the empty sum 0 (whatever the scale, 1/sqrt(0)
      // by default): the fused kernel on one zero column. The float64 reference it took
      // before held every [Lq, Lk] weight in float64 whether asked for or not (a MemoryError
      // at (16, 16, 8192, 0) for a 512 MiB output; 28 s, 8 GiB and no Ctrl-C at (8, 8, 4096, 0)).
      if (p.dk == 0) {
        AttentionOptions zero = options;
        return attention::flash_attention_cpu(attention::zero_dk_problem(q, k, v, zero, kOp), zero);
      }
      return attention::flash_attention_cpu(p, options);
    case DeviceKind::cuda:
      return attention::flash_attention_cuda(p, options);  // bf16/f16, FlashAttention-2 (docs/cuda.md)
  }
  fail_no_kernel(kOp, p.device);
}

}  // namespace qkv
