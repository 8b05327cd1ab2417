// The layers' attention= choice (qkv/nn/layer_attention.h): the checks and the call of the
// linear and LSH variants on projected heads, shared by MultiheadAttention and
// KerasMultiHeadAttention.
#pragma once

#include <initializer_list>
#include <utility>

#include "qkv/nn/layer_attention.h"
#include "qkv/tensor.h"

namespace qkv::nn::detail {

// Same view of the same memory (PyTorch tests `query is key`).
bool same_tensor(const Tensor& a, const Tensor& b);

// ValueError "<op>: attention=<kind> ... <what>" for the first option the call sets that the
// choice cannot honour ({set, what} pairs), e.g. {o.attn_mask.has_value(), "attn_mask"}.
void refuse_unsupported(const char* op, const LayerAttention& a,
                        std::initializer_list<std::pair<bool, const char*>> unsupported);

// lsh takes the query projection as Reformer's shared query-key: ValueError unless the call is
// self-attention (`self`; `self_means` says which inputs must be the query itself).
void require_self_attention(const char* op, const LayerAttention& a, bool self, const char* self_means);

// The choice on heads q [..., Lq, D], k [..., Lk, D], v [..., Lk, Dv] -> [..., Lq, Dv]; `causal`
// ORs into the choice's is_causal (Keras' use_causal_mask). lsh: q is the shared query-key and
// k is not read (the caller checks that the call is self-attention).
Tensor variant_attention(const LayerAttention& a, const Tensor& q, const Tensor& k, const Tensor& v, bool causal);

}  // namespace qkv::nn::detail
