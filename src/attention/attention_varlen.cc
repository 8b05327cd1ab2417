// scaled_dot_product_attention_varlen: checks a packed variable-length call once,
// then runs it on the inputs' device: on the CPU one scaled_dot_product_attention
// per sequence over views (no copies of the inputs), on a GPU one kernel launch.
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention/attention_cuda.h"
#include "qkv/attention.h"

namespace qkv {

namespace {

constexpr const char* kOp = "scaled_dot_product_attention_varlen";

// The row starts as host integers, checked: [N + 1], 0 first, non-decreasing, `total` last.
std::vector<int32_t> row_starts(const Tensor& cu, const char* name, int64_t total, const Shape& packed) {
  if (cu.dim() != 1 || cu.size(0) < 1) {
    fail<ShapeError>(kOp, ": ", name, " must be 1-D [N + 1], got shape ", shape_str(cu.shape()));
  }
  if (cu.dtype() != DType::i32 && cu.dtype() != DType::i64) {
    fail<DTypeError>(kOp, ": ", name, " must be int32 or int64, got ", dtype_name(cu.dtype()));
  }
  const Tensor host = cu.to(Device::cpu()).to(DType::i64).contiguous();
  const int64_t* c = host.data<int64_t>();
  std::vector<int32_t> out(static_cast<size_t>(cu.size(0)));
  for (int64_t s = 0; s < cu.size(0); ++s) {
    const bool ok = s == 0 ? c[0] == 0 : c[s] >= c[s - 1];
    if (ok && c[s] > total) {  // past the packed rows (e.g. 2^32 + 2 in int64): name the bound, not the order
      fail<ValueError>(kOp, ": ", name, " must not pass the packed length ", total, " of ", shape_str(packed), ", got ",
                       c[s], " at index ", s);
    }
    if (!ok) {
      fail<ValueError>(kOp, ": ", name, " must start at 0 and not decrease, got ", c[s], " at index ", s, " (previous ",
                       s > 0 ? c[s - 1] : 0, ")");
    }
    out[static_cast<size_t>(s)] = static_cast<int32_t>(c[s]);
  }
  if (c[cu.size(0) - 1] != total) {
    fail<ValueError>(kOp, ": ", name, " must end at the packed length ", total, " of ", shape_str(packed), ", got ",
                     c[cu.size(0) - 1]);
  }
  return out;
}

attention::VarlenProblem make_varlen(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& cu_q,
                                     const Tensor& cu_k, const AttentionOptions& o) {
  (void)common_device(kOp, {&q, &k, &v});
  if (q.dim() != 3 || k.dim() != 3 || v.dim() != 3) {
    fail<ShapeError>(kOp, ": q, k, v must be [T, H, D], got q ", shape_str(q.shape()), ", k ", shape_str(k.shape()),
                     ", v ", shape_str(v.shape()));
  }
  if (k.size(0) != v.size(0) || k.size(1) != v.size(1) || q.size(2) != k.size(2)) {
    fail<ShapeError>(kOp, ": k and v must share [Tk, Hk] and q, k Dk, got q ", shape_str(q.shape()), ", k ",
                     shape_str(k.shape()), ", v ", shape_str(v.shape()));
  }
  // checked here, not by each sequence's call: those errors named scaled_dot_product_attention, and
  // a batch of empty sequences took any dtypes
  if (!is_floating(q.dtype()) || q.dtype() != k.dtype() || q.dtype() != v.dtype()) {
    fail<DTypeError>(kOp, ": q, k and v must share one floating dtype, got ", dtype_name(q.dtype()), ", ",
                     dtype_name(k.dtype()), ", ", dtype_name(v.dtype()));
  }
  if (o.scale && !std::isfinite(*o.scale)) fail<ValueError>(kOp, ": scale must be finite, got ", *o.scale);
  const int64_t hq = q.size(1), hk = k.size(1);
  if (hk == 0 || hq % hk != 0 || (hq != hk && !o.enable_gqa)) {
    fail<ShapeError>(kOp, ": q heads (", hq, ") must equal k/v heads (", hk,
                     "), or be a multiple of them with enable_gqa, got q ", shape_str(q.shape()), ", k ",
                     shape_str(k.shape()));
  }
  if (o.attn_mask || o.dropout_p > 0 || o.return_weights || o.mods.any()) {
    fail<ValueError>(kOp,
                     ": attn_mask, dropout_p, return_weights and mods are not supported (is_causal, "
                     "scale, enable_gqa and return_logsumexp are)");
  }
  if (std::max(q.size(0), k.size(0)) > INT32_MAX) {
    fail<ValueError>(kOp, ": packed lengths past 2^31 - 1 rows, got q ", shape_str(q.shape()), ", k ",
                     shape_str(k.shape()));
  }
  attention::VarlenProblem p;
  p.op = kOp;
  p.q = q;
  p.k = k;
  p.v = v;
  p.cu_q = row_starts(cu_q, "cu_seqlens_q", q.size(0), q.shape());
  p.cu_k = row_starts(cu_k, "cu_seqlens_k", k.size(0), k.shape());
  if (p.cu_q.size() != p.cu_k.size()) {
    fail<ShapeError>(kOp, ": cu_seqlens_q and cu_seqlens_k must have one length, got ", shape_str(cu_q.shape()),
                     " and ", shape_str(cu_k.shape()));
  }
  p.hq = hq;
  p.hk = hk;
  p.dk = q.size(2);
  p.dv = v.size(2);
  for (size_t s = 0; s + 1 < p.cu_q.size(); ++s) p.max_lq = std::max<int64_t>(p.max_lq, p.cu_q[s + 1] - p.cu_q[s]);
  // Dk = 0: every score is the empty sum 0 whatever the scale (1/sqrt(0) = inf failed every sequence's call)
  p.scale = o.scale ? *o.scale : p.dk > 0 ? 1.0 / std::sqrt(static_cast<double>(p.dk)) : 1.0;
  return p;
}

// The CPU: each sequence as [H, L, D] views of the packed tensors.
AttentionResult varlen_cpu(const attention::VarlenProblem& p, const AttentionOptions& o) {
  const int64_t tq = p.q.size(0);
  AttentionResult r;
  r.output = Tensor::empty({tq, p.hq, p.dv}, p.q.dtype());  // [Tq, Hq, Dv]
  const DType lse_dtype = p.q.dtype() == DType::f64 ? DType::f64 : DType::f32;
  if (o.return_logsumexp) r.logsumexp = Tensor::empty({p.hq, tq}, lse_dtype);  // [Hq, Tq]
  AttentionOptions one;
  one.is_causal = o.is_causal;
  one.scale = p.scale;
  one.enable_gqa = o.enable_gqa;
  one.return_logsumexp = o.return_logsumexp;
  one.tuning = o.tuning;
  one.matmul_precision = o.matmul_precision;
  for (size_t s = 0; s + 1 < p.cu_q.size(); ++s) {
    const int64_t q0 = p.cu_q[s], q1 = p.cu_q[s + 1], k0 = p.cu_k[s], k1 = p.cu_k[s + 1];
    if (q1 == q0) continue;
    const auto heads_first = [](const Tensor& t, int64_t a, int64_t b) { return t.slice(0, a, b).permute({1, 0, 2}); };
    const AttentionResult one_result =
        scaled_dot_product_attention(heads_first(p.q, q0, q1), heads_first(p.k, k0, k1), heads_first(p.v, k0, k1), one);
    heads_first(r.output, q0, q1).copy_from(one_result.output);
    if (r.logsumexp) r.logsumexp->slice(1, q0, q1).copy_from(*one_result.logsumexp);
  }
  return r;
}

}  // namespace

AttentionResult scaled_dot_product_attention_varlen(const Tensor& q, const Tensor& k, const Tensor& v,
                                                    const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                                    const AttentionOptions& options) {
  const attention::VarlenProblem p = make_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, options);
  switch (q.device().kind) {
    case DeviceKind::cpu: return varlen_cpu(p, options);
    case DeviceKind::cuda: return attention::flash_attention_varlen_cuda(p, options);
  }
  fail_no_kernel(kOp, q.device());
}

}  // namespace qkv
