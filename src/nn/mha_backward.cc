// MultiheadAttention::backward (qkv/nn/mha.h): the forward of mha.cc recomputed with its
// intermediates, then differentiated line by line (B<n> differentiates F<n>).
#include <map>
#include <string>
#include <vector>

#include "nn/heads.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/nn/mha.h"

namespace qkv::nn {

namespace {

constexpr const char* kOp = "MultiheadAttention.backward";

// Rows [r0, r0 + part.size(0)) of `whole` = part (whole is contiguous f32).
void put_rows(Tensor& whole, int64_t r0, const Tensor& part) { whole.slice(0, r0, r0 + part.size(0)).copy_from(part); }

// d [N, H, S', D] -> the gradient of the key/value row `row` shared by every batch entry:
// the sum over N of d[:, :, row, :], as [1, 1, H*D] (bias_k / bias_v's shape; E = H*D, head-major).
Tensor shared_row_grad(const Tensor& d, int64_t row) {
  const int64_t n = d.size(0), h = d.size(1), dd = d.size(3), e = h * dd;
  const Tensor r = d.slice(2, row, row + 1).contiguous();  // [N, H, 1, D]
  const float* src = r.data<float>();
  std::vector<double> acc(static_cast<size_t>(e), 0.0);
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t i = 0; i < e; ++i) acc[static_cast<size_t>(i)] += src[b * e + i];
  }
  std::vector<float> out(acc.begin(), acc.end());
  return Tensor::from_vector(out, {1, 1, e});
}

// The q, k, v projections' gradients under the state_dict's names: in_proj_weight [3E, E] (rows
// q, k, v) when packed, else q/k/v_proj_weight; in_proj_bias [3E] when the layer has biases.
void put_in_proj_grads(std::map<std::string, Tensor>& params, bool packed, bool bias, int64_t e,
                       const LinearGradients& gq, const LinearGradients& gk, const LinearGradients& gv) {
  if (packed) {
    Tensor w = Tensor::empty({3 * e, e});
    put_rows(w, 0, gq.dweight);
    put_rows(w, e, gk.dweight);
    put_rows(w, 2 * e, gv.dweight);
    params["in_proj_weight"] = w;
  } else {
    params["q_proj_weight"] = gq.dweight;
    params["k_proj_weight"] = gk.dweight;
    params["v_proj_weight"] = gv.dweight;
  }
  if (bias) {
    Tensor b = Tensor::empty({3 * e});
    put_rows(b, 0, *gq.dbias);
    put_rows(b, e, *gk.dbias);
    put_rows(b, 2 * e, *gv.dbias);
    params["in_proj_bias"] = b;
  }
}

}  // namespace

MultiheadAttentionGradients MultiheadAttention::backward(const Tensor& query, const Tensor& key, const Tensor& value,
                                                         const Tensor& grad_output,
                                                         const MultiheadAttentionOptions& o) const {
  if (quantized_) fail<ValueError>(kOp, ": the layer is quantized (int8); backward needs the float32 layer");
  if (o.attention.kind != AttentionKind::softmax) {
    fail<ValueError>(kOp, ": attention=", attention_kind_name(o.attention.kind),
                     " is forward-only (no backward); backward needs the softmax attention");
  }
  const Prepared in = prepare(query, key, value);
  const int64_t h = config_.num_heads, e = config_.embed_dim, d = head_dim();
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
  const Tensor qh = detail::split_heads(qp, h, in.bf);
  Tensor kh = detail::split_heads(kp, h, in.bf), vh = detail::split_heads(vp, h, in.bf);
  int64_t extra = 0;          // key rows appended after the S keys
  if (config_.add_bias_kv) {  // F2b: bias_k, bias_v appended as key/value row S  [N, H, S+1, D]
    kh = detail::append_key_row(kh, params_.at("bias_k").reshape({h, d}));
    vh = detail::append_key_row(vh, params_.at("bias_v").reshape({h, d}));
    ++extra;
  }
  if (config_.add_zero_attn) {  // F2c: a zero key/value row appended            [N, H, S', D]
    kh = detail::append_key_row(kh, std::nullopt);
    vh = detail::append_key_row(vh, std::nullopt);
    ++extra;
  }
  // F3: attention, with the forward's mask (an allowed column per appended row), causal flag and dropout
  AttentionOptions ao = attention_options(o, in, extra);
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
  // B2c (F2c): the zero row is a constant: its gradient (the last row) is dropped with the slice below
  // B2b (F2b): bias_k/bias_v feed row S of every batch entry: the sum over N   [1, 1, E]
  if (config_.add_bias_kv) {
    g.params["bias_k"] = shared_row_grad(ga.dk, in.s);
    g.params["bias_v"] = shared_row_grad(ga.dv, in.s);
  }
  const Tensor dkh = ga.dk.slice(2, 0, in.s), dvh = ga.dv.slice(2, 0, in.s);  // [N, H, S, D]
  // B2 (F2): merge the head gradients back to the projections' layout
  // B1 (F1): each projection's gradients
  const LinearGradients gq = q_.backward(in.qi, detail::merge_heads(ga.dq, in.bf));
  const LinearGradients gk = k_.backward(in.ki, detail::merge_heads(dkh, in.bf));
  const LinearGradients gv = v_.backward(in.vi, detail::merge_heads(dvh, in.bf));
  put_in_proj_grads(g.params, packed(), config_.bias, e, gq, gk, gv);
  g.query = in.batched ? gq.dx : gq.dx.squeeze(1);
  g.key = in.batched ? gk.dx : gk.dx.squeeze(1);
  g.value = in.batched ? gv.dx : gv.dx.squeeze(1);
  return g;
}

}  // namespace qkv::nn
