// The CUDA kernels of attention in a build without the CUDA backend: none.
#include "attention/attention_cuda.h"

namespace qkv::attention {

AttentionResult flash_attention_cuda(const Problem& p, const AttentionOptions&) { fail_no_kernel(p.op, p.device); }

AttentionResult flash_attention_varlen_cuda(const VarlenProblem& p, const AttentionOptions&) {
  fail_no_kernel(p.op, p.q.device());
}

}  // namespace qkv::attention
