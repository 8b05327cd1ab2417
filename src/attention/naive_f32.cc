// The naive float32 attention of naive_f32.h: readability over speed.
#include "attention/naive_f32.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/problem.h"
#include "qkv/gemm.h"
#include "qkv/random.h"

namespace qkv::attention {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Additive bias of mask element `off`: 0 / -inf for bool masks, the value otherwise.
float bias(const Tensor& mask, int64_t off) {
  if (mask.dtype() == DType::b8) return mask.data<bool>()[off] ? 0.0f : kNegInf;
  return mask.data<float>()[off];
}

// Scores s [Lq, Lk] of batch entry b: scale * q k^T as one float32 matrix
// product (qkv::gemm, as PyTorch's unfused path uses its BLAS), then mask and causal.
void scores(const Problem& p, const AttentionOptions& o, int64_t b, float* s) {
  const float* q = p.q.data<float>() + batch_offset(p.q, p.batch, b, 1);
  const float* k = p.k.data<float>() + batch_offset(p.k, p.batch, b, p.gqa_group);
  GemmShape g;
  g.trans_b = true;
  g.m = p.lq;
  g.n = p.lk;
  g.k = p.dk;
  g.lda = p.q.stride(-2);
  g.ldb = p.k.stride(-2);
  g.ldc = p.lk;
  // gemm skips q k^T when alpha is 0 (BLAS rules); scale 0 must still turn inf into NaN.
  const float alpha = static_cast<float>(p.scale);
  gemm(g, alpha == 0.0f ? 1.0f : alpha, q, k, 0.0f, s);
  if (alpha == 0.0f) std::transform(s, s + p.lq * p.lk, s, [](float x) { return x * 0.0f; });
  const int64_t mask_base = p.mask ? batch_offset(*p.mask, p.batch, b, 1) : 0;
  for (int64_t i = 0; i < p.lq; ++i) {
    for (int64_t j = 0; j < p.lk; ++j) {
      float& x = s[i * p.lk + j];
      if (p.mask) x += bias(*p.mask, mask_base + i * p.mask->stride(-2) + j * p.mask->stride(-1));
      if (o.is_causal && j > i) x = kNegInf;
    }
  }
}

// Row i of the weights, in place over its scores w [Lk]: softmax, then dropout.
// Causal keys j > i are not in the row (weight 0); a NaN or +inf score makes the
// row NaN (the max keeps NaN, exp(inf - inf) is NaN); all -inf gives zeros.
void softmax_row(const Problem& p, const AttentionOptions& o, int64_t b, int64_t i, float* w) {
  const int64_t keys = o.is_causal ? std::min(p.lk, i + 1) : p.lk;
  std::fill(w + keys, w + p.lk, 0.0f);
  float mx = kNegInf;
  for (int64_t j = 0; j < keys; ++j) mx = std::isnan(w[j]) || w[j] > mx ? w[j] : mx;
  if (mx == kNegInf) {  // fully masked row: zeros
    std::fill(w, w + keys, 0.0f);
    return;
  }
  const float keep_scale = o.dropout_p < 1.0 ? static_cast<float>(1.0 / (1.0 - o.dropout_p)) : 0.0f;
  float sum = 0.0f;
  for (int64_t j = 0; j < keys; ++j) sum += (w[j] = std::exp(w[j] - mx));
  for (int64_t j = 0; j < keys; ++j) {
    w[j] /= sum;
    const auto index = static_cast<uint64_t>((b * p.lq + i) * p.lk + j);
    if (o.dropout_p > 0.0) w[j] = random::dropout_keep(o.seed, index, o.dropout_p) ? w[j] * keep_scale : 0.0f;
  }
}

}  // namespace

AttentionResult attention_naive_f32(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  AttentionOptions o = options;
  if (o.attn_mask && o.attn_mask->dtype() != DType::b8) o.attn_mask = o.attn_mask->to(DType::f32);
  // Contiguous f32 copies: rows the matrix products can read.
  auto f32 = [](const Tensor& t) { return t.to(DType::f32).contiguous(); };
  const Problem p = make_problem(f32(q), f32(k), f32(v), o, "attention_naive_f32");
  Shape out_shape = p.batch, w_shape = p.batch;
  out_shape.insert(out_shape.end(), {p.lq, p.dv});
  w_shape.insert(w_shape.end(), {p.lq, p.lk});
  Tensor out = Tensor::zeros(out_shape), weights = Tensor::zeros(w_shape);
  for (int64_t b = 0; b < p.batch_size; ++b) {
    float* w = weights.data<float>() + b * p.lq * p.lk;  // [Lq, Lk]
    scores(p, o, b, w);
    for (int64_t i = 0; i < p.lq; ++i) softmax_row(p, o, b, i, w + i * p.lk);
    GemmShape g;  // out [Lq, Dv] = w [Lq, Lk] v [Lk, Dv]
    g.m = p.lq;
    g.n = p.dv;
    g.k = p.lk;
    g.lda = p.lk;
    g.ldb = p.v.stride(-2);
    g.ldc = p.dv;
    gemm(g, 1.0f, w, p.v.data<float>() + batch_offset(p.v, p.batch, b, p.gqa_group), 0.0f,
         out.data<float>() + b * p.lq * p.dv);
  }
  return {out, weights, std::nullopt};
}

}  // namespace qkv::attention
