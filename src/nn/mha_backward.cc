// MultiheadAttention::backward (qkv/nn/mha.h): the forward of mha.cc recomputed with its
// intermediates, then differentiated line by line (B<n> differentiates F<n>).
#include <string>

#include "nn/heads.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/nn/mha.h"

namespace qkv::nn {

namespace {

constexpr const char* kOp = "MultiheadAttention.backward";

// Rows [r0, r0 + part.size(0)) of `whole` = part (whole is contiguous f32).
void put_rows(Tensor& whole, int64_t r0, const Tensor& part) { whole.slice(0, r0, r0 + part.size(0)).copy_from(part); }

}  // namespace

MultiheadAttentionGradients MultiheadAttention::backward(const Tensor& query, const Tensor& key, const Tensor& value,
                                                         const Tensor& grad_output,
                                                         const MultiheadAttentionOptions& o) const {
  if (config_.add_bias_kv || config_.add_zero_attn) {
    fail<ValueError>(kOp, ": add_bias_kv and add_zero_attn are not differentiated yet");
  }
  if (quantized_) fail<ValueError>(kOp, ": the layer is quantized (int8); backward needs the float32 layer");
  const Prepared in = prepare(query, key, value);
  const int64_t h = config_.num_heads, e = config_.embed_dim;
  const Tensor dy = in.batched ? grad_output : grad_output.unsqueeze(1);  // [L, N, E] (or [N, L, E])
  const Shape out_shape = in.qi.shape();
  if (dy.shape() != out_shape) {
    fail<ShapeError>(kOp, ": grad_output must have the output's shape ",
                     shape_str(in.batched ? out_shape : Shape{out_shape[0], out_shape[2]}), ", got ",
                     shape_str(grad_output.shape()));
  }
  // F1: projections (the q, k, v Linears; the packed ones compute the same rows)
  const Tensor qp = q_.forward(in.qi), kp = k_.forward(in.ki), vp = v_.forward(in.vi);
  // F2: heads split                                           [N, H, L|S, D]
  const Tensor qh = detail::split_heads(qp, h, in.bf), kh = detail::split_heads(kp, h, in.bf),
               vh = detail::split_heads(vp, h, in.bf);
  // F3: attention, with the forward's mask, causal flag and dropout
  AttentionOptions ao = attention_options(o, in, 0);
  ao.return_logsumexp = true;
  const AttentionResult r = scaled_dot_product_attention(qh, kh, vh, ao);
  // F4: heads merged, F5: output projection
  const Tensor merged = detail::merge_heads(r.output, in.bf);

  MultiheadAttentionGradients g;
  // B5 (F5): out_proj's gradients, and d merged
  const LinearGradients go = out_.backward(merged, dy);
  g.params["out_proj.weight"] = go.dweight;
  if (go.dbias) g.params["out_proj.bias"] = *go.dbias;
  // B4 (F4): the merge is a permutation: split the gradient the same way
  // B3 (F3): the fused attention backward from F3's saved output and logsumexp
  const AttentionGradients ga = scaled_dot_product_attention_backward(
      qh, kh, vh, r.output, detail::split_heads(go.dx, h, in.bf), *r.logsumexp, ao);
  // B2 (F2): merge the head gradients back to the projections' layout
  // B1 (F1): each projection's gradients
  const LinearGradients gq = q_.backward(in.qi, detail::merge_heads(ga.dq, in.bf));
  const LinearGradients gk = k_.backward(in.ki, detail::merge_heads(ga.dk, in.bf));
  const LinearGradients gv = v_.backward(in.vi, detail::merge_heads(ga.dv, in.bf));
  if (packed()) {
    Tensor w = Tensor::empty({3 * e, e});  // [3E, E]: rows q, k, v
    put_rows(w, 0, gq.dweight);
    put_rows(w, e, gk.dweight);
    put_rows(w, 2 * e, gv.dweight);
    g.params["in_proj_weight"] = w;
  } else {
    g.params["q_proj_weight"] = gq.dweight;
    g.params["k_proj_weight"] = gk.dweight;
    g.params["v_proj_weight"] = gv.dweight;
  }
  if (config_.bias) {
    Tensor b = Tensor::empty({3 * e});
    put_rows(b, 0, *gq.dbias);
    put_rows(b, e, *gk.dbias);
    put_rows(b, 2 * e, *gv.dbias);
    g.params["in_proj_bias"] = b;
  }
  g.query = in.batched ? gq.dx : gq.dx.squeeze(1);
  g.key = in.batched ? gk.dx : gk.dx.squeeze(1);
  g.value = in.batched ? gv.dx : gv.dx.squeeze(1);
  return g;
}

}  // namespace qkv::nn
