// Backward pass of scaled dot-product attention (qkv/attention.h): the gradients
// of a scalar loss with respect to q, k and v, given its gradient dO with respect
// to the output.
//
// Every forward option is differentiated as PyTorch's autograd does it:
//   - the mask and is_causal are constants (no gradient flows to the mask);
//   - dropout reuses the forward's keep/drop decision (random::dropout_keep with
//     the same seed and flat index into [..., Hq, Lq, Lk]), survivors scaled by
//     1/(1-p);
//   - a fully masked row (weights 0, lse -inf) contributes zero gradient;
//   - broadcast leading dims and GQA: the gradient of a shared k/v (or q) element
//     is the sum over every query head/batch entry that read it;
//   - Dk == 0: dq and dk are empty, dv as for equal scores.
// Per row i with weights p_i = softmax(s_i), applied weights w_ij = p_ij m_ij
// (m = dropout factor, 1 without dropout):
//   dv_j += w_ij dO_i,  dP_ij = m_ij (dO_i . v_j),  D_i = sum_j p_ij dP_ij,
//   dS_ij = p_ij (dP_ij - D_i),  dq_i += scale sum_j dS_ij k_j,
//   dk_j += scale dS_ij q_i.
#pragma once

#include "qkv/attention.h"

namespace qkv {

struct AttentionGradients {
  Tensor dq;  // shape and dtype of q
  Tensor dk;  // shape and dtype of k
  Tensor dv;  // shape and dtype of v
};

// The oracle: plain loops in float64, single-threaded. It recomputes the forward
// from q, k, v itself (no saved output or logsumexp), so that it shares nothing
// with the kernels it checks. `grad_out` has the forward output's shape
// [..., Hq, Lq, Dv]. Errors name "attention_backward_reference".
AttentionGradients attention_backward_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const Tensor& grad_out, const AttentionOptions& options = {});

// The backward users call, from the forward's saved `out` ([..., Hq, Lq, Dv]) and
// `logsumexp` ([..., Hq, Lq], the forward's return_logsumexp) and `grad_out`
// (shape of out). Errors name "scaled_dot_product_attention_backward" and the shapes.
// The fused CPU kernel (FlashAttention-2's backward, multi-threaded, never storing
// [Lq, Lk]): f64 in float64, f32 in float32, bf16/f16 on their float32 upcast with
// the gradients rounded back to their dtype. Dk == 0: dv from it on one zero column.
AttentionGradients scaled_dot_product_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                         const Tensor& out, const Tensor& grad_out,
                                                         const Tensor& logsumexp, const AttentionOptions& options = {});

}  // namespace qkv
