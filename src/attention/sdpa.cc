// scaled_dot_product_attention: picks the kernel for the inputs and options.
#include "qkv/attention.h"

namespace qkv {

AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options) {
  // Only the reference exists today; the fused CPU kernel takes over every
  // option it supports when it lands (its issue), keeping these semantics.
  return attention_reference(q, k, v, options);
}

}  // namespace qkv
