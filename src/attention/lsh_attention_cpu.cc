// The LSH attention CPU kernel (qkv/lsh_attention.h), in three parallel phases per call:
//   1. per (entry, round): buckets = argmax([x, -x]) of x = qk R_r (qkv::gemm over row blocks),
//      then a counting sort by bucket (stable: positions ascend within a bucket) -> perm;
//   2. per (entry, chunk of the rounds' concatenated sorted order): the chunk's and its
//      neighbours' rows gathered, keys length-normalized, S = Q K^T [C, K] and O = P V
//      [C, Dv] through qkv::gemm, Reformer's masks and self mask, softmax with its logsumexp;
//      O scattered back to the queries' positions (per round when n_hashes > 1);
//   3. n_hashes > 1: the rounds merged with weights exp(lse_r - logsumexp_r lse_r).
// Entries go in groups (as many as 64 MB of buffers hold, at least threads-many). Memory: perm
// [group, rounds, L], with several rounds their outputs [group, rounds, L, Dv] and logsumexps
// (float64); per thread O(C K) scratch. No [L, L] array.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/lsh_attention_cpu.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "qkv/softmax.h"

namespace qkv::attention {

namespace {

template <class T>
void product(bool tb, int64_t m, int64_t n, int64_t k, const T* a, int64_t lda, const T* b, int64_t ldb, T* c,
             int64_t ldc) {
  GemmShape g;
  g.trans_b = tb;
  g.m = m, g.n = n, g.k = k, g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  gemm(g, T(1), a, b, T(0), c, GemmBatch{});
}

// The buckets of entry e in round r: [L] in [0, n_buckets] (n_buckets = padding).
template <class T>
void hash_round(const LshProblem& p, int64_t e, int64_t r, int64_t* buckets) {
  constexpr int64_t kRows = 256;                // rows per GEMM: bounds the scratch at kRows x half
  const T* x = p.qk.data<T>() + e * p.l * p.d;  // [L, D]
  const int64_t head = p.rotations.size(0) == 1 ? 0 : e % p.heads;
  const int64_t ldr = p.n_hashes * p.half;                               // rotations [.., D, n_hashes, half]
  const T* rot = p.rotations.data<T>() + head * p.d * ldr + r * p.half;  // [D, half], row stride ldr
  std::vector<T> y(static_cast<size_t>(std::min(kRows, std::max<int64_t>(p.l, 1)) * p.half));
  for (int64_t r0 = 0; r0 < p.l; r0 += kRows) {
    const int64_t n = std::min(kRows, p.l - r0);
    product<T>(false, n, p.half, p.d, x + r0 * p.d, p.d, rot, ldr, y.data(), p.half);  // [n, half]
    for (int64_t i = 0; i < n; ++i) {
      const T* yi = y.data() + i * p.half;
      int64_t bucket = 0, scale = 1, col = 0;
      for (const int64_t f : p.factors) {  // argmax over [y, -y] of this factor's f/2 columns
        const int64_t h = f / 2;
        int64_t best = 0;
        T top = yi[col];
        for (int64_t j = 1; j < f; ++j) {
          const T val = j < h ? yi[col + j] : -yi[col + j - h];
          if (val > top) top = val, best = j;
        }
        bucket += scale * best;
        scale *= f, col += h;
      }
      buckets[r0 + i] = p.is_padding(e, r0 + i) ? p.n_buckets : bucket;
    }
  }
}

// perm [L] = the positions sorted stably by bucket (counting sort over n_buckets + 1 buckets).
void counting_sort(const int64_t* buckets, int64_t l, int64_t n_buckets, int64_t* perm) {
  std::vector<int64_t> start(static_cast<size_t>(n_buckets + 2), 0);
  for (int64_t i = 0; i < l; ++i) ++start[static_cast<size_t>(buckets[i] + 1)];
  for (size_t b = 1; b < start.size(); ++b) start[b] += start[b - 1];
  for (int64_t i = 0; i < l; ++i) perm[start[static_cast<size_t>(buckets[i])]++] = i;
}

template <class T>
struct Scratch {
  std::vector<T> rows, keys, vals, s, o;  // [K, D] raw, [K, D] normalized, [K, Dv], [C, K], [C, Dv]
  std::vector<int64_t> pos;               // [K] the keys' positions
};

// One chunk c (of rounds * L / C) of entry e: softmax over its and its neighbours' keys.
// Writes out [L, Dv] (one round) or the round's outputs [L, Dv] and logsumexps [L].
template <class T>
void attend_chunk(const LshProblem& p, int64_t e, int64_t c, const int64_t* perm, Scratch<T>& w, T* out, double* lse) {
  const int64_t cl = p.chunk_rows(), before = p.chunks_before();
  const int64_t total = p.rounds() * p.l / cl, span = before + 1 + p.chunks_after(), nk = span * cl;
  const T *qk = p.qk.data<T>() + e * p.l * p.d, *v = p.v.data<T>() + e * p.l * p.dv;
  for (int64_t a = 0; a < span; ++a) {  // gather: chunk c - before + a, circularly
    const int64_t cc = ((c - before + a) % total + total) % total;
    for (int64_t t = 0; t < cl; ++t) {
      const int64_t pos = perm[cc * cl + t], row = a * cl + t;
      w.pos[static_cast<size_t>(row)] = pos;
      std::copy_n(qk + pos * p.d, p.d, w.rows.data() + row * p.d);
      std::copy_n(v + pos * p.dv, p.dv, w.vals.data() + row * p.dv);
    }
  }
  const T inv_sqrt_d = T(1) / std::sqrt(static_cast<T>(p.d));
  for (int64_t j = 0; j < nk; ++j) {  // k_j = x / sqrt(mean(x^2) + 1e-6) / sqrt(D)
    const T* x = w.rows.data() + j * p.d;
    T sq = 0;
    for (int64_t t = 0; t < p.d; ++t) sq += x[t] * x[t];
    const T norm = T(1) / std::sqrt(sq / static_cast<T>(p.d) + static_cast<T>(1e-6));
    for (int64_t t = 0; t < p.d; ++t) w.keys[static_cast<size_t>(j * p.d + t)] = x[t] * norm * inv_sqrt_d;
  }
  const T* q = w.rows.data() + before * cl * p.d;  // the chunk's own rows are its queries [C, D]
  product<T>(true, cl, nk, p.d, q, p.d, w.keys.data(), p.d, w.s.data(), nk);  // S [C, K]
  for (int64_t i = 0; i < cl; ++i) {
    const int64_t qp = w.pos[static_cast<size_t>(before * cl + i)];
    T* s = w.s.data() + i * nk;
    for (int64_t j = 0; j < nk; ++j) {
      const int64_t kp = w.pos[static_cast<size_t>(j)];
      if (p.is_padding(e, kp) || (p.causal && kp > qp)) s[j] = static_cast<T>(kLshMaskValue);
      if (kp == qp) s[j] = static_cast<T>(kLshSelfValue);
    }
    const T top = kernels::max_value(s, nk);  // the softmax row kernels (Highway SIMD)
    const T sum = kernels::exp_shift_sum(s, nk, top);
    kernels::scale(s, nk, T(1) / sum);
    // In double: at top = -1e5 (a token with only itself left) float32 would round the sum's log
    // to a spacing of 2^-7, and the rounds' weights with it.
    if (lse != nullptr) lse[qp] = static_cast<double>(top) + std::log(static_cast<double>(sum));
  }
  product<T>(false, cl, p.dv, nk, w.s.data(), nk, w.vals.data(), p.dv, w.o.data(), p.dv);  // O [C, Dv]
  for (int64_t i = 0; i < cl; ++i) {
    std::copy_n(w.o.data() + i * p.dv, p.dv, out + w.pos[static_cast<size_t>(before * cl + i)] * p.dv);
  }
}

// Phase 1 for entries [e0, e0 + g): perm [g, rounds, L] (the identity when standard).
template <class T>
std::vector<int64_t> sort_group(const LshProblem& p, int64_t e0, int64_t g) {
  const int64_t rounds = p.rounds();
  std::vector<int64_t> perm(static_cast<size_t>(g * rounds * p.l));
  parallel_for(0, g * rounds, 1, [&](int64_t lo, int64_t hi) {
    std::vector<int64_t> buckets(static_cast<size_t>(p.l));
    for (int64_t item = lo; item < hi && !interrupt_requested(); ++item) {
      int64_t* dst = perm.data() + item * p.l;
      if (p.standard) {
        for (int64_t i = 0; i < p.l; ++i) dst[i] = i;
        continue;
      }
      hash_round<T>(p, e0 + item / rounds, item % rounds, buckets.data());
      counting_sort(buckets.data(), p.l, p.n_buckets, dst);
    }
  });
  return perm;
}

// Phase 3: out [g, L, Dv] = sum_r outs_r exp(lse_r - logsumexp_r lse_r) from the entries'
// rounds' outputs outs [g, rounds, L, Dv] and logsumexps lses [g, rounds, L].
template <class T>
void merge_rounds(const LshProblem& p, int64_t g, int64_t rounds, const T* outs_all, const double* lses_all,
                  T* out_all) {
  parallel_for(0, g * p.l, 256, [&](int64_t lo, int64_t hi) {
    std::vector<double> acc(static_cast<size_t>(p.dv));
    for (int64_t item = lo; item < hi; ++item) {
      const int64_t el = item / p.l, i = item % p.l;
      const T* outs = outs_all + el * rounds * p.l * p.dv;
      const double* lses = lses_all + el * rounds * p.l;
      T* out = out_all + el * p.l * p.dv;
      double top = -INFINITY, sum = 0;
      for (int64_t r = 0; r < rounds; ++r) top = std::max(top, lses[r * p.l + i]);
      for (int64_t r = 0; r < rounds; ++r) sum += std::exp(lses[r * p.l + i] - top);
      std::fill(acc.begin(), acc.end(), 0.0);  // in double: one rounding per output element
      for (int64_t r = 0; r < rounds; ++r) {
        const double weight = std::exp(lses[r * p.l + i] - top) / sum;
        const T* src = outs + (r * p.l + i) * p.dv;
        for (int64_t t = 0; t < p.dv; ++t) acc[static_cast<size_t>(t)] += weight * static_cast<double>(src[t]);
      }
      for (int64_t t = 0; t < p.dv; ++t) out[i * p.dv + t] = static_cast<T>(acc[static_cast<size_t>(t)]);
    }
  });
}

// Entries [e0, e0 + g) into out [batch, L, Dv]: g entries at a time bound the rounds' buffers
// (g rounds x L x Dv) while keeping every thread busy in the hashing phase.
template <class T>
void run_group(const LshProblem& p, int64_t e0, int64_t g, T* out) {
  const std::vector<int64_t> perm = sort_group<T>(p, e0, g);
  const int64_t rounds = p.rounds(), cl = p.chunk_rows(), per_entry = rounds * p.l / cl;
  const int64_t nk = (p.chunks_before() + 1 + p.chunks_after()) * cl;
  // Several rounds: each round's output [g, rounds, L, Dv] and logsumexp [g, rounds, L].
  std::vector<T> outs(rounds > 1 ? static_cast<size_t>(g * rounds * p.l * p.dv) : 0);
  std::vector<double> lses(rounds > 1 ? static_cast<size_t>(g * rounds * p.l) : 0);
  parallel_for(0, g * per_entry, 1, [&](int64_t lo, int64_t hi) {
    Scratch<T> w;
    w.rows.resize(static_cast<size_t>(nk * p.d)), w.keys.resize(w.rows.size());
    w.vals.resize(static_cast<size_t>(nk * p.dv)), w.s.resize(static_cast<size_t>(cl * nk));
    w.o.resize(static_cast<size_t>(cl * p.dv)), w.pos.resize(static_cast<size_t>(nk));
    for (int64_t item = lo; item < hi && !interrupt_requested(); ++item) {
      const int64_t el = item / per_entry, c = item % per_entry, r = c * cl / p.l;
      const int64_t* pe = perm.data() + el * rounds * p.l;
      if (rounds == 1) {
        attend_chunk<T>(p, e0 + el, c, pe, w, out + (e0 + el) * p.l * p.dv, nullptr);
      } else {
        const int64_t er = el * rounds + r;
        attend_chunk<T>(p, e0 + el, c, pe, w, outs.data() + er * p.l * p.dv, lses.data() + er * p.l);
      }
    }
  });
  if (rounds > 1) merge_rounds<T>(p, g, rounds, outs.data(), lses.data(), out + e0 * p.l * p.dv);
}

template <class T>
Tensor run(const LshProblem& p) {
  Tensor out = Tensor::empty({p.batch, p.l, p.dv}, dtype_of<T>::value);  // [batch, L, Dv]
  if (p.batch * p.l == 0) return out;
  // As many entries per group as 64 MB of sort orders and round buffers allow (fewer
  // parallel_for barriers: under a loaded CPU each one can cost a time slice), at least
  // threads-many (every thread busy hashing).
  const int64_t per_entry = p.rounds() * p.l * (8 + (p.rounds() > 1 ? p.dv * int64_t{sizeof(T)} + 8 : 0));
  const int64_t group = std::max<int64_t>(get_num_threads(), (int64_t{64} << 20) / std::max<int64_t>(per_entry, 1));
  for (int64_t e0 = 0; e0 < p.batch; e0 += group) run_group<T>(p, e0, std::min(group, p.batch - e0), out.data<T>());
  return out;
}

template <class T>
Tensor buckets(const LshProblem& p) {
  Tensor out = Tensor::empty({p.batch, p.n_hashes, p.l}, DType::i64);  // [batch, n_hashes, L]
  int64_t* dst = out.data<int64_t>();
  parallel_for(0, p.batch * p.n_hashes, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t item = lo; item < hi; ++item) hash_round<T>(p, item / p.n_hashes, item % p.n_hashes, dst + item * p.l);
  });
  return out;
}

}  // namespace

Tensor lsh_attention_cpu(const LshProblem& p) {
  if (p.qk.dtype() == DType::f64) return run<double>(p);
  return run<float>(p);
}

Tensor lsh_buckets_cpu(const LshProblem& p) {
  if (p.qk.dtype() == DType::f64) return buckets<double>(p);
  return buckets<float>(p);
}

}  // namespace qkv::attention
