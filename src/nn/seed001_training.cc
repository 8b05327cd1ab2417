// Seed 001's model trained in qkv (qkv/nn/seed001_training.h). Forward and backward side
// by side: each backward line names the forward line (F1..F7) it differentiates.
#include "qkv/nn/seed001_training.h"

#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/losses.h"

namespace qkv::nn {

namespace {

const Tensor& weight(const NamedTensors& w, const char* name) {
  const auto it = w.find(name);
  if (it == w.end()) fail<ValueError>("seed001: missing weight '", name, "'");
  return it->second;
}

// [B, T, H*K] -> [B, H, T, K] and back.
Tensor split_heads(const Tensor& t, int64_t h) {
  return t.reshape({t.size(0), t.size(1), h, t.size(2) / h}).permute({0, 2, 1, 3});
}
Tensor merge_heads(const Tensor& t) {
  return t.permute({0, 2, 1, 3}).contiguous().reshape({t.size(0), t.size(2), t.size(1) * t.size(3)});
}

// A projection's weight gradients under the layer's names and shapes (Keras' kernel axes).
void keep(const LinearGradients& g, const Tensor& kernel, const Tensor& bias, const std::string& name,
          NamedTensors& grads) {
  grads[name + "_kernel"] = g.dweight.reshape(kernel.shape());
  grads[name + "_bias"] = g.dbias->reshape(bias.shape());
}

}  // namespace

Seed001Step seed001_loss_and_grads(const NamedTensors& w, const Tensor& x, const Tensor& y) {
  const Tensor &wq = weight(w, "query_kernel"), &wk = weight(w, "key_kernel"), &wv = weight(w, "value_kernel");
  const Tensor &bq = weight(w, "query_bias"), &bk = weight(w, "key_bias"), &bv = weight(w, "value_bias");
  const Tensor &wo = weight(w, "attention_output_kernel"), &bo = weight(w, "attention_output_bias");
  const Tensor &wd = weight(w, "dense_kernel"), &bd = weight(w, "dense_bias");
  const int64_t h = wq.size(1);
  const Linear lq = Linear::keras(wq, bq), lk = Linear::keras(wk, bk), lv = Linear::keras(wv, bv);
  const Linear lo = Linear::keras(wo, bo, 2), ld = Linear::keras(wd, bd);
  // F1: q, k, v = x Wq + bq, ...                              [B, T, H*K] each
  const Tensor q = lq.forward(x), k = lk.forward(x), v = lv.forward(x);
  // F2: o = softmax(q k^T / sqrt(K)) v per head                [B, H, T, K]
  AttentionOptions ao;
  ao.return_logsumexp = true;
  const Tensor qh = split_heads(q, h), kh = split_heads(k, h), vh = split_heads(v, h);
  const AttentionResult att = scaled_dot_product_attention(qh, kh, vh, ao);
  // F3: heads merged                                          [B, T, H*K]
  const Tensor oc = merge_heads(att.output);
  // F4: a = oc Wo + bo                                         [B, T, D]
  const Tensor a = lo.forward(oc);
  // F5: z = a Wd + bd                                          [B, T, 1]
  const Tensor z = ld.forward(a);
  // F6: loss = mean BCE(z, y)
  const LossResult bce = binary_cross_entropy_with_logits(z, y);

  Seed001Step step;
  step.loss = bce.loss;
  // B6 (F6): dz = (sigmoid(z) - y) / N
  // B5 (F5): dWd = a^T dz, dbd = sum dz, da = dz Wd^T
  const LinearGradients gd = ld.backward(a, bce.grad);
  keep(gd, wd, bd, "dense", step.grads);
  // B4 (F4): dWo = oc^T da, dbo = sum da, doc = da Wo^T
  const LinearGradients go = lo.backward(oc, gd.dx);
  keep(go, wo, bo, "attention_output", step.grads);
  // B3 (F3): the merge is a permutation: split the gradient the same way
  // B2 (F2): the fused attention backward from F2's saved output and logsumexp
  const AttentionGradients g =
      scaled_dot_product_attention_backward(qh, kh, vh, att.output, split_heads(go.dx, h), *att.logsumexp, ao);
  // B1 (F1): dW = x^T d(q|k|v), db = sum d(q|k|v)
  keep(lq.backward(x, merge_heads(g.dq)), wq, bq, "query", step.grads);
  keep(lk.backward(x, merge_heads(g.dk)), wk, bk, "key", step.grads);
  keep(lv.backward(x, merge_heads(g.dv)), wv, bv, "value", step.grads);
  return step;
}

std::vector<double> train_seed001(NamedTensors& weights, const Tensor& x, const Tensor& y, int epochs,
                                  Adam& optimizer) {
  std::vector<double> losses;
  for (int e = 0; e < epochs; ++e) {
    const Seed001Step s = seed001_loss_and_grads(weights, x, y);
    losses.push_back(s.loss);
    optimizer.step(weights, s.grads);
  }
  return losses;
}

}  // namespace qkv::nn
