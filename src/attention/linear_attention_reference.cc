// linear_attention_reference: the formula in float64 loops, one thread.
#include <cmath>
#include <vector>

#include "attention/linear_attention_cpu.h"

namespace qkv {

namespace {

double phi(double x) { return x > 0.0 ? x + 1.0 : std::exp(x); }  // elu(x) + 1

}  // namespace

Tensor linear_attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const LinearAttentionOptions& options) {
  const attention::LinearProblem p =
      attention::make_linear_problem(q, k, v, options, "linear_attention_reference", DType::f64);
  const double *qd = p.q.data<double>(), *kd = p.k.data<double>(), *vd = p.v.data<double>();
  std::vector<double> out(static_cast<size_t>(p.batch * p.lq * p.dv));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t i = 0; i < p.lq; ++i) {
      const int64_t keys = options.is_causal ? i + 1 : p.lk;
      double den = 0.0;
      std::vector<double> num(static_cast<size_t>(p.dv), 0.0);
      for (int64_t j = 0; j < keys; ++j) {
        double w = 0.0;  // phi(q_i) . phi(k_j)
        for (int64_t c = 0; c < p.d; ++c) w += phi(qd[(b * p.lq + i) * p.d + c]) * phi(kd[(b * p.lk + j) * p.d + c]);
        den += w;
        for (int64_t c = 0; c < p.dv; ++c) num[static_cast<size_t>(c)] += w * vd[(b * p.lk + j) * p.dv + c];
      }
      for (int64_t c = 0; c < p.dv; ++c) {
        out[static_cast<size_t>((b * p.lq + i) * p.dv + c)] = keys == 0 ? 0.0 : num[static_cast<size_t>(c)] / den;
      }
    }
  }
  return Tensor::from_vector(out, p.out_shape).to(p.out_dtype);
}

}  // namespace qkv
