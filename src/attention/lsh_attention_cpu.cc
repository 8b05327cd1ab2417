// The LSH attention CPU kernel (qkv/lsh_attention.h), in three parallel phases per call:
//   1. per (entry, round): buckets = argmax([x, -x]) of x = qk R_r (qkv::gemm over row blocks),
//      then a counting sort by bucket (stable: positions ascend within a bucket) -> perm;
//      (and each key's length-norm factor, once per entry);
//   2. per (entry, chunk of the rounds' concatenated sorted order): the chunk's and its
//      neighbours' rows gathered (a thread's next chunk reuses all but one block), S = Q K^T
//      [C, K] and O = P V [C, Dv] through qkv::gemm, the length norm, Reformer's masks and self
//      mask and the softmax with its logsumexp per row in double; O scattered back to the
//      queries' positions (per round when n_hashes > 1);
//   3. n_hashes > 1: the rounds merged with weights exp(lse_r - logsumexp_r lse_r).
// Entries go in groups (as many as 64 MB of buffers hold, at least threads-many). Memory: perm
// [group, rounds, L], with several rounds their outputs [group, rounds, L, Dv] and logsumexps
// (float64); per thread O(C K) scratch. No [L, L] array.
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
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

// sum_{i < n} term(i) in double, over four chains (one would wait on each add's latency).
template <class F>
double sum_in_double(int64_t n, const F& term) {
  double acc[4] = {0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int u = 0; u < 4; ++u) acc[u] += term(i + u);
  }
  for (; i < n; ++i) acc[0] += term(i);
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

constexpr int64_t kScorePieces = 2;  // the slices of D the scores are summed from (scores())

template <class T>
struct Scratch {
  std::vector<T> rows, parts;   // [K, D] gathered qk, [pieces, C, K] partial scores
  std::vector<double> s;        // [C, K] scores
  std::vector<T> vals, p, o;    // [K, Dv] gathered v, [C, K] weights, [C, Dv] unnormalized output
  std::vector<double> scale;    // [K] the keys' length-norm factors
  std::vector<double> inv_sum;  // [C] 1 / each query's softmax sum
  std::vector<int64_t> pos;     // [K] the keys' positions
  std::vector<uint8_t> pad;     // [K] 1 = the key is padding
  // A query's own position among the keys: its index in the chunk (-1 for other positions) [L],
  // and the keys holding it [C, span] (several where a neighbour chunk is from another round).
  std::vector<int32_t> query_of;
  std::vector<int64_t> self_keys, self_count;
  // The rows are span blocks of C, chunk u (unwrapped) in block u mod span: the next chunk of
  // the same entry reuses all but one block. own = the block of the chunk's own rows (queries).
  int64_t entry = -1, chunk = -1, own = 0;
};

// Gathers chunk c's and its neighbours' rows of qk and v, circularly over
// the rounds' sorted order, with the keys' length-norm factors scale [L] and padding flags;
// after chunk c - 1 of the same entry only chunk c + after is new.
template <class T>
void gather_chunk(const LshProblem& p, int64_t e, int64_t c, const int64_t* perm, const double* scale, Scratch<T>& w) {
  const int64_t cl = p.chunk_rows(), before = p.chunks_before();
  const int64_t total = p.rounds() * p.l / cl, span = before + 1 + p.chunks_after();
  const T *qk = p.qk.data<T>() + e * p.l * p.d, *v = p.v.data<T>() + e * p.l * p.dv;
  const bool next = w.entry == e && w.chunk == c - 1;
  w.entry = e, w.chunk = c, w.own = c % span;
  for (int64_t a = next ? span - 1 : 0; a < span; ++a) {
    const int64_t u = c - before + a, cc = (u % total + total) % total, block = (u % span + span) % span;
    for (int64_t t = 0; t < cl; ++t) {
      const int64_t pos = perm[cc * cl + t], row = block * cl + t;
      w.pos[static_cast<size_t>(row)] = pos;
      w.scale[static_cast<size_t>(row)] = scale[pos];
      w.pad[static_cast<size_t>(row)] = p.is_padding(e, pos) ? 1 : 0;
      std::copy_n(qk + pos * p.d, p.d, w.rows.data() + row * p.d);
      std::copy_n(v + pos * p.dv, p.dv, w.vals.data() + row * p.dv);
    }
  }
}

// w.s [C, K] = the raw scores Q K^T (q [C, D]: the chunk's own rows; keys w.rows [K, D]) in
// double, as the sum of kScorePieces T GEMMs over slices of D: a T GEMM's rounding grows with
// its depth, and was most of the error with one (oneDNN's at depth 32 is 1.5x OpenBLAS', the
// naive float32 run's). Two halves: +5% time over one at L >= 4096 (+17% at 1024); four: +6-17%
// more (docs/attention-variants-lsh.md).
template <class T>
void scores(const LshProblem& p, const T* q, Scratch<T>& w) {
  const int64_t cl = p.chunk_rows(), nk = static_cast<int64_t>(w.pos.size()), size = cl * nk;
  const int64_t piece = (p.d + kScorePieces - 1) / kScorePieces, full = p.d / piece;
  const int64_t pieces = (p.d + piece - 1) / piece;
  w.parts.resize(static_cast<size_t>(pieces * size));
  GemmShape g;
  g.trans_b = true;
  g.m = cl, g.n = nk, g.k = piece, g.lda = p.d, g.ldb = p.d, g.ldc = nk;
  gemm(g, T(1), q, w.rows.data(), T(0), w.parts.data(), GemmBatch{{full}, {piece}, {piece}, {size}});
  if (full < pieces) {
    g.k = p.d - full * piece;
    gemm(g, T(1), q + full * piece, w.rows.data() + full * piece, T(0), w.parts.data() + full * size, GemmBatch{});
  }
  double* s = w.s.data();
  for (int64_t i = 0; i < size; ++i) s[i] = static_cast<double>(w.parts[static_cast<size_t>(i)]);
  for (int64_t b = 1; b < pieces; ++b) {
    const T* part = w.parts.data() + b * size;
    for (int64_t i = 0; i < size; ++i) s[i] += static_cast<double>(part[i]);
  }
}

// Lists, per query of the chunk, the keys at its own position (Reformer masks them all): one
// lookup per key instead of a comparison per (query, key).
template <class T>
void mark_self(const LshProblem& p, Scratch<T>& w) {
  const int64_t cl = p.chunk_rows(), nk = static_cast<int64_t>(w.pos.size()), span = nk / cl;
  const int64_t* queries = w.pos.data() + w.own * cl;
  for (int64_t i = 0; i < cl; ++i) w.query_of[static_cast<size_t>(queries[i])] = static_cast<int32_t>(i);
  std::fill(w.self_count.begin(), w.self_count.end(), 0);
  for (int64_t j = 0; j < nk; ++j) {
    const int32_t i = w.query_of[static_cast<size_t>(w.pos[static_cast<size_t>(j)])];
    if (i >= 0) w.self_keys[static_cast<size_t>(i * span + w.self_count[static_cast<size_t>(i)]++)] = j;
  }
  for (int64_t i = 0; i < cl; ++i) w.query_of[static_cast<size_t>(queries[i])] = -1;
}

// Query i's row of raw scores q . k_j [K] -> the softmax's unnormalized weights exp(s - max) <= 1
// into weights [K] (T); returns the sum of the weights (before their rounding to T) and sets top.
template <class T>
double softmax_row(const LshProblem& p, const Scratch<T>& w, int64_t i, double* row, T* weights, double& top) {
  const int64_t nk = static_cast<int64_t>(w.pos.size()), cl = p.chunk_rows(), span = nk / cl;
  const int64_t qp = w.pos[static_cast<size_t>(w.own * cl + i)];
  for (int64_t j = 0; j < nk; ++j) row[j] *= w.scale[static_cast<size_t>(j)];  // the key's length norm
  if (!p.mask.empty() || p.causal) {
    for (int64_t j = 0; j < nk; ++j) {
      if (w.pad[static_cast<size_t>(j)] != 0 || (p.causal && w.pos[static_cast<size_t>(j)] > qp)) {
        row[j] = kLshMaskValue;
      }
    }
  }
  for (int64_t k = 0; k < w.self_count[static_cast<size_t>(i)]; ++k) {
    row[w.self_keys[static_cast<size_t>(i * span + k)]] = kLshSelfValue;
  }
  top = kernels::max_value(row, nk);
  // The shift in double, the exp in T: s - top rounds to T with an absolute error of at most
  // |s - top| 2^-25, and exp(s - top) <= e^-|s - top| weighs it down.
  for (int64_t j = 0; j < nk; ++j) weights[j] = static_cast<T>(row[j] - top);
  const T sum = kernels::exp_shift_sum(weights, nk, T(0));  // weights[j] = exp(s_j - top)
  if constexpr (std::is_same_v<T, double>) return sum;
  return sum_in_double(nk, [&](int64_t j) { return static_cast<double>(weights[j]); });  // not T's lanes
}

// One chunk c (of rounds * L / C) of entry e: softmax over its and its neighbours' keys.
// Writes out [L, Dv] (one round) or the round's outputs [L, Dv] and logsumexps [L].
// Precision (issue 16: float32 error <= 2x a naive float32 run's; docs/attention-variants-lsh.md):
// S = Q K^T summed in double from two half-depth GEMMs (scores()), the length norm (never a
// rounded normalized key), masks and softmax in double per row, the weights exp(s - max) <= 1
// rounded once to T for an unnormalized O = P V, each output row divided by its sum once.
template <class T>
void attend_chunk(const LshProblem& p, int64_t e, int64_t c, const int64_t* perm, const double* scale, Scratch<T>& w,
                  T* out, double* lse) {
  const int64_t cl = p.chunk_rows(), before = p.chunks_before();
  const int64_t nk = (before + 1 + p.chunks_after()) * cl;
  gather_chunk<T>(p, e, c, perm, scale, w);
  mark_self<T>(p, w);
  const T* q = w.rows.data() + w.own * cl * p.d;  // the chunk's own rows are its queries [C, D]
  scores<T>(p, q, w);                             // raw Q K^T [C, K]
  for (int64_t i = 0; i < cl; ++i) {
    const int64_t qp = w.pos[static_cast<size_t>(w.own * cl + i)];
    double top = 0;
    const double sum = softmax_row<T>(p, w, i, w.s.data() + i * nk, w.p.data() + i * nk, top);
    w.inv_sum[static_cast<size_t>(i)] = 1.0 / sum;
    // In double: at top = -1e5 (a token with only itself left) float32 would round the sum's log
    // to a spacing of 2^-7, and the rounds' weights with it.
    if (lse != nullptr) lse[qp] = top + std::log(sum);
  }
  product<T>(false, cl, p.dv, nk, w.p.data(), nk, w.vals.data(), p.dv, w.o.data(), p.dv);  // unnormalized O [C, Dv]
  for (int64_t i = 0; i < cl; ++i) {
    const T* o = w.o.data() + i * p.dv;
    T* dst = out + w.pos[static_cast<size_t>(w.own * cl + i)] * p.dv;
    const double inv = w.inv_sum[static_cast<size_t>(i)];
    for (int64_t t = 0; t < p.dv; ++t) dst[t] = static_cast<T>(static_cast<double>(o[t]) * inv);
  }
}

// scale [L] = each of entry e's keys' length-norm factor 1 / sqrt(mean(x^2) + 1e-6) / sqrt(D)
// (Reformer's), in double: the scores take it after the GEMM, so no normalized key is rounded.
template <class T>
void key_scales(const LshProblem& p, int64_t e, double* scale) {
  const T* x = p.qk.data<T>() + e * p.l * p.d;  // [L, D]
  const double inv_sqrt_d = 1.0 / std::sqrt(static_cast<double>(p.d));
  for (int64_t i = 0; i < p.l; ++i, x += p.d) {
    const double sq = sum_in_double(p.d, [&](int64_t t) { return static_cast<double>(x[t]) * x[t]; });
    scale[i] = inv_sqrt_d / std::sqrt(sq / static_cast<double>(p.d) + 1e-6);
  }
}

// Phase 1's results for a group of entries.
struct Sorted {
  std::vector<int64_t> perm;  // [g, rounds, L] each round's positions in bucket order
  std::vector<double> scale;  // [g, L] the keys' length-norm factors
};

// Phase 1 for entries [e0, e0 + g): perm (the identity when standard) and scale.
template <class T>
Sorted sort_group(const LshProblem& p, int64_t e0, int64_t g) {
  const int64_t rounds = p.rounds();
  Sorted out{std::vector<int64_t>(static_cast<size_t>(g * rounds * p.l)),
             std::vector<double>(static_cast<size_t>(g * p.l))};
  parallel_for(0, g * rounds, 1, [&](int64_t lo, int64_t hi) {
    std::vector<int64_t> buckets(static_cast<size_t>(p.l));
    for (int64_t item = lo; item < hi && !interrupt_requested(); ++item) {
      const int64_t el = item / rounds;
      if (item % rounds == 0) key_scales<T>(p, e0 + el, out.scale.data() + el * p.l);
      int64_t* dst = out.perm.data() + item * p.l;
      if (p.standard) {
        for (int64_t i = 0; i < p.l; ++i) dst[i] = i;
        continue;
      }
      hash_round<T>(p, e0 + el, item % rounds, buckets.data());
      counting_sort(buckets.data(), p.l, p.n_buckets, dst);
    }
  });
  return out;
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
  const Sorted sorted = sort_group<T>(p, e0, g);
  const int64_t rounds = p.rounds(), cl = p.chunk_rows(), per_entry = rounds * p.l / cl;
  const int64_t nk = (p.chunks_before() + 1 + p.chunks_after()) * cl;
  // Several rounds: each round's output [g, rounds, L, Dv] and logsumexp [g, rounds, L].
  std::vector<T> outs(rounds > 1 ? static_cast<size_t>(g * rounds * p.l * p.dv) : 0);
  std::vector<double> lses(rounds > 1 ? static_cast<size_t>(g * rounds * p.l) : 0);
  parallel_for(0, g * per_entry, 1, [&](int64_t lo, int64_t hi) {
    Scratch<T> w;
    w.rows.resize(static_cast<size_t>(nk * p.d)), w.vals.resize(static_cast<size_t>(nk * p.dv));
    w.s.resize(static_cast<size_t>(cl * nk)), w.p.resize(w.s.size()), w.o.resize(static_cast<size_t>(cl * p.dv));
    w.scale.resize(static_cast<size_t>(nk)), w.pad.resize(static_cast<size_t>(nk));
    w.inv_sum.resize(static_cast<size_t>(cl)), w.pos.resize(static_cast<size_t>(nk));
    w.query_of.assign(static_cast<size_t>(p.l), -1), w.self_count.resize(static_cast<size_t>(cl));
    w.self_keys.resize(static_cast<size_t>(nk));
    for (int64_t item = lo; item < hi && !interrupt_requested(); ++item) {
      const int64_t el = item / per_entry, c = item % per_entry, r = c * cl / p.l;
      const int64_t* pe = sorted.perm.data() + el * rounds * p.l;
      const double* scale = sorted.scale.data() + el * p.l;
      if (rounds == 1) {
        attend_chunk<T>(p, e0 + el, c, pe, scale, w, out + (e0 + el) * p.l * p.dv, nullptr);
      } else {
        const int64_t er = el * rounds + r;
        attend_chunk<T>(p, e0 + el, c, pe, scale, w, outs.data() + er * p.l * p.dv, lses.data() + er * p.l);
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
  const int64_t per_entry = p.l * 8 + p.rounds() * p.l * (8 + (p.rounds() > 1 ? p.dv * int64_t{sizeof(T)} + 8 : 0));
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
