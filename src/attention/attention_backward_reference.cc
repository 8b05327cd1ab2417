// The attention-backward oracle: plain loops, float64, one thread. It recomputes
// the forward row by row from q, k, v (qkv/attention_backward.h has the formulas),
// so it shares neither the saved output nor the logsumexp with the kernels it checks.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/attention_backward_reference.h"
#include "attention/mods_reference.h"
#include "qkv/parallel.h"
#include "qkv/random.h"

namespace qkv::attention {

namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// `t` as a contiguous float64 tensor (t itself when it already is one).
Tensor f64_contiguous(const Tensor& t) { return t.to(DType::f64).contiguous(); }

// Gradient accumulator laid out like a contiguous operand: broadcast (zero-stride)
// reads of the expanded problem land on the same element, so they sum.
struct Grad {
  std::vector<double> g;
  explicit Grad(const Tensor& in) : g(static_cast<size_t>(in.numel()), 0.0) {}
  double* at(int64_t offset) { return g.empty() ? g.data() : g.data() + offset; }
  Tensor to_tensor(const Tensor& in) const {
    return Tensor::from_vector<double>(g, in.shape()).to(in.dtype()).contiguous();
  }
};

// Pointers to batch entry b of the (f64, contiguous-then-expanded) operands.
struct Rows {
  const double *q, *k, *v, *dout, *mask;
  int64_t q_row, k_row, v_row, mask_row;  // strides of dim -2
};

// Softmax of the scores s[0, n) into p (PyTorch's _safe_softmax: a row of -inf gives 0).
void softmax_row(std::vector<double>& s, std::vector<double>& p, int64_t n) {
  double row_max = kNegInf;
  for (int64_t j = 0; j < n; ++j) row_max = std::isnan(s[j]) || s[j] > row_max ? s[j] : row_max;
  std::fill(p.begin(), p.end(), 0.0);
  if (row_max == kNegInf) return;
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) sum += (p[j] = std::exp(s[j] - row_max));
  for (int64_t j = 0; j < n; ++j) p[j] /= sum;
}

}  // namespace

void check_saved_shape(const Problem& p, const Tensor& t, const Shape& expected, const char* name) {
  if (t.shape() == expected) return;
  fail<ShapeError>(p.op, ": ", name, " must have shape ", shape_str(expected), " (q ", shape_str(p.q_in.shape()),
                   ", k ", shape_str(p.k_in.shape()), ", v ", shape_str(p.v_in.shape()), "), got ",
                   shape_str(t.shape()));
}

AttentionGradients reference_attention_backward(const Problem& p_in, const Tensor& grad_out,
                                                const AttentionOptions& options) {
  if (!p_in.device.is_cpu()) fail_no_kernel(p_in.op, p_in.device);  // reads host memory
  const bool bool_mask = p_in.mask_in && p_in.mask_in->dtype() == DType::b8;
  const Problem p = with_operands(p_in, f64_contiguous(p_in.q_in), f64_contiguous(p_in.k_in), f64_contiguous(p_in.v_in),
                                  p_in.mask_in ? std::optional<Tensor>(f64_contiguous(*p_in.mask_in)) : std::nullopt);
  const Tensor dout = f64_contiguous(grad_out);  // [batch..., Lq, Dv]
  Grad dq(p.q_in), dk(p.k_in), dv(p.v_in);
  const double keep_scale = options.dropout_p < 1.0 ? 1.0 / (1.0 - options.dropout_p) : 0.0;
  std::vector<double> s(static_cast<size_t>(p.lk)), w(s.size()), dp(s.size()), cap(s.size(), 1.0);
  const ReferenceMods mods(options.mods, p.lq, p.lk, p.heads_q);  // qkv/attention_mods.h
  const auto* qd = p.q.data<double>();
  const auto* kd = p.k.data<double>();
  const auto* vd = p.v.data<double>();
  const auto* od = dout.data<double>();
  for (int64_t b = 0; b < p.batch_size; ++b) {
    const int64_t qo = batch_offset(p.q, p.batch, b, 1), ko = batch_offset(p.k, p.batch, b, p.gqa_group);
    const int64_t vo = batch_offset(p.v, p.batch, b, p.gqa_group);
    const int64_t mo = p.mask ? batch_offset(*p.mask, p.batch, b, 1) : 0;
    for (int64_t i = 0; i < p.lq; ++i) {
      check_interrupt(p.op);
      const int64_t keys = options.is_causal ? std::min(p.lk, i + 1) : p.lk;
      const double* qi = qd + qo + i * p.q.stride(-2);
      const double* doi = od + (b * p.lq + i) * p.dv;
      for (int64_t j = 0; j < keys; ++j) {  // s_ij = scale q_i . k_j + bias_ij (Dk == 0: 0)
        double dot = 0.0;
        for (int64_t d = 0; d < p.dk; ++d) dot += qi[d] * kd[ko + j * p.k.stride(-2) + d];
        s[j] = p.dk == 0 ? 0.0 : dot * p.scale;
        if (mods.active()) s[j] = mods.score(s[j], b, i, j, &cap[j]);  // cap: d score / d (scale q.k)
        if (p.mask) {
          const double m = p.mask->data<double>()[mo + i * p.mask->stride(-2) + j * p.mask->stride(-1)];
          s[j] += bool_mask ? (m != 0.0 ? 0.0 : kNegInf) : m;
        }
        if (mods.active() && !mods.allowed(b, i, j)) s[j] = mods.masked();
      }
      softmax_row(s, w, keys);  // w = p_i
      double row_d = 0.0;       // D_i = sum_j p_ij dP_ij
      for (int64_t j = 0; j < keys; ++j) {
        const auto index = static_cast<uint64_t>((b * p.lq + i) * p.lk + j);
        const double m = options.dropout_p > 0.0
                             ? (random::dropout_keep(options.seed, index, options.dropout_p) ? keep_scale : 0.0)
                             : 1.0;
        const double* vj = vd + vo + j * p.v.stride(-2);
        double* dvj = dv.at(vo + j * p.v.stride(-2));
        double dw = 0.0;  // dO_i . v_j
        for (int64_t d = 0; d < p.dv; ++d) {
          dw += doi[d] * vj[d];
          dvj[d] += w[j] * m * doi[d];
        }
        dp[j] = m * dw;
        row_d += w[j] * dp[j];
      }
      double* dqi = dq.at(qo + i * p.q.stride(-2));
      for (int64_t j = 0; j < keys && p.dk > 0; ++j) {
        const double ds = w[j] * (dp[j] - row_d) * cap[j] * p.scale;  // scale dS_ij (through softcap)
        const double* kj = kd + ko + j * p.k.stride(-2);
        double* dkj = dk.at(ko + j * p.k.stride(-2));
        for (int64_t d = 0; d < p.dk; ++d) {
          dqi[d] += ds * kj[d];
          dkj[d] += ds * qi[d];
        }
      }
    }
  }
  return {dq.to_tensor(p_in.q_in), dk.to_tensor(p_in.k_in), dv.to_tensor(p_in.v_in)};
}

}  // namespace qkv::attention

namespace qkv {

AttentionGradients attention_backward_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                                const Tensor& grad_out, const AttentionOptions& options) {
  constexpr const char* kOp = "attention_backward_reference";
  const attention::CallScope scope(kOp, q, k, v, options);  // names it in out-of-memory errors
  const attention::Problem p = attention::make_problem(q, k, v, options, kOp);
  Shape out_shape = p.batch;
  out_shape.insert(out_shape.end(), {p.lq, p.dv});
  attention::check_saved_shape(p, grad_out, out_shape, "grad_out");
  return attention::reference_attention_backward(p, grad_out, options);
}

}  // namespace qkv
