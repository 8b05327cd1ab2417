// additive_attention_reference: Keras' AdditiveAttention step by step in float64, written
// apart from the kernel (whole score matrix, then mask, softmax, product), one thread.
#include <algorithm>
#include <cmath>
#include <vector>

#include "qkv/additive_attention.h"
#include "qkv/error.h"

namespace qkv {

Tensor additive_attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AdditiveAttentionOptions& o) {
  const Shape lead(q.shape().begin(), q.shape().end() - std::min<int64_t>(2, q.dim()));
  const bool ok = q.dim() >= 2 && k.dim() == q.dim() && v.dim() == q.dim() && k.size(-1) == q.size(-1) &&
                  v.size(-2) == k.size(-2) && Shape(k.shape().begin(), k.shape().end() - 2) == lead &&
                  Shape(v.shape().begin(), v.shape().end() - 2) == lead &&
                  (!o.scale || o.scale->shape() == Shape{q.size(-1)});
  if (!ok) {
    fail<ShapeError>(
        "additive_attention_reference: expected q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] and scale "
        "[D], got q ",
        shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()));
  }
  const int64_t tq = q.size(-2), tk = k.size(-2), d = q.size(-1), dv = v.size(-1);
  const int64_t batch = shape_numel(lead);
  const auto qd = q.to_vector<double>(), kd = k.to_vector<double>(), vd = v.to_vector<double>();
  const std::vector<double> scale = o.scale ? o.scale->to_vector<double>() : std::vector<double>(d, 1.0);
  const std::vector<double> mask = o.value_mask ? o.value_mask->to_vector<double>() : std::vector<double>();
  std::vector<double> out(static_cast<size_t>(batch * tq * dv), 0.0), scores(static_cast<size_t>(tq * tk));
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < tq; ++i) {
      for (int64_t j = 0; j < tk; ++j) {
        double sc = 0.0;
        for (int64_t c = 0; c < d; ++c) sc += scale[c] * std::tanh(qd[(b * tq + i) * d + c] + kd[(b * tk + j) * d + c]);
        const bool masked = (!mask.empty() && mask[b * tk + j] == 0.0) || (o.use_causal_mask && j > i);
        // The penalty in the inputs' precision, as Keras computes it: in float32 a masked score
        // becomes -1e9 whatever it was (the spacing there is 64), so a fully masked row is uniform.
        const double low = q.dtype() == DType::f64 ? sc - 1e9 : static_cast<double>(static_cast<float>(sc) - 1e9f);
        scores[i * tk + j] = masked ? low : sc;
      }
    }
    for (int64_t i = 0; i < tq && tk > 0; ++i) {
      double mx = scores[i * tk];
      for (int64_t j = 1; j < tk; ++j) mx = std::max(mx, scores[i * tk + j]);
      double z = 0.0;
      for (int64_t j = 0; j < tk; ++j) z += std::exp(scores[i * tk + j] - mx);
      for (int64_t j = 0; j < tk; ++j) {
        const double w = std::exp(scores[i * tk + j] - mx) / z;
        for (int64_t c = 0; c < dv; ++c) out[(b * tq + i) * dv + c] += w * vd[(b * tk + j) * dv + c];
      }
    }
  }
  Shape shape(q.shape().begin(), q.shape().end() - 1);
  shape.push_back(dv);
  return Tensor::from_vector(out, shape).to(q.dtype());
}

}  // namespace qkv
