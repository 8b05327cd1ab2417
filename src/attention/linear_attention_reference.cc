// linear_attention_reference: the formula in float64 loops, one thread.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/linear_attention_cpu.h"

namespace qkv {

namespace {

double phi(double x) { return x > 0.0 ? x + 1.0 : std::exp(x); }  // elu(x) + 1

// FAVOR+'s log-features of rows x [n, D] (float64, [n, m]): log phi_r(x) = w_r . x' - |x'|^2 / 2
// - log(m) / 2, x' = x / D^(1/4).
std::vector<double> favor_log_features(const double* x, int64_t n, int64_t d, const std::vector<double>& w, int64_t m) {
  const double s = 1.0 / std::sqrt(std::sqrt(static_cast<double>(d)));
  std::vector<double> y(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i) {
    double sq = 0;
    for (int64_t c = 0; c < d; ++c) sq += x[i * d + c] * s * x[i * d + c] * s;
    for (int64_t r = 0; r < m; ++r) {
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += w[static_cast<size_t>(r * d + c)] * x[i * d + c] * s;
      y[static_cast<size_t>(i * m + r)] = dot - sq / 2 - std::log(static_cast<double>(m)) / 2;
    }
  }
  return y;
}

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
  std::vector<double> out(static_cast<size_t>(p.batch * p.lq * p.dv));
  for (int64_t b = 0; b < p.batch; ++b) {
    // FAVOR+ in log space: the weight phi(q_i) . phi(k_j) = exp(l_ij), l_ij = logsumexp_r
    // (log phi_r(q_i) + log phi_r(k_j)), taken relative to the row's largest l_ij: the same
    // function, at inputs whose features over- or underflow even float64 (exp(-|x'|^2 / 2)
    // is 0 for |x'| > 39).
    const std::vector<double> fq = use_favor ? favor_log_features(qd + b * p.lq * p.d, p.lq, p.d, w, m)
                                             : std::vector<double>(),
                              fk = use_favor ? favor_log_features(kd + b * p.lk * p.d, p.lk, p.d, w, m)
                                             : std::vector<double>();
    for (int64_t i = 0; i < p.lq; ++i) {
      const int64_t keys = options.is_causal ? i + 1 : p.lk;
      std::vector<double> wij(static_cast<size_t>(keys));  // phi(q_i) . phi(k_j) (FAVOR+: its log)
      for (int64_t j = 0; j < keys; ++j) {
        double dot = 0.0, top = -std::numeric_limits<double>::infinity();
        if (!use_favor) {
          for (int64_t c = 0; c < p.d; ++c)
            dot += phi(qd[(b * p.lq + i) * p.d + c]) * phi(kd[(b * p.lk + j) * p.d + c]);
        } else {
          auto e = [&](int64_t r) { return fq[static_cast<size_t>(i * m + r)] + fk[static_cast<size_t>(j * m + r)]; };
          for (int64_t r = 0; r < m; ++r) top = std::max(top, e(r));
          for (int64_t r = 0; r < m; ++r) dot += std::exp(e(r) - top);
        }
        wij[static_cast<size_t>(j)] = use_favor ? top + std::log(dot) : dot;
      }
      const double top = use_favor && keys > 0 ? *std::max_element(wij.begin(), wij.end()) : 0.0;
      double den = 0.0;
      std::vector<double> num(static_cast<size_t>(p.dv), 0.0);
      for (int64_t j = 0; j < keys; ++j) {
        const double x = use_favor ? std::exp(wij[static_cast<size_t>(j)] - top) : wij[static_cast<size_t>(j)];
        den += x;
        for (int64_t c = 0; c < p.dv; ++c) num[static_cast<size_t>(c)] += x * vd[(b * p.lk + j) * p.dv + c];
      }
      for (int64_t c = 0; c < p.dv; ++c) {
        out[static_cast<size_t>((b * p.lq + i) * p.dv + c)] = keys == 0 ? 0.0 : num[static_cast<size_t>(c)] / den;
      }
    }
  }
  return Tensor::from_vector(out, p.out_shape).to(p.out_dtype);
}

}  // namespace qkv
