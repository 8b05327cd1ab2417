// backward() of the seed articles' layers (qkv/nn/seed_layers.h): each layer's forward of
// seed_layers.cc recomputed with its intermediates (F<n>), then differentiated line by line
// in reverse (B<n> differentiates F<n>). The attention is differentiated by the fused
// backward from F's saved output and logsumexp, every projection by Linear::backward, and
// each rearrange by its inverse (a permutation's gradient is the inverse permutation).
#include <cmath>
#include <span>
#include <string>
#include <vector>

#include "nn/heads.h"
#include "nn/seed_layers_internal.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/nn/seed_layers.h"

namespace qkv::nn {

namespace {

// grad_output must have the output's shape: ShapeError naming the op and both shapes.
void check_grad_output(const Tensor& grad_output, const Shape& out_shape, const char* op) {
  if (grad_output.shape() != out_shape) {
    fail<ShapeError>(op, ": grad_output must have the output's shape ", shape_str(out_shape), ", got ",
                     shape_str(grad_output.shape()));
  }
}

// The fused attention forward that keeps what its backward needs (output and logsumexp).
AttentionResult attend(const Tensor& q, const Tensor& k, const Tensor& v, AttentionOptions& o) {
  o.return_logsumexp = true;
  return scaled_dot_product_attention(q, k, v, o);
}

// d q, d k, d v of a layer whose projections are Linears without reordered rows (seeds 003,
// 004): B4 (F4: merge 'b h l d -> b l (h d)') splits the gradient the same way, B3 is the
// attention backward, B2 (F2: split 'b l (h d) -> b h l d') merges each gradient back, B1
// the projections' Linear::backward. Parameter gradients under "<name>.weight"/".bias".
void qkv_projections_backward(const Linear* proj[3], const char* const names[3], const Tensor* in[3],
                              const Tensor* heads[3], const AttentionResult& r, const Tensor& d_merged, int64_t h,
                              const AttentionOptions& o, MultiheadAttentionGradients& g) {
  // B4 (F4): d attention output                                 [B, H, Lq, Dv]
  const Tensor d_out = detail::split_heads(d_merged, h, true);
  // B3 (F3): d Q, d K, d V                                      [B, H, L, D]
  const AttentionGradients ga =
      scaled_dot_product_attention_backward(*heads[0], *heads[1], *heads[2], r.output, d_out, *r.logsumexp, o);
  const Tensor* d_heads[3] = {&ga.dq, &ga.dk, &ga.dv};
  Tensor* d_in[3] = {&g.query, &g.key, &g.value};
  for (int i = 0; i < 3; ++i) {
    // B2 (F2): 'b h l d -> b l (h d)'                          [B, L, H*D]
    // B1 (F1): the projection's gradients                     d in [B, L, d_in]
    const LinearGradients gl = proj[i]->backward(*in[i], detail::merge_heads(*d_heads[i], true));
    *d_in[i] = gl.dx;
    g.params[std::string(names[i]) + ".weight"] = gl.dweight;
    if (gl.dbias) g.params[std::string(names[i]) + ".bias"] = *gl.dbias;
  }
}

}  // namespace

// ---- seed 000: SelfAttention -----------------------------------------------------------

SelfAttentionGradients SelfAttention::backward(const Tensor& x, const Tensor& grad_output,
                                               const std::optional<Tensor>& mask) const {
  constexpr const char* kOp = "SelfAttention.backward";
  const AllocationScope scope(kOp, {}, std::span<const Shape>(&x.shape(), 1), "x");  // names it in errors
  detail::check_3d(x, dim_, kOp, "x");
  const int64_t b = x.size(0), t = x.size(1);
  check_grad_output(grad_output, {b, t, dim_}, kOp);
  // F1: qkv = to_qvk(x), rows reordered (d k) -> (k d) once at load  [B, T, 3, dim]
  const Tensor qkv = proj_.forward(x).view({b, t, 3, dim_});
  // F2: q, k, v = 'b t (d k) -> k b t d' (strided views)            [B, T, dim] each
  const Tensor q = qkv.select(2, 0), k = qkv.select(2, 1), v = qkv.select(2, 2);
  // F3: softmax(q k^T * dim**-0.5, masked_fill(mask, -inf)) v        [B, T, dim]
  AttentionOptions o;
  o.attn_mask = detail::seed_mask(mask, t, kOp);
  o.scale = 1.0 / std::sqrt(static_cast<double>(dim_));
  const AttentionResult r = attend(q, k, v, o);

  SelfAttentionGradients g;
  // B3 (F3): d q, d k, d v                                           [B, T, dim] each
  const AttentionGradients ga = scaled_dot_product_attention_backward(q, k, v, r.output, grad_output, *r.logsumexp, o);
  // B2 (F2): the inverse rearrange 'k b t d -> b t (k d)' of the reordered rows  [B, T, 3, dim]
  Tensor d_qkv = Tensor::empty({b, t, 3, dim_});
  d_qkv.select(2, 0).copy_from(ga.dq);
  d_qkv.select(2, 1).copy_from(ga.dk);
  d_qkv.select(2, 2).copy_from(ga.dv);
  // B1 (F1): d x, and d W in the (k d) rows, permuted back to the state_dict's (d k)
  const LinearGradients gl = proj_.backward(x, d_qkv.view({b, t, 3 * dim_}));
  g.x = gl.dx;                                                             // [B, T, dim]
  g.params["to_qvk.weight"] = detail::rows_kd_to_dk(gl.dweight, dim_, 3);  // [3*dim, dim]
  return g;
}

// ---- seed 000: MultiHeadSelfAttention ----------------------------------------------------

SelfAttentionGradients MultiHeadSelfAttention::backward(const Tensor& x, const Tensor& grad_output,
                                                        const std::optional<Tensor>& mask) const {
  constexpr const char* kOp = "MultiHeadSelfAttention.backward";
  const AllocationScope scope(kOp, {}, std::span<const Shape>(&x.shape(), 1), "x");  // names it in errors
  detail::check_3d(x, dim_, kOp, "x");
  const int64_t b = x.size(0), t = x.size(1), h = heads_, dh = dim_head_;
  check_grad_output(grad_output, {b, t, dim_}, kOp);
  // F1: qkv = to_qvk(x), rows reordered (d k h) -> (k h d) once at load  [B, T, 3, H, dh]
  const Tensor qkv = proj_.forward(x).view({b, t, 3, h, dh});
  // F2: q, k, v = 'b t (d k h) -> k b h t d' (strided views)            [B, H, T, dh] each
  auto part = [&](int64_t i) { return qkv.select(2, i).permute({0, 2, 1, 3}); };
  const Tensor q = part(0), k = part(1), v = part(2);
  // F3: softmax(q k^T * dim_head**-0.5, masked_fill(mask, -inf)) v        [B, H, T, dh]
  AttentionOptions o;
  o.attn_mask = detail::seed_mask(mask, t, kOp);
  o.scale = 1.0 / std::sqrt(static_cast<double>(dh));
  const AttentionResult r = attend(q, k, v, o);
  // F4: 'b h t d -> b t (h d)'                                            [B, T, H*dh]
  const Tensor merged = detail::merge_heads(r.output, true);
  // F5: y = W_0(merged)                                                   [B, T, dim]

  SelfAttentionGradients g;
  // B5 (F5): d W_0 [dim, H*dh], d merged [B, T, H*dh]
  const LinearGradients go = out_.backward(merged, grad_output);
  g.params["W_0.weight"] = go.dweight;
  // B4 (F4): the inverse rearrange 'b t (h d) -> b h t d'                 [B, H, T, dh]
  const Tensor d_out = detail::split_heads(go.dx, h, true);
  // B3 (F3): d q, d k, d v                                                [B, H, T, dh] each
  const AttentionGradients ga = scaled_dot_product_attention_backward(q, k, v, r.output, d_out, *r.logsumexp, o);
  // B2 (F2): the inverse rearrange 'k b h t d -> b t k h d' of the reordered rows  [B, T, 3, H, dh]
  Tensor d_qkv = Tensor::empty({b, t, 3, h, dh});
  const Tensor* d_parts[3] = {&ga.dq, &ga.dk, &ga.dv};
  for (int64_t i = 0; i < 3; ++i) d_qkv.select(2, i).copy_from(d_parts[i]->permute({0, 2, 1, 3}));
  // B1 (F1): d x, and d W in the (k h d) rows, permuted back to the state_dict's (d k h)
  const LinearGradients gl = proj_.backward(x, d_qkv.view({b, t, 3 * h * dh}));
  g.x = gl.dx;                                                               // [B, T, dim]
  g.params["to_qvk.weight"] = detail::rows_kd_to_dk(gl.dweight, dh, 3 * h);  // [3*H*dh, dim]
  return g;
}

// ---- seed 003 ------------------------------------------------------------------------------

MultiheadAttentionGradients SeparateHeadsAttention::backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                             const Tensor& grad_output) const {
  constexpr const char* kOp = "SeparateHeadsAttention.backward";
  const std::vector<Shape> inputs{q.shape(), k.shape(), v.shape()};  // named in out-of-memory errors
  const AllocationScope scope(kOp, {}, inputs, "q, k, v");
  detail::check_3d(q, e_, kOp, "q");
  detail::check_3d(k, e_, kOp, "k");
  detail::check_3d(v, e_, kOp, "v");
  detail::check_qkv_agree(q, k, v, kOp);
  check_grad_output(grad_output, q.shape(), kOp);
  // F1: Q = W_q(q), K = W_k(k), V = W_v(v)                  [B, L, H*Dkq] / [B, Lk, H*Dv]
  // F2: .view(B, L, H, D).transpose(1, 2)                   [B, H, L, D] (views)
  const Tensor qh = detail::split_heads(wq_.forward(q), h_, true), kh = detail::split_heads(wk_.forward(k), h_, true),
               vh = detail::split_heads(wv_.forward(v), h_, true);
  // F3: softmax(Q K^T * scale, causal triu -inf) V          [B, H, Lq, Dv]
  AttentionOptions o;
  o.scale = scale_.value_or(1.0 / std::sqrt(static_cast<double>(dkq_)));
  o.is_causal = causal_;
  const AttentionResult r = attend(qh, kh, vh, o);
  // F4: .transpose(1, 2).reshape(B, Lq, H*Dv)               [B, Lq, H*Dv]
  const Tensor merged = detail::merge_heads(r.output, true);
  // F5: output = W_o(Z)                                     [B, Lq, E]

  MultiheadAttentionGradients g;
  // B5 (F5): d W_o [E, H*Dv], d Z [B, Lq, H*Dv]
  const LinearGradients go = wo_.backward(merged, grad_output);
  g.params["W_o.weight"] = go.dweight;
  // B4..B1 (F4..F1)
  const Linear* proj[3] = {&wq_, &wk_, &wv_};
  const char* const names[3] = {"W_q", "W_k", "W_v"};
  const Tensor* in[3] = {&q, &k, &v};
  const Tensor* heads[3] = {&qh, &kh, &vh};
  qkv_projections_backward(proj, names, in, heads, r, go.dx, h_, o, g);
  return g;
}

// ---- seed 004 ------------------------------------------------------------------------------

MultiheadAttentionGradients LazyMultiHeadAttention::backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                                             const Tensor& grad_output) const {
  constexpr const char* kOp = "LazyMultiHeadAttention.backward";
  const std::vector<Shape> inputs{q.shape(), k.shape(), v.shape()};  // named in out-of-memory errors
  const AllocationScope scope(kOp, {}, inputs, "q, k, v");
  if (!materialized()) {
    fail<ValueError>(kOp, ": the layer is not materialized yet (call it once, or load_state_dict, first)");
  }
  check_inputs(q, k, v);
  detail::check_qkv_agree(q, k, v, kOp);
  check_grad_output(grad_output, {q.size(0), q.size(1), hidden_}, kOp);
  // F1: W_q(q), W_k(k), W_v(v) with biases                 [B, L, D]
  // F2: 'batch seq (heads eachhead) -> batch heads seq eachhead' (views)  [B, H, L, D/H]
  const Tensor qh = detail::split_heads(wq_.forward(q), heads_, true),
               kh = detail::split_heads(wk_.forward(k), heads_, true),
               vh = detail::split_heads(wv_.forward(v), heads_, true);
  // F3: softmax(Q K^T / sqrt(D/H)) V per (batch, head)     [B, H, Lq, D/H]
  AttentionOptions o;
  const AttentionResult r = attend(qh, kh, vh, o);
  // F4: '(batch heads) numq eachhead -> batch numq (heads eachhead)'  [B, Lq, D]
  const Tensor merged = detail::merge_heads(r.output, true);
  // F5: W_o(merged)                                         [B, Lq, D]

  MultiheadAttentionGradients g;
  // B5 (F5): d W_o [D, D], d W_o.bias [D], d merged [B, Lq, D]
  const LinearGradients go = wo_.backward(merged, grad_output);
  g.params["W_o.weight"] = go.dweight;
  g.params["W_o.bias"] = *go.dbias;
  // B4..B1 (F4..F1)
  const Linear* proj[3] = {&wq_, &wk_, &wv_};
  const char* const names[3] = {"W_q", "W_k", "W_v"};
  const Tensor* in[3] = {&q, &k, &v};
  const Tensor* heads[3] = {&qh, &kh, &vh};
  qkv_projections_backward(proj, names, in, heads, r, go.dx, heads_, o, g);
  // The key bias adds q_i . b_k to every score of row i, which softmax ignores: its gradient
  // sum_j dK_j = scale sum_i q_i sum_j dS_ij is exactly 0 (sum_j dS_ij = 0), returned as 0
  // rather than as float32 rounding noise (torch's float64 gives ~1e-17).
  g.params["W_k.bias"] = Tensor::zeros({hidden_});
  return g;
}

}  // namespace qkv::nn
