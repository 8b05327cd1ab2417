#include "nn/keras_masks.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "qkv/error.h"

namespace qkv::nn::detail {

namespace {

// Keras' cast to bool: nonzero = True.
Tensor as_bool(const Tensor& m) {
  if (m.dtype() == DType::b8) return m;
  const Tensor f = m.to(DType::f64).contiguous();
  Tensor out = Tensor::empty(m.shape(), DType::b8);
  const double* src = f.data<double>();
  bool* dst = out.data<bool>();
  for (int64_t i = 0; i < f.numel(); ++i) dst[i] = src[i] != 0.0;
  return out;
}

Tensor and_broadcast(const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), "KerasMultiHeadAttention: masks");
  const Tensor x = a.expand(shape).contiguous(), y = b.expand(shape).contiguous();
  Tensor out = Tensor::empty(shape, DType::b8);
  const bool* p = x.data<bool>();
  const bool* q = y.data<bool>();
  bool* o = out.data<bool>();
  for (int64_t i = 0; i < out.numel(); ++i) o[i] = p[i] && q[i];
  return out;
}

// [1, T, S]: row >= col (Keras' _compute_causal_mask over axis 1 of query and value).
Tensor causal_mask(int64_t t, int64_t s) {
  Tensor m = Tensor::empty({1, t, s}, DType::b8);
  bool* p = m.data<bool>();
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < s; ++j) p[i * s + j] = i >= j;
  }
  return m;
}

// [1, T, S]: |row - col| < w (Keras' _compute_sliding_window_mask over axis 1).
Tensor sliding_window_mask(int64_t t, int64_t s, int64_t w) {
  Tensor m = Tensor::empty({1, t, s}, DType::b8);
  bool* p = m.data<bool>();
  for (int64_t i = 0; i < t; ++i) {
    for (int64_t j = 0; j < s; ++j) p[i * s + j] = (i > j ? i - j : j - i) < w;
  }
  return m;
}

// Keras builds the window from axis 1's lengths whatever the attention axes: it is the
// window over the attended axis only when that is axis 1 alone (on others Keras raises, or
// masks axis-1 positions of another axis when the lengths happen to agree).
void check_window_axes(const KerasAxes& axes, const Tensor& query, int64_t w) {
  if (axes.attention == std::vector<int64_t>{1}) return;
  std::string list;
  for (int64_t a : axes.attention) list += (list.empty() ? "" : ", ") + std::to_string(a);
  fail<ValueError>("KerasMultiHeadAttention: sliding_window=", w, " with attention over the axes (", list,
                   ") of a query ", shape_str(query.shape()),
                   " is not supported: Keras 3.15 builds the window from axis 1's lengths only (it raises or masks "
                   "the wrong axis there); use attention_axes=(1,) or no sliding_window");
}

}  // namespace

std::optional<Tensor> keras_attention_mask(const Tensor& query, const Tensor& value,
                                           const KerasMultiHeadAttentionOptions& o, const KerasAxes& axes,
                                           std::optional<int64_t> sliding_window) {
  if (sliding_window) check_window_axes(axes, query, *sliding_window);
  std::optional<Tensor> m;
  auto add = [&](const Tensor& t) { m = m ? and_broadcast(*m, t) : t; };
  if (o.query_mask) add(as_bool(*o.query_mask).unsqueeze(-1));  // [B, T, 1]
  if (o.value_mask) add(as_bool(*o.value_mask).unsqueeze(-2));  // [B, 1, S]
  if (o.key_mask) add(as_bool(*o.key_mask).unsqueeze(-2));      // [B, 1, S]
  if (o.use_causal_mask) add(causal_mask(query.size(1), value.size(1)));
  if (sliding_window) add(sliding_window_mask(query.size(1), value.size(1), *sliding_window));
  if (o.attention_mask) add(as_bool(*o.attention_mask));
  if (!m) return std::nullopt;
  const int64_t k = static_cast<int64_t>(axes.attention.size());
  const int64_t nb = static_cast<int64_t>(axes.batch.size());
  const int64_t score_rank = nb + 1 + 2 * k;
  if (m->dim() > score_rank || m->dim() < 2 * k) {
    fail<ShapeError>("KerasMultiHeadAttention: the combined attention mask ", shape_str(m->shape()),
                     " does not fit scores of rank ", score_rank);
  }
  // Keras expands at the heads axis until the ranks agree.
  Shape shape = m->shape();
  shape.insert(shape.begin() + (m->dim() - 2 * k), static_cast<size_t>(score_rank - m->dim()), 1);
  Shape full = shape;
  int64_t t = 1, s = 1;
  for (int64_t i = 0; i < k; ++i) {
    full[static_cast<size_t>(nb + 1 + i)] = query.size(axes.attention[static_cast<size_t>(i)]);
    full[static_cast<size_t>(nb + 1 + k + i)] = value.size(axes.attention[static_cast<size_t>(i)]);
    t *= query.size(axes.attention[static_cast<size_t>(i)]);
    s *= value.size(axes.attention[static_cast<size_t>(i)]);
  }
  for (size_t i = 0; i < shape.size(); ++i) {  // else Tensor::expand's error, which names neither the layer nor a mask
    if (shape[i] != 1 && shape[i] != full[i]) {
      fail<ShapeError>("KerasMultiHeadAttention: the masks (query_mask [B, T], value_mask / key_mask [B, S], ",
                       "attention_mask [B, T, S], causal, sliding window) combine to ", shape_str(m->shape()),
                       ", which does not fit the scores' attention axes ", shape_str(full), " of query ",
                       shape_str(query.shape()), " and value ", shape_str(value.shape()));
    }
  }
  Shape flat(shape.begin(), shape.begin() + nb + 1);  // [mask batch..., heads]
  flat.push_back(t);
  flat.push_back(s);
  return m->reshape(shape).expand(full).reshape(flat);  // [mb..., 1, T, S]
}

void fill_fully_masked_rows(const Tensor& mask, const Tensor& v, const Tensor& out,
                            const std::optional<Tensor>& scores) {
  const Tensor mc = mask.contiguous();
  const int64_t s = mc.size(-1);
  const bool* p = mc.data<bool>();
  bool any_empty = false;
  for (int64_t r = 0; r < mc.numel() / std::max<int64_t>(s, 1) && !any_empty; ++r) {
    any_empty = std::none_of(p + r * s, p + (r + 1) * s, [](bool x) { return x; });
  }
  if (!any_empty) return;
  Shape full = out.shape();
  full.back() = s;  // [batch..., N, T, S]
  const Tensor me = mask.expand(full).contiguous();
  const Tensor vc = v.contiguous();  // [batch..., N, S, Dv]
  const int64_t t = out.size(-2), dv = out.size(-1), rows = me.numel() / std::max<int64_t>(s, 1);
  const bool* q = me.data<bool>();
  float* o = out.data<float>();
  const float* vp = vc.data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    if (std::any_of(q + r * s, q + (r + 1) * s, [](bool x) { return x; })) continue;
    const float* vb = vp + (r / t) * s * dv;  // this batch-head's values
    for (int64_t d = 0; d < dv; ++d) {
      double sum = 0;
      for (int64_t j = 0; j < s; ++j) sum += vb[j * dv + d];
      o[r * dv + d] = static_cast<float>(sum / static_cast<double>(s));
    }
    if (scores)
      std::fill(scores->data<float>() + r * s, scores->data<float>() + (r + 1) * s, 1.0f / static_cast<float>(s));
  }
}

Tensor keras_gate(const Linear& gate, const Tensor& query) {
  Tensor g = gate.forward(query).contiguous();  // f32 [B, A.., N*vd]
  float* p = g.data<float>();
  for (int64_t i = 0; i < g.numel(); ++i) p[i] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(p[i]))));
  return g;
}

Tensor multiply(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) {
    fail<ShapeError>("KerasMultiHeadAttention: ", shape_str(a.shape()), " * ", shape_str(b.shape()));
  }
  Tensor out = a.to(DType::f32).contiguous().clone();
  const Tensor y = b.to(DType::f32).contiguous();
  float* p = out.data<float>();
  const float* q = y.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] *= q[i];
  return out;
}

}  // namespace qkv::nn::detail
