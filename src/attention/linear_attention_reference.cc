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
  const bool use_favor = options.feature_map == LinearFeatureMap::favor;
  const int64_t m = options.num_features > 0 ? options.num_features : 2 * p.d;
  const std::vector<double> w =
      use_favor ? favor_random_features(p.d, m, options.seed).to_vector<double>() : std::vector<double>();
  // The feature vector of one row x [D]: elu + 1 per element, or FAVOR+'s m random features
  // exp(w_r . x' - |x'|^2 / 2) / sqrt(m), x' = x / D^(1/4) (no range shift: float64).
  auto features = [&](const double* x) {
    std::vector<double> y;
    if (!use_favor) {
      for (int64_t c = 0; c < p.d; ++c) y.push_back(phi(x[c]));
      return y;
    }
    const double s = 1.0 / std::sqrt(std::sqrt(static_cast<double>(p.d)));
    double sq = 0;
    for (int64_t c = 0; c < p.d; ++c) sq += x[c] * s * x[c] * s;
    for (int64_t r = 0; r < m; ++r) {
      double dot = 0;
      for (int64_t c = 0; c < p.d; ++c) dot += w[static_cast<size_t>(r * p.d + c)] * x[c] * s;
      y.push_back(std::exp(dot - sq / 2) / std::sqrt(static_cast<double>(m)));
    }
    return y;
  };
  std::vector<double> out(static_cast<size_t>(p.batch * p.lq * p.dv));
  for (int64_t b = 0; b < p.batch; ++b) {
    for (int64_t i = 0; i < p.lq; ++i) {
      const int64_t keys = options.is_causal ? i + 1 : p.lk;
      const std::vector<double> fq = features(qd + (b * p.lq + i) * p.d);
      double den = 0.0;
      std::vector<double> num(static_cast<size_t>(p.dv), 0.0);
      for (int64_t j = 0; j < keys; ++j) {
        const std::vector<double> fk = features(kd + (b * p.lk + j) * p.d);
        double wij = 0.0;  // phi(q_i) . phi(k_j)
        for (size_t c = 0; c < fq.size(); ++c) wij += fq[c] * fk[c];
        den += wij;
        for (int64_t c = 0; c < p.dv; ++c) num[static_cast<size_t>(c)] += wij * vd[(b * p.lk + j) * p.dv + c];
      }
      for (int64_t c = 0; c < p.dv; ++c) {
        out[static_cast<size_t>((b * p.lq + i) * p.dv + c)] = keys == 0 ? 0.0 : num[static_cast<size_t>(c)] / den;
      }
    }
  }
  return Tensor::from_vector(out, p.out_shape).to(p.out_dtype);
}

}  // namespace qkv
