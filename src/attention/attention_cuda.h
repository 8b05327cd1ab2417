// The CUDA kernels of attention (attention_cuda.cc, attention_cuda_kernel.cu): the
// dispatcher (attention.cc, attention_varlen.cc) calls them for tensors on cuda:N.
// A build without the CUDA backend defines them in attention_cuda_none.cc, where they
// throw DeviceError (no kernel for the device).
#pragma once

#include <cstdint>
#include <vector>

#include "attention/attention_cuda_kernel.h"
#include "attention/problem.h"
#include "qkv/attention.h"

namespace qkv::attention {

// FlashAttention-2 forward on the GPU for a checked problem: bf16 or f16 q, k, v
// (float32 accumulation), Dk == Dv in {64, 128}, any Lq and Lk, masks (bool or
// floating), is_causal, GQA, scale, return_logsumexp. ValueError / DTypeError naming
// p.op for what the kernel does not do (dropout, return_weights, score modifiers,
// other dtypes or head dims).
AttentionResult flash_attention_cuda(const Problem& p, const AttentionOptions& options);

// Shared with the backward (attention_backward_cuda.cc):
// What the kernels compute: ValueError / DTypeError naming `op` and the device for
// dropout, return_weights, score modifiers, other dtypes or head dims.
void check_supported(const char* op, const AttentionOptions& o, const Tensor& q, const Tensor& k, const Tensor& v,
                     int64_t dk, int64_t dv);
// `t` itself when its rows suit the kernels' 16-byte loads, else a contiguous copy on its device.
Tensor kernel_layout(const Tensor& t);
// The forward's launch parameters of a batched problem (q, k, v, the mask, geometry,
// scale, causal); `out` [batch..., Lq, Dv], `lse` [batch..., Lq] or null. ValueError
// beyond kMaxBatchDims leading dims.
cuda_kernel::FlashParams params_of(const Problem& p, bool causal, const Tensor& out, const Tensor* lse);

// A checked variable-length call (attention_varlen.cc): sequences packed along dim 0.
struct VarlenProblem {
  const char* op = "";
  Tensor q, k, v;                   // [Tq, Hq, D], [Tk, Hk, D], [Tk, Hk, Dv]
  std::vector<int32_t> cu_q, cu_k;  // [N + 1] row starts (host copies)
  int64_t hq = 0, hk = 0, dk = 0, dv = 0;
  int64_t max_lq = 0;
  double scale = 1.0;
};

// Output [Tq, Hq, Dv] in q's dtype, logsumexp [Hq, Tq] (float32) when asked for.
AttentionResult flash_attention_varlen_cuda(const VarlenProblem& p, const AttentionOptions& options);

}  // namespace qkv::attention
