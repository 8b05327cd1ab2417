// Ulysses attention (DeepSpeed-Ulysses; Jacobs et al. 2023): sequence-sharded q, k, v are
// re-split by heads with one all-to-all, each rank runs the fused kernel on whole
// sequences of its heads, and a second all-to-all returns the output to sequence shards.
//
// Heads are split evenly over ranks (the first H % P ranks one more; a rank may get none
// when H < P). With GQA (Hq = g Hk) the key/value heads are split and each rank takes the
// g query heads of each of its key/value heads; when Hk < P the key/value heads are
// replicated to Hq first (as Megatron replicates them), so every rank has work.
#pragma once

#include <optional>

#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/dist/communicator.h"
#include "qkv/dist/shard.h"

namespace qkv::dist {

struct UlyssesAttentionOptions {
  bool is_causal = false;
  SequenceLayout layout = SequenceLayout::contiguous;  // how q, k and v were sharded
  std::optional<double> scale;
  bool enable_gqa = false;
  // Over the whole sequence: [Lq, Lk] or [..., 1 or Hq, Lq, Lk] (bool True = attend, or additive).
  std::optional<Tensor> attn_mask;
  MatmulPrecision matmul_precision = MatmulPrecision::highest;
};

// q [B, Hq, Lq_r, D], k [B, Hk, Lk_r, D], v [B, Hk, Lk_r, Dv] (f32): this rank's shards
// along the sequence axis in `options.layout`. Returns this rank's rows [B, Hq, Lq_r, Dv].
Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Communicator& comm,
                         const UlyssesAttentionOptions& options = {});

// Backward of ulysses_attention: this rank's dq, dk, dv ([q, k, v]'s shapes) given grad_out
// = d loss / d output (this rank's rows) and the forward's options. The same all-to-alls
// (q, k, v and grad_out to heads; dq, dk, dv back); each rank recomputes the forward on its
// heads for their output and logsumexp (activation recomputation, as Megatron does for
// attention) and runs the fused backward. Replicated key/value heads sum their gradients.
AttentionGradients ulysses_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
                                              const Communicator& comm, const UlyssesAttentionOptions& options = {});

}  // namespace qkv::dist
