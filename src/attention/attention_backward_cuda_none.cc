// The CUDA kernel of the attention backward in a build without the CUDA backend: none.
#include "attention/attention_backward_cuda.h"

namespace qkv::attention {

AttentionGradients flash_attention_backward_cuda(const Problem& p, const Tensor&, const Tensor&, const Tensor&,
                                                 const AttentionOptions&) {
  fail_no_kernel(p.op, p.device);
}

}  // namespace qkv::attention
