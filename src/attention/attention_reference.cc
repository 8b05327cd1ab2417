// The attention oracle: plain loops, float64 accumulation, one thread.
// Readability over speed; every convention is documented in qkv/attention.h.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention_reference.h"
#include "attention/mods_reference.h"
#include "qkv/parallel.h"
#include "qkv/random.h"

namespace qkv {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Additive bias of the mask at (b, i, j): 0 / -inf for bool masks, the value for float masks.
double mask_bias(const Tensor& mask, const double* values, int64_t base, int64_t i, int64_t j) {
  const int64_t off = base + i * mask.stride(-2) + j * mask.stride(-1);
  if (mask.dtype() == DType::b8) return values[off] != 0.0 ? 0.0 : kNegInf;
  return values[off];
}

// Reads every element of `t` (any layout) as double, keeping t's strides.
std::vector<double> as_double(const Tensor& t) {
  // Index by element offset from t's first element: make a same-geometry f64 copy.
  int64_t span = 1;
  for (int64_t d = 0; d < t.dim(); ++d) span += (t.size(d) - 1) * t.stride(d);
  std::vector<double> out(t.numel() == 0 ? 0 : static_cast<size_t>(span), 0.0);
  if (t.numel() == 0) return out;
  // Copy each broadcast (stride-0) element once: writing it through every
  // alias would be a data race in the threaded copy.
  Tensor compact = t;
  for (int64_t d = 0; d < t.dim(); ++d) {
    if (t.stride(d) == 0) compact = compact.slice(d, 0, 1);
  }
  Tensor::from_blob(out.data(), compact.shape(), DType::f64, compact.strides()).copy_from(compact);
  return out;
}

// A new tensor of `dtype` holding `values`.
Tensor to_tensor(std::vector<double>& values, const Shape& shape, DType dtype) {
  Tensor t = Tensor::empty(shape, dtype);
  t.copy_from(Tensor::from_blob(values.data(), shape, DType::f64));
  return t;
}

// w [n] = softmax(s [n]) with PyTorch's conventions (qkv/attention.h); returns
// the row's logsumexp. A NaN or +inf score makes every weight (and the lse) NaN:
// the max keeps a NaN once seen (std::fmax would drop it) and exp(inf - inf) is
// NaN. Every score -inf (all keys masked) gives weights 0 and lse -inf.
double softmax_row(const double* s, double* w, int64_t n) {
  double row_max = kNegInf;
  for (int64_t j = 0; j < n; ++j) row_max = std::isnan(s[j]) || s[j] > row_max ? s[j] : row_max;
  if (row_max == kNegInf) {  // PyTorch's _safe_softmax
    std::fill(w, w + n, 0.0);
    return kNegInf;
  }
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += (w[j] = std::exp(s[j] - row_max));
  for (int64_t j = 0; j < n; ++j) w[j] /= sum;
  return row_max + std::log(sum);
}

}  // namespace

AttentionResult attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options) {
  const attention::CallScope scope("attention_reference", q, k, v, options);  // names it in out-of-memory errors
  return attention::reference_attention(attention::make_problem(q, k, v, options, "attention_reference"), options);
}

AttentionResult attention::reference_attention(const Problem& p, const AttentionOptions& options) {
  if (!p.device.is_cpu()) fail_no_kernel(p.op, p.device);  // reads host memory
  // Zero strides of broadcast dims make as_double() read each shared element once.
  const std::vector<double> q = as_double(p.q), k = as_double(p.k), v = as_double(p.v);
  const std::vector<double> mask = p.mask ? as_double(*p.mask) : std::vector<double>{};

  Shape out_shape = p.batch, w_shape = p.batch, lse_shape = p.batch;
  out_shape.insert(out_shape.end(), {p.lq, p.dv});
  w_shape.insert(w_shape.end(), {p.lq, p.lk});
  lse_shape.push_back(p.lq);
  std::vector<double> out(static_cast<size_t>(shape_numel(out_shape)), 0.0);
  std::vector<double> weights(static_cast<size_t>(shape_numel(w_shape)), 0.0);
  std::vector<double> lse(static_cast<size_t>(shape_numel(lse_shape)), kNegInf);
  const double keep_scale = options.dropout_p < 1.0 ? 1.0 / (1.0 - options.dropout_p) : 0.0;

  std::vector<double> row(static_cast<size_t>(p.lk));
  const attention::ReferenceMods mods(options.mods, p.lq, p.lk, p.heads_q);  // qkv/attention_mods.h
  // An empty operand (Lk == 0, Dv == 0) has a null data(): no offset may be added to it.
  auto at = [](const std::vector<double>& x, int64_t offset) { return x.empty() ? x.data() : x.data() + offset; };
  for (int64_t b = 0; b < p.batch_size; ++b) {
    const double* qb = at(q, attention::batch_offset(p.q, p.batch, b, 1));
    const double* kb = at(k, attention::batch_offset(p.k, p.batch, b, p.gqa_group));
    const double* vb = at(v, attention::batch_offset(p.v, p.batch, b, p.gqa_group));
    const int64_t mask_base = p.mask ? attention::batch_offset(*p.mask, p.batch, b, 1) : 0;
    for (int64_t i = 0; i < p.lq; ++i) {
      check_interrupt(p.op);  // single-threaded and slow (15.9 s at [1, 8, 1024, 64]): Ctrl-C per row
      // Causal masking removes keys j > i from the row (their weights stay 0,
      // whatever q_i . k_j is); a mask adds to the score (bool False: -inf).
      const int64_t keys = options.is_causal ? std::min(p.lk, i + 1) : p.lk;
      for (int64_t j = 0; j < keys; ++j) {  // scores[j] = scale * q_i . k_j + bias(i, j)
        double dot = 0.0;
        for (int64_t d = 0; d < p.dk; ++d) {
          dot += qb[i * p.q.stride(-2) + d * p.q.stride(-1)] * kb[j * p.k.stride(-2) + d * p.k.stride(-1)];
        }
        // Dk == 0: the empty dot product is 0 whatever the scale (inf by default), as PyTorch.
        double score = p.dk == 0 ? 0.0 : dot * p.scale;
        if (mods.active()) score = mods.score(score, b, i, j);
        row[j] = score + (p.mask ? mask_bias(*p.mask, mask.data(), mask_base, i, j) : 0.0);
        if (mods.active() && !mods.allowed(b, i, j)) row[j] = mods.masked();
      }
      double* w = weights.data() + (b * p.lq + i) * p.lk;
      lse[static_cast<size_t>(b * p.lq + i)] = softmax_row(row.data(), w, keys);
      for (int64_t j = 0; j < keys && options.dropout_p > 0.0; ++j) {
        const auto index = static_cast<uint64_t>((b * p.lq + i) * p.lk + j);
        w[j] = random::dropout_keep(options.seed, index, options.dropout_p) ? w[j] * keep_scale : 0.0;
      }
      // o_i = sum_j w_ij v_j over the row's keys, zero weights included: a NaN or
      // inf in v reaches the row through 0 * v as in PyTorch (masked rows too).
      double* o = out.data() + (b * p.lq + i) * p.dv;
      for (int64_t j = 0; j < keys; ++j) {
        for (int64_t d = 0; d < p.dv; ++d) o[d] += w[j] * vb[j * p.v.stride(-2) + d * p.v.stride(-1)];
      }
    }
  }
  AttentionResult result;
  result.output = to_tensor(out, out_shape, p.out_dtype);
  if (options.return_weights) result.weights = to_tensor(weights, w_shape, p.out_dtype);
  // float64 inputs keep a float64 logsumexp (PyTorch's accumulation type); others f32.
  if (options.return_logsumexp) {
    result.logsumexp = to_tensor(lse, lse_shape, p.out_dtype == DType::f64 ? DType::f64 : DType::f32);
  }
  return result;
}

}  // namespace qkv
