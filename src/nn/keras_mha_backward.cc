// KerasMultiHeadAttention::backward (qkv/nn/keras_mha.h): the forward of keras_mha.cc
// recomputed with its intermediates, then differentiated line by line (B<n> differentiates
// F<n>). Projections are EinsumDense layers held as nn::Linear (Linear::backward, kernels
// reshaped back to Keras' axes); attention is the fused scaled_dot_product_attention_backward.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>

#include "nn/keras_masks.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/nn/keras_mha.h"

namespace qkv::nn {

namespace {

constexpr const char* kOp = "KerasMultiHeadAttention.backward";

// B4 (F4): Keras' fused path gives a row with no key left the mean of the values; its
// gradient goes to every value of that batch-head: dv[.., j, :] += dout[.., t, :] / S.
// mask [mb.., 1, T, S] bool (broadcast to [batch.., N, T, S]); dout [batch.., N, T, Dv],
// dv [batch.., N, S, Dv], both contiguous f32 (dv updated in place).
void add_fully_masked_rows(const Tensor& mask, const Tensor& dout, Tensor& dv) {
  const int64_t s = dv.size(-2), t = dout.size(-2), d = dout.size(-1);
  Shape full = dout.shape();
  full.back() = s;
  const Tensor me = mask.expand(full).contiguous();  // [batch.., N, T, S]
  const bool* m = me.data<bool>();
  const float* go = dout.data<float>();
  float* gv = dv.data<float>();
  const int64_t rows = shape_numel(Shape(full.begin(), full.end() - 1));
  for (int64_t r = 0; r < rows; ++r) {
    if (s == 0 || std::any_of(m + r * s, m + (r + 1) * s, [](bool x) { return x; })) continue;
    float* vb = gv + (r / t) * s * d;  // this batch-head's value gradients
    for (int64_t j = 0; j < s; ++j) {
      for (int64_t c = 0; c < d; ++c) vb[j * d + c] += go[r * d + c] / static_cast<float>(s);
    }
  }
}

// A Linear's weight gradients under their Keras names and the EinsumDense shapes.
void put_weights(std::map<std::string, Tensor>& out, const std::string& part, const LinearGradients& g,
                 const Shape& kernel, const Shape& bias) {
  out[part + "/kernel"] = g.dweight.reshape(kernel);
  if (g.dbias) out[part + "/bias"] = g.dbias->reshape(bias);
}

void check_grad_output(const Tensor& grad_output, const Tensor& query, const Shape& output_shape) {
  Shape out_shape(query.shape().begin(), query.shape().end() - 1);  // [B, A.., *output_shape]
  out_shape.insert(out_shape.end(), output_shape.begin(), output_shape.end());
  if (grad_output.shape() != out_shape) {
    fail<ShapeError>(kOp, ": grad_output must have the output's shape ", shape_str(out_shape), " (query ",
                     shape_str(query.shape()), ", output_shape ", shape_str(output_shape), "), got ",
                     shape_str(grad_output.shape()));
  }
}

// a + b, both contiguous f32 of one shape.
Tensor sum(const Tensor& a, const Tensor& b) {
  Tensor out = a.clone();
  float* p = out.data<float>();
  const float* q = b.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] += q[i];
  return out;
}

// B5g: use_gate's gated = heads * gate, gate = sigmoid(z), z = gate_dense.forward(query), all
// [B, A.., N*vd]. Given dgated, puts the gate dense's gradients (dz = dgated * heads * gate *
// (1 - gate)) into `weights`, turns dgated into d heads (dgated * gate), returns d query.
Tensor gate_backward(const Linear& gate_dense, const Tensor& query, Tensor& dgated, const Tensor& heads,
                     const Tensor& gate, std::map<std::string, Tensor>& weights, int64_t heads_n, int64_t vd) {
  Tensor dz = detail::multiply(dgated, heads);
  float* p = dz.data<float>();
  const float* s = gate.data<float>();
  for (int64_t i = 0; i < dz.numel(); ++i) p[i] *= s[i] * (1.0f - s[i]);
  const LinearGradients gg = gate_dense.backward(query, dz);
  put_weights(weights, "gate", gg, {query.size(-1), heads_n, vd}, {heads_n, vd});
  dgated = detail::multiply(dgated, gate);
  return gg.dx;
}

}  // namespace

KerasMultiHeadAttentionGradients KerasMultiHeadAttention::backward(const Tensor& query, const Tensor& value,
                                                                   const Tensor& grad_output,
                                                                   const KerasMultiHeadAttentionOptions& o) const {
  const AllocationScope scope(kOp);  // names it in out-of-memory errors
  if (!built()) fail<ValueError>(kOp, ": the layer has no weights (set_weights, load_weights or build first)");
  if (quantized()) fail<ValueError>(kOp, ": the layer is quantized (int8); backward needs the float32 layer");
  if (o.attention.kind != AttentionKind::softmax) {
    fail<ValueError>(kOp, ": attention=", attention_kind_name(o.attention.kind),
                     " is forward-only (no backward); backward needs the softmax attention");
  }
  const Tensor& key = o.key ? *o.key : value;
  require_cpu(kOp, {&query, &value, &key, &grad_output});
  const detail::KerasAxes axes = detail::keras_axes(config_.attention_axes, query, value, key, kOp);
  check_grad_output(grad_output, query, config_.output_shape);
  const int64_t n = config_.num_heads;
  // F1: projections (EinsumDense as Linear)                [B, A.., N*kd] / [B, S.., N*kd|vd]
  const Tensor qp = query_.forward(query), kp = key_.forward(key), vp = value_.forward(value);
  // F2: attention layout, attended axes flattened             [batch.., N, T|S, kd|vd]
  const Tensor q = detail::to_attention_layout(qp, n, axes), k = detail::to_attention_layout(kp, n, axes),
               v = detail::to_attention_layout(vp, n, axes);
  // F3: attention with the forward's mask, scale and dropout (same seed)
  AttentionOptions ao;
  ao.attn_mask = detail::keras_attention_mask(query, value, o, axes, config_.sliding_window);  // [mb.., 1, T, S]
  ao.scale = 1.0 / std::sqrt(static_cast<double>(config_.key_dim));
  ao.mods = o.mods;
  ao.return_logsumexp = true;
  if (training && config_.dropout > 0) {
    ao.dropout_p = config_.dropout;
    ao.seed = dropout_seed;
  }
  const AttentionResult r = scaled_dot_product_attention(q, k, v, ao);  // output [batch.., N, T, vd]
  // F4: on Keras' fused path a fully masked row is the mean of the values
  const bool keras_fused_path = !o.return_attention_scores && query.dim() == 3 && config_.dropout == 0;
  Tensor out = r.output.contiguous();
  if (ao.attn_mask && keras_fused_path) {
    out = out.clone();  // r.output stays the kernel's (zero rows) for B3
    detail::fill_fully_masked_rows(*ao.attn_mask, v, out, std::nullopt);
  }
  // F5: heads merged back to the query's layout                 [B, A.., N*vd]
  const Tensor heads = detail::from_attention_layout(out, query.shape(), axes).contiguous();
  // F5g (use_gate): gated = heads * gate, gate = sigmoid(query W_g + b_g)   [B, A.., N*vd]
  const Tensor gate = config_.use_gate ? detail::keras_gate(gate_, query) : Tensor();
  const Tensor gated = config_.use_gate ? detail::multiply(heads, gate) : heads;
  // F6: output projection: output = gated W_o + b_o, viewed as [B, A.., *output_shape] (not needed)
  KerasMultiHeadAttentionGradients g;
  const int64_t kd = config_.key_dim, vd = config_.value_dim.value_or(kd);
  // B6 (F6): the output dense's gradients, and d gated            [B, A.., N*vd]
  const Tensor dy = grad_output.reshape(Shape{shape_numel(heads.shape()) / heads.size(-1), output_.out_features()});
  const LinearGradients go = output_.backward(gated.reshape({dy.size(0), heads.size(-1)}), dy);
  Shape ok_shape{n, vd};
  ok_shape.insert(ok_shape.end(), config_.output_shape.begin(), config_.output_shape.end());
  put_weights(g.weights, "attention_output", go, ok_shape, Shape(config_.output_shape));
  // B5g (F5g): the gate dense's gradients; d heads = d gated * gate
  Tensor dheads = go.dx.view(heads.shape());
  const std::optional<Tensor> dquery_gate =
      config_.use_gate ? std::optional(gate_backward(gate_, query, dheads, heads, gate, g.weights, n, vd))
                       : std::nullopt;
  // B5 (F5): the merge is a permutation: split the gradient the same way  [batch.., N, T, vd]
  const Tensor dout = detail::to_attention_layout(dheads, n, axes).contiguous();
  // B3 (F3): the fused attention backward from F3's output and logsumexp (fully masked rows: 0)
  const AttentionGradients ga = scaled_dot_product_attention_backward(q, k, v, r.output, dout, *r.logsumexp, ao);
  Tensor dv = ga.dv.contiguous();  // [batch.., N, S, vd]
  // B4 (F4): the values' share of the fully masked rows' mean (q and k get none: Keras' where)
  if (ao.attn_mask && keras_fused_path) {
    if (dv.data<float>() == ga.dv.data<float>()) dv = dv.clone();
    add_fully_masked_rows(*ao.attn_mask, dout, dv);
  }
  // B2 (F2): back to each projection's layout                   [B, A.., N*kd|vd]
  const Tensor dqp = detail::from_attention_layout(ga.dq, query.shape(), axes);
  const Tensor dkp = detail::from_attention_layout(ga.dk, key.shape(), axes);
  const Tensor dvp = detail::from_attention_layout(dv, value.shape(), axes);
  // B1 (F1): each EinsumDense's gradients; kernels [dim, N, d], biases [N, d]
  const LinearGradients gq = query_.backward(query, dqp), gk = key_.backward(key, dkp),
                        gv = value_.backward(value, dvp);
  put_weights(g.weights, "query", gq, {query.size(-1), n, kd}, {n, kd});
  put_weights(g.weights, "key", gk, {key.size(-1), n, kd}, {n, kd});
  // The key bias adds q_i . b_k to every score of row i: softmax ignores it (each row of dS
  // sums to 0), so its gradient is exactly 0; B1's sum of dk would be float32 noise around it.
  if (gk.dbias) g.weights["key/bias"] = Tensor::zeros({n, kd});
  put_weights(g.weights, "value", gv, {value.size(-1), n, vd}, {n, vd});
  g.query = dquery_gate ? sum(gq.dx, *dquery_gate) : gq.dx;  // use_gate: the query also feeds the gate
  g.value = o.key ? gv.dx : sum(gv.dx, gk.dx);               // no key: the value is also the key, both uses add
  if (o.key) g.key = gk.dx;
  return g;
}

}  // namespace qkv::nn
