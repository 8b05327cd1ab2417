// The linear-attention CPU kernel (qkv/linear_attention.h). Per batch entry, with
// F = phi(Q) [Lq, D], G = phi(K) [Lk, D]:
//   non-causal: KV = G^T V [D, Dv], z = sum_j G_j [D]; out = (F KV) / (F z)
//   causal, chunk by chunk (rows c0..c1): A = F_c G_c^T [C, C] with keys j > i zeroed;
//     out_c = (A V_c + F_c S) / (rowsum A + F_c zs), then S += G_c^T V_c, zs += sum G_c
//   (S, zs: the prefix before the chunk). Products through qkv::gemm; batch entries on
//   parallel_for (each entry's GEMMs single-threaded there). FAVOR+'s features are shifted
//   for range (favor_exponents below; FavorChunks when causal).
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

// FAVOR+ (see linear_attention.h). phi(q) . phi(k) = sum_r exp(a_r + b_r) / m with the raw
// exponents a_r = w_r . q' (a query's -|q'|^2 / 2 is common to its row: the ratio cancels it)
// and b_r = w_r . k' - |k'|^2 / 2, x' = x / D^(1/4). Any shift c_r per feature moves between
// the two sides: exp(a_r + b_r) = exp(a_r + c_r) exp(b_r - c_r). With c_r = max_j b_jr every
// key feature is <= 1 and one key's is 1 in each column; with the query row shifted by its
// max_r (a_r + c_r) one of its features is 1 too, so each row's denominator is >= 1: nothing
// overflows, and no denominator underflows to 0 at any input scale (a shift over all keys and
// features together, as Performer's code uses, lets early causal rows or far-off queries reach
// 0/0). Raw exponents of rows x [n, D] into y [n, m]:
template <class T>
void favor_exponents(const T* x, int64_t n, int64_t d, const T* w, int64_t m, bool keys, T* y) {
  if (n == 0) return;
  const T s = static_cast<T>(1.0 / std::sqrt(std::sqrt(static_cast<double>(d))));
  std::vector<T> xs(static_cast<size_t>(n * d));  // x' [n, D]
  for (int64_t i = 0; i < n * d; ++i) xs[static_cast<size_t>(i)] = x[i] * s;
  product<T>(false, true, n, m, d, xs.data(), d, w, d, T(0), y, m);  // x' W^T [n, m]
  if (!keys) return;
  for (int64_t i = 0; i < n; ++i) {
    T sq = 0;
    for (int64_t c = 0; c < d; ++c) sq += xs[static_cast<size_t>(i * d + c)] * xs[static_cast<size_t>(i * d + c)];
    for (int64_t r = 0; r < m; ++r) y[i * m + r] -= sq / T(2);
  }
}

// c [m] = max(c, the column maxima of b [n, m]): the key shift (a running one when causal).
template <class T>
void column_max(const T* b, int64_t n, int64_t m, T* c) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < m; ++r) c[r] = std::max(c[r], b[i * m + r]);
  }
}

// Key features y = exp(b - c) [n, m] (y may be b).
template <class T>
void key_features(const T* b, int64_t n, int64_t m, const T* c, T* y) {
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t r = 0; r < m; ++r) y[i * m + r] = std::exp(b[i * m + r] - c[r]);
  }
}

// Query features y = exp(a + c - max_r (a_r + c_r)) per row [n, m] (y may be a): the key
// shift moved to the query side, then the row's own shift.
template <class T>
void query_features(const T* a, int64_t n, int64_t m, const T* c, T* y) {
  for (int64_t i = 0; i < n; ++i) {
    T top = -std::numeric_limits<T>::infinity();
    for (int64_t r = 0; r < m; ++r) top = std::max(top, y[i * m + r] = a[i * m + r] + c[r]);
    for (int64_t r = 0; r < m; ++r) y[i * m + r] = std::exp(y[i * m + r] - top);
  }
}

// Non-causal FAVOR+ features in place: raw exponents f [Lq, m], g [Lk, m] -> features.
template <class T>
void favor_features(T* f, int64_t lq, T* g, int64_t lk, int64_t m) {
  std::vector<T> c(static_cast<size_t>(m), lk > 0 ? -std::numeric_limits<T>::infinity() : T(0));
  column_max(g, lk, m, c.data());
  key_features(g, lk, m, c.data(), g);
  query_features(f, lq, m, c.data(), f);
}

// Causal FAVOR+, chunk by chunk. The key shift is the running column maximum of the raw key
// exponents through the chunk's last row (c_new; c_old before the chunk): the prefix sums S,
// zs, kept at c_old, meet the chunk's queries through fc * exp(c_old - c_new), and move to
// c_new after the chunk. A row whose chunk holds the key that sets its largest feature's shift
// only after the row itself can still get a denominator that underflows: exact_row recomputes
// such a row with its own prefix maximum.
template <class T>
class FavorChunks {
 public:
  FavorChunks(const T* a, const T* b, int64_t m, int64_t cmax)
      : a_(a),
        b_(b),
        m_(m),
        c_old_(static_cast<size_t>(m), -std::numeric_limits<T>::infinity()),
        c_new_(c_old_),
        scale_(static_cast<size_t>(m)),
        cl_(c_old_),
        fq_(scale_),
        fc_(static_cast<size_t>(cmax * m)),
        gc_(fc_) {}
  T* fc() { return fc_.data(); }
  const T* gc() const { return gc_.data(); }
  // fc, gc [n, m]: the features of rows c0 .. c0 + n - 1 at c_new.
  void features(int64_t c0, int64_t n) {
    c0_ = c0;
    column_max(b_ + c0 * m_, n, m_, c_new_.data());
    key_features(b_ + c0 * m_, n, m_, c_new_.data(), gc_.data());
    query_features(a_ + c0 * m_, n, m_, c_new_.data(), fc_.data());
    for (size_t r = 0; r < scale_.size(); ++r) scale_[r] = std::exp(c_old_[r] - c_new_[r]);  // 0 before any key
  }
  // fc *= exp(c_old - c_new) per feature: the queries against S, zs at c_old.
  void to_old(int64_t n) {
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t r = 0; r < m_; ++r) fc_[static_cast<size_t>(i * m_ + r)] *= scale_[static_cast<size_t>(r)];
    }
  }
  // S [m, Dv], zs [m] from c_old to c_new.
  void advance(T* s, T* zs, int64_t dv) {
    for (int64_t r = 0; r < m_; ++r) {
      for (int64_t c = 0; c < dv; ++c) s[r * dv + c] *= scale_[static_cast<size_t>(r)];
      zs[r] *= scale_[static_cast<size_t>(r)];
    }
    c_old_ = c_new_;
  }
  // Row c0 + t [Dv] from S, zs (at c_old) and the chunk's keys c0 .. c0 + t (values vc), with
  // the shift cl = max(c_old, their raw exponents): its denominator is >= 1 (the key that sets
  // cl at the query's largest feature r contributes exp(0) * exp(0)).
  void exact_row(int64_t t, const T* s, const T* zs, const T* vc, int64_t dv, T* out) {
    cl_ = c_old_;
    column_max(b_ + c0_ * m_, t + 1, m_, cl_.data());
    query_features(a_ + (c0_ + t) * m_, 1, m_, cl_.data(), fq_.data());
    T den = 0;
    std::fill(out, out + dv, T(0));
    for (int64_t r = 0; r < m_; ++r) {  // the prefix, moved from c_old to cl
      const size_t ru = static_cast<size_t>(r);
      const T w = fq_[ru] * std::exp(c_old_[ru] - cl_[ru]);
      den += w * zs[r];
      for (int64_t c = 0; c < dv; ++c) out[c] += w * s[r * dv + c];
    }
    for (int64_t j = 0; j <= t; ++j) {  // the chunk's keys up to the row
      T w = 0;
      for (int64_t r = 0; r < m_; ++r)
        w += fq_[static_cast<size_t>(r)] * std::exp(b_[(c0_ + j) * m_ + r] - cl_[static_cast<size_t>(r)]);
      den += w;
      for (int64_t c = 0; c < dv; ++c) out[c] += w * vc[j * dv + c];
    }
    for (int64_t c = 0; c < dv; ++c) out[c] /= den;
  }

 private:
  const T *a_, *b_;  // raw exponents [L, m] of the queries and keys
  int64_t m_, c0_ = 0;
  std::vector<T> c_old_, c_new_, scale_, cl_, fq_;  // [m]
  std::vector<T> fc_, gc_;                          // [chunk, m]
};

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

// Causal rows chunk by chunk, from the features f [L, fd], g [L, fd] (elu), or from FAVOR+'s
// raw exponents there through `fav`, which makes each chunk's features.
template <class T>
void causal(const LinearProblem& p, int64_t fd, int64_t chunk, const T* f, const T* g, const T* v, T* out,
            FavorChunks<T>* fav) {
  const int64_t cmax = std::min(chunk, std::max<int64_t>(p.lq, 1));
  std::vector<T> s(static_cast<size_t>(fd * p.dv), T(0)), zs(static_cast<size_t>(fd), T(0));
  std::vector<T> a(static_cast<size_t>(cmax * cmax)), den(static_cast<size_t>(cmax));
  // A denominator this small may have lost its largest terms to underflow (FAVOR+ only).
  const T tiny = std::sqrt(std::numeric_limits<T>::min());
  for (int64_t c0 = 0; c0 < p.lq; c0 += cmax) {
    const int64_t n = std::min(cmax, p.lq - c0);
    const T *fc = f + c0 * fd, *gc = g + c0 * fd, *vc = v + c0 * p.dv;
    T* oc = out + c0 * p.dv;
    if (fav != nullptr) fav->features(c0, n), fc = fav->fc(), gc = fav->gc();
    product<T>(false, true, n, n, fd, fc, fd, gc, fd, T(0), a.data(), n);  // F_c G_c^T [n, n]
    if (fav != nullptr) fav->to_old(n);
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
    if (fav != nullptr) {
      for (int64_t i = 0; i < n; ++i) {
        if (!(den[static_cast<size_t>(i)] >= tiny)) fav->exact_row(i, s.data(), zs.data(), vc, p.dv, oc + i * p.dv);
      }
      fav->advance(s.data(), zs.data(), p.dv);
    }
    product<T>(true, false, fd, p.dv, n, gc, fd, vc, p.dv, T(1), s.data(), p.dv);  // S += G_c^T V_c
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t c = 0; c < fd; ++c) zs[static_cast<size_t>(c)] += gc[j * fd + c];
    }
  }
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
      if (use_favor) {  // raw exponents; non-causal: the features in place
        favor_exponents(q + b * p.lq * p.d, p.lq, p.d, w.data<T>(), fd, false, f.data());
        favor_exponents(k + b * p.lk * p.d, p.lk, p.d, w.data<T>(), fd, true, g.data());
        if (!o.is_causal) favor_features(f.data(), p.lq, g.data(), p.lk, fd);
      } else {
        phi(q + b * p.lq * p.d, p.lq * p.d, f.data());
        phi(k + b * p.lk * p.d, p.lk * p.d, g.data());
      }
      const T* vb = v + b * p.lk * p.dv;
      T* ob = dst + b * p.lq * p.dv;
      if (o.is_causal && use_favor) {
        FavorChunks<T> fav(f.data(), g.data(), fd, std::min(o.chunk, std::max<int64_t>(p.lq, 1)));
        causal(p, fd, o.chunk, f.data(), g.data(), vb, ob, &fav);
      } else if (o.is_causal) {
        causal<T>(p, fd, o.chunk, f.data(), g.data(), vb, ob, nullptr);
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
