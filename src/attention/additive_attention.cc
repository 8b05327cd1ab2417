// additive_attention (qkv/additive_attention.h): the checks and the CPU kernel (query rows on
// parallel_for). The oracle is additive_attention_reference.cc, written separately.
#include "qkv/additive_attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/qkv_geometry.h"
#include "qkv/error.h"
#include "qkv/parallel.h"

namespace qkv {

namespace {

constexpr double kMaskPenalty = 1e9;  // Keras: masked scores -= 1e9 (65504 for float16 scores)

struct Additive {
  int64_t batch = 1, tq = 0, tk = 0, d = 0, dv = 0;
  Shape out_shape;
  DType out_dtype = DType::f32;
  Tensor q, k, v;             // [batch, T, D|Dv] contiguous, compute dtype
  std::vector<double> scale;  // [D]
  std::vector<uint8_t> mask;  // [batch, Tk] (1 = key takes part), empty when none
};

Additive check(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const AdditiveAttentionOptions& o,
               DType compute) {
  const attention::QkvGeometry g = attention::check_qkv(op, q, k, v);
  Additive a;
  a.batch = g.batch, a.tq = g.lq, a.tk = g.lk, a.d = g.d, a.dv = g.dv;
  a.out_shape = g.out_shape;
  a.out_dtype = q.dtype();
  a.q = q.to(compute).contiguous(), a.k = k.to(compute).contiguous(), a.v = v.to(compute).contiguous();
  a.scale.assign(static_cast<size_t>(a.d), 1.0);
  if (o.scale) {
    if (o.scale->shape() != Shape{a.d}) {
      fail<ShapeError>(op, ": scale must be [", a.d, "], got ", shape_str(o.scale->shape()), " ",
                       attention::qkv_shapes(q, k, v));
    }
    a.scale = o.scale->to_vector<double>();
  }
  if (o.value_mask) {
    Shape want = g.lead;
    want.push_back(a.tk);
    if (o.value_mask->shape() != want || o.value_mask->dtype() != DType::b8) {
      fail<ShapeError>(op, ": value_mask must be bool ", shape_str(want), ", got ", shape_str(o.value_mask->shape()),
                       " ", dtype_name(o.value_mask->dtype()), " ", attention::qkv_shapes(q, k, v));
    }
    for (double m : o.value_mask->to_vector<double>()) a.mask.push_back(m != 0.0);
  }
  return a;
}

// One query row i of entry b: scores over the keys (masked per Keras), softmax, weights . v.
template <class T>
void row(const Additive& a, const T* q, const T* k, const T* v, int64_t b, int64_t i, bool causal, T* out,
         std::vector<T>& s) {
  const T* qi = q + (b * a.tq + i) * a.d;
  T mx = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < a.tk; ++j) {
    const T* kj = k + (b * a.tk + j) * a.d;
    T acc = 0;
    for (int64_t c = 0; c < a.d; ++c) acc += static_cast<T>(a.scale[static_cast<size_t>(c)]) * std::tanh(qi[c] + kj[c]);
    const bool keep = (a.mask.empty() || a.mask[static_cast<size_t>(b * a.tk + j)]) && (!causal || j <= i);
    s[static_cast<size_t>(j)] = keep ? acc : acc - static_cast<T>(kMaskPenalty);
    mx = std::max(mx, s[static_cast<size_t>(j)]);
  }
  T sum = 0;
  for (int64_t j = 0; j < a.tk; ++j) sum += (s[static_cast<size_t>(j)] = std::exp(s[static_cast<size_t>(j)] - mx));
  T* oi = out + (b * a.tq + i) * a.dv;
  std::fill(oi, oi + a.dv, T(0));
  for (int64_t j = 0; j < a.tk; ++j) {
    const T w = s[static_cast<size_t>(j)] / sum;
    for (int64_t c = 0; c < a.dv; ++c) oi[c] += w * v[(b * a.tk + j) * a.dv + c];
  }
}

template <class T>
Tensor run(const Additive& a, bool causal) {
  Tensor out = Tensor::zeros({a.batch, a.tq, a.dv}, dtype_of<T>::value);  // [batch, Tq, Dv]
  if (a.tk == 0) return out;
  const T *q = a.q.data<T>(), *k = a.k.data<T>(), *v = a.v.data<T>();
  T* o = out.data<T>();
  auto rows = [&](int64_t lo, int64_t hi) {
    std::vector<T> s(static_cast<size_t>(a.tk));
    for (int64_t r = lo; r < hi && !interrupt_requested(); ++r) row(a, q, k, v, r / a.tq, r % a.tq, causal, o, s);
  };
  parallel_for(0, a.batch * a.tq, 8, rows);
  return out;
}

}  // namespace

Tensor additive_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AdditiveAttentionOptions& o) {
  const DType compute = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const Additive a = check("additive_attention", q, k, v, o, compute);
  const Tensor out = compute == DType::f64 ? run<double>(a, o.use_causal_mask) : run<float>(a, o.use_causal_mask);
  return out.reshape(a.out_shape).to(a.out_dtype);
}

}  // namespace qkv
