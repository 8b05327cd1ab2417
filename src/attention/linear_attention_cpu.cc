// The linear-attention CPU kernel (qkv/linear_attention.h). Per batch entry, with
// F = phi(Q) [Lq, D], G = phi(K) [Lk, D]:
//   non-causal: KV = G^T V [D, Dv], z = sum_j G_j [D]; out = (F KV) / (F z)
//   causal, chunk by chunk (rows c0..c1): A = F_c G_c^T [C, C] with keys j > i zeroed;
//     out_c = (A V_c + F_c S) / (rowsum A + F_c zs), then S += G_c^T V_c, zs += sum G_c
//   (S, zs: the prefix before the chunk). Products through qkv::gemm; batch entries on
//   parallel_for (each entry's GEMMs single-threaded there).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/linear_attention_cpu.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"

namespace qkv::attention {

namespace {

template <class T>
void phi(const T* x, int64_t n, T* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] > T(0) ? x[i] + T(1) : std::exp(x[i]);  // elu(x) + 1
}

template <class T>
void product(bool ta, bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb,
             T beta, T* c, int64_t ldc) {
  GemmShape g;
  g.trans_a = ta, g.trans_b = tb;
  g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  gemm(g, T(1), a, b, beta, c);
}

// out [rows, Dv] /= den [rows]; a zero denominator with no key gives 0 (no keys at all).
template <class T>
void divide(T* out, int64_t rows, int64_t dv, const std::vector<T>& den, bool no_keys) {
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t c = 0; c < dv; ++c) out[i * dv + c] = no_keys ? T(0) : out[i * dv + c] / den[static_cast<size_t>(i)];
  }
}

template <class T>
void non_causal(const LinearProblem& p, int64_t fd, const T* f, const T* g, const T* v, T* out) {
  std::vector<T> kv(static_cast<size_t>(fd * p.dv)), z(static_cast<size_t>(fd), T(0)), den(static_cast<size_t>(p.lq));
  product<T>(true, false, fd, p.dv, p.lk, g, fd, v, p.dv, T(0), kv.data(), p.dv);  // G^T V [D, Dv]
  for (int64_t j = 0; j < p.lk; ++j) {
    for (int64_t c = 0; c < fd; ++c) z[static_cast<size_t>(c)] += g[j * fd + c];
  }
  product<T>(false, false, p.lq, p.dv, fd, f, fd, kv.data(), p.dv, T(0), out, p.dv);  // F KV [Lq, Dv]
  for (int64_t i = 0; i < p.lq; ++i) {
    T s = 0;
    for (int64_t c = 0; c < fd; ++c) s += f[i * fd + c] * z[static_cast<size_t>(c)];
    den[static_cast<size_t>(i)] = s;
  }
  divide(out, p.lq, p.dv, den, p.lk == 0);
}

template <class T>
void causal(const LinearProblem& p, int64_t fd, int64_t chunk, const T* f, const T* g, const T* v, T* out) {
  const int64_t cmax = std::min(chunk, std::max<int64_t>(p.lq, 1));
  std::vector<T> s(static_cast<size_t>(fd * p.dv), T(0)), zs(static_cast<size_t>(fd), T(0));
  std::vector<T> a(static_cast<size_t>(cmax * cmax)), den(static_cast<size_t>(cmax));
  for (int64_t c0 = 0; c0 < p.lq; c0 += cmax) {
    const int64_t n = std::min(cmax, p.lq - c0);
    const T *fc = f + c0 * fd, *gc = g + c0 * fd, *vc = v + c0 * p.dv;
    T* oc = out + c0 * p.dv;
    product<T>(false, true, n, n, fd, fc, fd, gc, fd, T(0), a.data(), n);  // F_c G_c^T [n, n]
    for (int64_t i = 0; i < n; ++i) {
      std::fill(a.begin() + i * n + i + 1, a.begin() + (i + 1) * n, T(0));  // keys after the query
      T r = 0;
      for (int64_t j = 0; j <= i; ++j) r += a[static_cast<size_t>(i * n + j)];
      for (int64_t c = 0; c < fd; ++c) r += fc[i * fd + c] * zs[static_cast<size_t>(c)];
      den[static_cast<size_t>(i)] = r;
    }
    product<T>(false, false, n, p.dv, n, a.data(), n, vc, p.dv, T(0), oc, p.dv);    // A V_c
    product<T>(false, false, n, p.dv, fd, fc, fd, s.data(), p.dv, T(1), oc, p.dv);  // + F_c S
    divide(oc, n, p.dv, den, false);
    product<T>(true, false, fd, p.dv, n, gc, fd, vc, p.dv, T(1), s.data(), p.dv);  // S += G_c^T V_c
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < fd; ++c) zs[static_cast<size_t>(c)] += gc[j * fd + c];
    }
  }
}

// FAVOR+ features of rows x [n, D] into y [n, m]: exp(W x' - |x'|^2 / 2 - shift) / sqrt(m)
// with x' = x / D^(1/4); shift = the row's largest exponent (per_row) or the largest over
// all rows (keys): a common factor per query row or for every key, which the ratio cancels.
template <class T>
void favor(const T* x, int64_t n, int64_t d, const T* w, int64_t m, bool per_row, T* y) {
  if (n == 0) return;
  const T s = static_cast<T>(1.0 / std::sqrt(std::sqrt(static_cast<double>(d))));
  std::vector<T> xs(static_cast<size_t>(n * d)), half(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    T sq = 0;
    for (int64_t c = 0; c < d; ++c)
      sq += (xs[static_cast<size_t>(i * d + c)] = x[i * d + c] * s) * xs[static_cast<size_t>(i * d + c)];
    half[static_cast<size_t>(i)] = sq / T(2);
  }
  product<T>(false, true, n, m, d, xs.data(), d, w, d, T(0), y, m);  // x' W^T [n, m]
  T shift = -std::numeric_limits<T>::infinity();
  for (int64_t i = 0; i < n; ++i) {
    T row = -std::numeric_limits<T>::infinity();
    for (int64_t j = 0; j < m; ++j) row = std::max(row, y[i * m + j] - half[static_cast<size_t>(i)]);
    if (per_row) {
      for (int64_t j = 0; j < m; ++j) y[i * m + j] = y[i * m + j] - half[static_cast<size_t>(i)] - row;
    } else {
      shift = std::max(shift, row);
      for (int64_t j = 0; j < m; ++j) y[i * m + j] -= half[static_cast<size_t>(i)];
    }
  }
  const T norm = static_cast<T>(1.0 / std::sqrt(static_cast<double>(m)));
  for (int64_t i = 0; i < n * m; ++i) y[i] = std::exp(per_row ? y[i] : y[i] - shift) * norm;
}

template <class T>
Tensor run(const LinearProblem& p, const LinearAttentionOptions& o) {
  Tensor out = Tensor::empty({p.batch, p.lq, p.dv}, dtype_of<T>::value);  // [batch, Lq, Dv]
  const T *q = p.q.data<T>(), *k = p.k.data<T>(), *v = p.v.data<T>();
  T* dst = out.data<T>();
  const bool use_favor = o.feature_map == LinearFeatureMap::favor;
  const int64_t fd = use_favor ? (o.num_features > 0 ? o.num_features : 2 * p.d) : p.d;  // features per row
  const Tensor w = use_favor ? favor_random_features(p.d, fd, o.seed).to(dtype_of<T>::value) : Tensor();  // [m, D]
  parallel_for(0, p.batch, 1, [&](int64_t lo, int64_t hi) {
    std::vector<T> f(static_cast<size_t>(p.lq * fd)), g(static_cast<size_t>(p.lk * fd));
    for (int64_t b = lo; b < hi && !interrupt_requested(); ++b) {
      if (use_favor) {
        favor(q + b * p.lq * p.d, p.lq, p.d, w.data<T>(), fd, true, f.data());
        favor(k + b * p.lk * p.d, p.lk, p.d, w.data<T>(), fd, false, g.data());
      } else {
        phi(q + b * p.lq * p.d, p.lq * p.d, f.data());
        phi(k + b * p.lk * p.d, p.lk * p.d, g.data());
      }
      const T* vb = v + b * p.lk * p.dv;
      T* ob = dst + b * p.lq * p.dv;
      if (o.is_causal) {
        causal(p, fd, o.chunk, f.data(), g.data(), vb, ob);
      } else {
        non_causal(p, fd, f.data(), g.data(), vb, ob);
      }
    }
  });
  return out;
}

}  // namespace

Tensor linear_attention_cpu(const LinearProblem& p, const LinearAttentionOptions& options) {
  if (p.q.dtype() == DType::f64) return run<double>(p, options);
  return run<float>(p, options);
}

}  // namespace qkv::attention
