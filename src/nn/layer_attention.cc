// The layers' attention= choice (qkv/nn/layer_attention.h, nn/layer_attention.h).
#include "nn/layer_attention.h"

#include "qkv/error.h"

namespace qkv::nn {

const char* attention_kind_name(AttentionKind kind) {
  switch (kind) {
    case AttentionKind::softmax: return "softmax";
    case AttentionKind::linear: return "linear";
    case AttentionKind::lsh: return "lsh";
  }
  return "unknown";
}

namespace detail {

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.shares_storage(b) && a.offset() == b.offset() && a.shape() == b.shape() && a.strides() == b.strides() &&
         a.dtype() == b.dtype();
}

void refuse_unsupported(const char* op, const LayerAttention& a,
                        std::initializer_list<std::pair<bool, const char*>> unsupported) {
  for (const auto& [set, what] : unsupported) {
    if (set) {
      fail<ValueError>(op, ": attention=", attention_kind_name(a.kind), " does not support ", what);
    }
  }
}

void require_self_attention(const char* op, const LayerAttention& a, bool self, const char* self_means) {
  if (a.kind == AttentionKind::lsh && !self) {
    fail<ValueError>(op,
                     ": attention=lsh uses the query projection as Reformer's shared query-key, so the call must be "
                     "self-attention (",
                     self_means, ")");
  }
}

Tensor variant_attention(const LayerAttention& a, const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  if (a.kind == AttentionKind::linear) {
    LinearAttentionOptions o = a.linear;
    o.is_causal = o.is_causal || causal;
    return linear_attention(q, k, v, o);  // [..., Lq, Dv]
  }
  LshAttentionOptions o = a.lsh;  // AttentionKind::lsh: q is the shared query-key
  o.is_causal = o.is_causal || causal;
  return lsh_attention(q, v, o);  // [..., L, Dv]
}

}  // namespace detail
}  // namespace qkv::nn
