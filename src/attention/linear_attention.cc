// linear_attention: checks the call, lays out the operands, runs the CPU kernel.
#include "qkv/linear_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention/linear_attention_cpu.h"
#include "attention/qkv_geometry.h"
#include "qkv/error.h"
#include "qkv/size.h"

namespace qkv::attention {

LinearProblem make_linear_problem(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const LinearAttentionOptions& options, const char* op, DType compute) {
  const QkvGeometry g = check_qkv(op, q, k, v);
  if (options.is_causal && q.size(-2) != k.size(-2)) {
    fail<ShapeError>(op, ": is_causal needs Lq == Lk ", qkv_shapes(q, k, v));
  }
  if (options.chunk < 1) fail<ValueError>(op, ": chunk must be >= 1, got ", options.chunk);
  if (options.num_features < 0) fail<ValueError>(op, ": num_features must be >= 0, got ", options.num_features);
  if (options.feature_map == LinearFeatureMap::favor) {
    // The kernel holds m features per query and key row ([L, m]), W [m, D] and phi(K)^T V
    // [m, Dv]: a count that overflows int64 wrapped their sizes (a crash for m = 2^62).
    const int64_t m = options.num_features > 0 ? options.num_features : 2 * g.d;
    if (!checked_mul(m, std::max({g.lq, g.lk, g.d, g.dv, int64_t{1}}))) {
      fail<ValueError>(op, ": num_features = ", m, " features per row overflow ", qkv_shapes(q, k, v));
    }
  }
  LinearProblem p;
  p.batch = g.batch, p.lq = g.lq, p.lk = g.lk, p.d = g.d, p.dv = g.dv;
  p.out_shape = g.out_shape;
  p.out_dtype = q.dtype();
  auto dense = [&](const Tensor& t, int64_t l, int64_t n) {
    return t.to(compute).contiguous().reshape({p.batch, l, n});
  };
  p.q = dense(q, p.lq, p.d);
  p.k = dense(k, p.lk, p.d);
  p.v = dense(v, p.lk, p.dv);
  return p;
}

}  // namespace qkv::attention

namespace qkv {

Tensor favor_random_features(int64_t d, int64_t m, uint64_t seed) {
  if (d < 1 || m < 1) fail<ValueError>("favor_random_features: d and m must be >= 1, got ", d, ", ", m);
  if (!checked_mul(m, d)) fail<ValueError>("favor_random_features: m x d = ", m, " x ", d, " overflows");
  std::vector<double> w(static_cast<size_t>(m * d));
  for (int64_t r0 = 0, block = 0; r0 < m; r0 += d, ++block) {
    const uint64_t bs = seed * 1000003 + static_cast<uint64_t>(block);
    const auto g = Tensor::randn({d, d}, bs, DType::f64).to_vector<double>();               // Gaussian block
    const auto norms = Tensor::randn({d, d}, bs + 500009, DType::f64).to_vector<double>();  // chi(d) draws
    std::vector<double> q(g);
    for (int64_t i = 0; i < d; ++i) {  // Gram-Schmidt: rows orthonormal
      double* qi = q.data() + i * d;
      for (int64_t j = 0; j < i; ++j) {
        const double* qj = q.data() + j * d;
        double dot = 0;
        for (int64_t c = 0; c < d; ++c) dot += qi[c] * qj[c];
        for (int64_t c = 0; c < d; ++c) qi[c] -= dot * qj[c];
      }
      double n = 0;
      for (int64_t c = 0; c < d; ++c) n += qi[c] * qi[c];
      n = std::sqrt(n);
      for (int64_t c = 0; c < d; ++c) qi[c] /= n;
    }
    for (int64_t i = 0; i < d && r0 + i < m; ++i) {
      double len = 0;  // the row's length: the norm of a Gaussian d-vector, as an unstructured row has
      for (int64_t c = 0; c < d; ++c) len += norms[i * d + c] * norms[i * d + c];
      len = std::sqrt(len);
      for (int64_t c = 0; c < d; ++c) w[(r0 + i) * d + c] = q[i * d + c] * len;
    }
  }
  return Tensor::from_vector(w, {m, d});
}

Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v, const LinearAttentionOptions& options) {
  constexpr const char* kOp = "linear_attention";
  const DType compute = q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const attention::LinearProblem p = attention::make_linear_problem(q, k, v, options, kOp, compute);
  return attention::linear_attention_cpu(p, options).reshape(p.out_shape).to(p.out_dtype);
}

}  // namespace qkv
