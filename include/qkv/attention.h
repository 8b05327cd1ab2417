// Scaled dot-product attention.
//
// Conventions (those of torch.nn.functional.scaled_dot_product_attention):
//   q [..., Hq, Lq, Dk], k [..., Hk, Lk, Dk], v [..., Hk, Lk, Dv]; Dk != Dv and
//   Lq != Lk are allowed. Leading dims broadcast (numpy rules) between q, k and v.
//   scores = q @ k^T * scale, scale defaults to 1/sqrt(Dk).
//   attn_mask broadcasts to [..., Lq, Lk]: boolean True = take part (False -> -inf),
//     or floating = added to the scaled scores.
//   is_causal: position i attends to j <= i (top-left aligned, as torch.tril);
//     ValueError together with attn_mask, as PyTorch.
//   enable_gqa: k/v heads (dim -3) may divide q heads; q head h uses k/v head
//     h / (Hq / Hk) (torch's repeat_interleave). Without it heads must broadcast.
//   weights = softmax(scores, -1); a row with every key masked gives weights 0
//     and output 0 (PyTorch >= 2.5 _safe_softmax), not NaN.
//   dropout_p > 0: weights[idx] is zeroed with probability dropout_p and the
//     survivors scaled by 1/(1-dropout_p); idx is the row-major index into the
//     broadcast [..., Hq, Lq, Lk] weights, drawn by random::dropout_keep(seed, idx).
//     dropout_p == 1 gives zeros.
//   return_weights: also returns the weights actually applied to v (after dropout).
//   output [..., Hq, Lq, Dv] in q's dtype (f16/bf16 inputs are computed in f32/f64).
//   return_logsumexp: also returns lse[..., Hq, Lq] (f32) = log sum_j exp(score_ij)
//     over the scaled, masked scores before dropout (-inf for a fully masked row),
//     what a backward pass needs to recompute the weights as exp(score - lse).
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/tensor.h"

namespace qkv {

struct AttentionOptions {
  std::optional<Tensor> attn_mask;
  double dropout_p = 0.0;
  bool is_causal = false;
  std::optional<double> scale;
  bool enable_gqa = false;
  bool return_weights = false;
  uint64_t seed = 0;  // dropout generator seed
  bool return_logsumexp = false;  // also return the row logsumexp (see above)
};

struct AttentionResult {
  Tensor output;                 // [..., Hq, Lq, Dv]
  std::optional<Tensor> weights;  // [..., Hq, Lq, Lk] when return_weights
  std::optional<Tensor> logsumexp;  // [..., Hq, Lq] f32 when return_logsumexp
};

// The oracle: plain loops with float64 accumulation, single-threaded. Every
// fast attention kernel is tested against it.
AttentionResult attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

// The attention users call: the fused CPU kernel (FlashAttention-2 schedule,
// never materialising the [Lq, Lk] scores; weights, when asked for, come from a
// second fused pass) for f32/f16/bf16; f64 inputs (and Dk == 0) use the reference.
// Errors name "scaled_dot_product_attention".
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options = {});

}  // namespace qkv
