// lsh_attention_reference: the definition in qkv/lsh_attention.h as float64 loops, one
// thread, written apart from the kernel: hashing by direct dot products, std::stable_sort,
// scores one dot product at a time, the rounds merged at the end.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "attention/lsh_attention_cpu.h"

namespace qkv {

namespace {

using attention::LshProblem;

// Bucket of row x [D] in round r for head `head`: the factors' argmaxes over [x R, -x R].
int64_t bucket_of(const LshProblem& p, const double* x, const double* rot, int64_t head, int64_t r) {
  int64_t bucket = 0, scale = 1, col = 0;
  for (const int64_t f : p.factors) {
    std::vector<double> y;  // [x R_f, -x R_f]
    for (int64_t j = 0; j < f / 2; ++j) {
      double dot = 0;
      for (int64_t t = 0; t < p.d; ++t) dot += x[t] * rot[((head * p.d + t) * p.n_hashes + r) * p.half + col + j];
      y.push_back(dot);
    }
    for (int64_t j = 0; j < f / 2; ++j) y.push_back(-y[static_cast<size_t>(j)]);
    bucket += scale * (std::max_element(y.begin(), y.end()) - y.begin());  // the first maximum
    scale *= f, col += f / 2;
  }
  return bucket;
}

// The order of positions attention runs over: rounds concatenated, each sorted stably by bucket.
std::vector<int64_t> sorted_positions(const LshProblem& p, int64_t e) {
  std::vector<int64_t> order;
  const double* x = p.qk.data<double>() + e * p.l * p.d;
  const int64_t head = p.rotations.size(0) == 1 ? 0 : e % p.heads;
  for (int64_t r = 0; r < p.rounds(); ++r) {
    std::vector<int64_t> pos(static_cast<size_t>(p.l)), bucket(static_cast<size_t>(p.l));
    std::iota(pos.begin(), pos.end(), 0);
    if (!p.standard) {
      for (int64_t i = 0; i < p.l; ++i) {
        bucket[static_cast<size_t>(i)] =
            p.is_padding(e, i) ? p.n_buckets : bucket_of(p, x + i * p.d, p.rotations.data<double>(), head, r);
      }
      std::stable_sort(pos.begin(), pos.end(), [&](int64_t a, int64_t b) {
        return bucket[static_cast<size_t>(a)] < bucket[static_cast<size_t>(b)];
      });
    }
    order.insert(order.end(), pos.begin(), pos.end());
  }
  return order;
}

}  // namespace

Tensor lsh_attention_reference(const Tensor& qk, const Tensor& v, const LshAttentionOptions& options) {
  const LshProblem p = attention::make_lsh_problem(qk, v, options, "lsh_attention_reference", DType::f64);
  const double *x = p.qk.data<double>(), *vd = p.v.data<double>();
  const int64_t rounds = p.rounds(), cl = p.chunk_rows(), total = rounds * p.l / std::max<int64_t>(cl, 1);
  std::vector<double> out(static_cast<size_t>(p.batch * p.l * p.dv), 0.0);
  for (int64_t e = 0; e < p.batch; ++e) {
    const std::vector<int64_t> order = sorted_positions(p, e);
    const double* xe = x + e * p.l * p.d;
    auto score = [&](int64_t i, int64_t j) {  // qk_i . qk_j / sqrt(mean(qk_j^2) + 1e-6) / sqrt(D)
      double dot = 0, sq = 0;
      for (int64_t t = 0; t < p.d; ++t)
        dot += xe[i * p.d + t] * xe[j * p.d + t], sq += xe[j * p.d + t] * xe[j * p.d + t];
      return dot / std::sqrt(sq / static_cast<double>(p.d) + 1e-6) / std::sqrt(static_cast<double>(p.d));
    };
    // Each round's output and logsumexp per position.
    std::vector<double> outs(static_cast<size_t>(rounds * p.l * p.dv)), lses(static_cast<size_t>(rounds * p.l));
    for (int64_t s = 0; s < rounds * p.l; ++s) {
      const int64_t c = s / cl, qp = order[static_cast<size_t>(s)], r = s / p.l;
      std::vector<int64_t> keys;
      for (int64_t a = -p.chunks_before(); a <= p.chunks_after(); ++a) {
        const int64_t cc = ((c + a) % total + total) % total;
        keys.insert(keys.end(), order.begin() + cc * cl, order.begin() + (cc + 1) * cl);
      }
      std::vector<double> sc;
      for (const int64_t kp : keys) {
        double value = score(qp, kp);
        if (p.is_padding(e, kp) || (p.causal && kp > qp)) value = attention::kLshMaskValue;
        if (kp == qp) value = attention::kLshSelfValue;
        sc.push_back(value);
      }
      const double top = *std::max_element(sc.begin(), sc.end());
      double sum = 0;
      for (const double value : sc) sum += std::exp(value - top);
      const double lse = top + std::log(sum);
      lses[static_cast<size_t>(r * p.l + qp)] = lse;
      for (size_t j = 0; j < keys.size(); ++j) {
        const double weight = std::exp(sc[j] - lse);
        for (int64_t t = 0; t < p.dv; ++t) {
          outs[static_cast<size_t>((r * p.l + qp) * p.dv + t)] += weight * vd[(e * p.l + keys[j]) * p.dv + t];
        }
      }
    }
    for (int64_t i = 0; i < p.l; ++i) {  // merge the rounds by their logsumexps
      double top = -INFINITY, sum = 0;
      for (int64_t r = 0; r < rounds; ++r) top = std::max(top, lses[static_cast<size_t>(r * p.l + i)]);
      for (int64_t r = 0; r < rounds; ++r) sum += std::exp(lses[static_cast<size_t>(r * p.l + i)] - top);
      for (int64_t r = 0; r < rounds; ++r) {
        const double weight = std::exp(lses[static_cast<size_t>(r * p.l + i)] - top) / sum;
        for (int64_t t = 0; t < p.dv; ++t) {
          out[static_cast<size_t>((e * p.l + i) * p.dv + t)] +=
              weight * outs[static_cast<size_t>((r * p.l + i) * p.dv + t)];
        }
      }
    }
  }
  return Tensor::from_vector(out, p.out_shape).to(p.out_dtype);
}

}  // namespace qkv
