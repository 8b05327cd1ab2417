#include "attention/problem.h"

#include <cmath>

namespace qkv::attention {

namespace {

Shape leading(const Tensor& t) { return Shape(t.shape().begin(), t.shape().end() - 2); }

std::string shapes_str(const Tensor& q, const Tensor& k, const Tensor& v) {
  return detail::concat("q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()));
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const char* op) {
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->dim() < 2) fail<ShapeError>(op, ": q, k and v need at least 2 dims, got ", shapes_str(q, k, v));
    if (!is_floating(t->dtype())) {
      fail<DTypeError>(op, ": q, k and v must be floating point, got ", dtype_name(t->dtype()), " (",
                       shapes_str(q, k, v), ")");
    }
  }
  if (q.dtype() != k.dtype() || q.dtype() != v.dtype()) {
    fail<DTypeError>(op, ": q, k and v must have the same dtype, got ", dtype_name(q.dtype()), ", ",
                     dtype_name(k.dtype()), ", ", dtype_name(v.dtype()));
  }
  if (q.size(-1) != k.size(-1)) {
    fail<ShapeError>(op, ": q and k must have the same last dim (Dk), got ", shapes_str(q, k, v));
  }
  if (k.size(-2) != v.size(-2)) {
    fail<ShapeError>(op, ": k and v must have the same length (dim -2), got ", shapes_str(q, k, v));
  }
}

// Batch dims of k/v as q sees them: under GQA their head dim counts as q's.
Shape kv_batch_as_q(const Tensor& kv, int64_t group) {
  Shape b = leading(kv);
  if (group > 1) b.back() *= group;
  return b;
}

bool broadcasts_to(const Shape& s, const Shape& full) {
  if (s.size() > full.size()) return false;
  const size_t lead = full.size() - s.size();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != full[lead + i] && s[i] != 1) return false;
  }
  return true;
}

int64_t gqa_group_of(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o, const char* op) {
  if (!o.enable_gqa || q.dim() < 3 || k.dim() < 3 || v.dim() < 3) return 1;
  const int64_t hq = q.size(-3), hk = k.size(-3);
  if (k.size(-3) != v.size(-3)) {
    fail<ShapeError>(op, ": with enable_gqa, k and v must have the same number of heads (dim -3), got ",
                     shapes_str(q, k, v));
  }
  if (hk == 0 || hq % hk != 0) {
    fail<ShapeError>(op, ": with enable_gqa, q heads (", hq, ") must be a multiple of k/v heads (", hk, "), got ",
                     shapes_str(q, k, v));
  }
  // No q heads: nothing to group (hq / hk = 0 would divide the k/v batch by zero);
  // k/v then broadcast to q's empty head dim, or the shapes are refused.
  return hq == 0 ? 1 : hq / hk;
}

void check_options(const AttentionOptions& o, const char* op) {
  if (!(o.dropout_p >= 0.0 && o.dropout_p <= 1.0)) {
    fail<ValueError>(op, ": dropout_p must be in [0, 1], got ", o.dropout_p);
  }
  if (o.is_causal && o.attn_mask) {
    fail<ValueError>(op, ": attn_mask and is_causal cannot both be set (as in PyTorch); "
                         "fold the causal mask into attn_mask instead");
  }
  if (o.scale && !std::isfinite(*o.scale)) fail<ValueError>(op, ": scale must be finite, got ", *o.scale);
}

}  // namespace

Problem make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                     const char* op) {
  check_inputs(q, k, v, op);
  check_options(options, op);
  Problem p;
  p.gqa_group = gqa_group_of(q, k, v, options, op);
  p.lq = q.size(-2);
  p.lk = k.size(-2);
  p.dk = q.size(-1);
  p.dv = v.size(-1);
  p.out_dtype = q.dtype();
  p.scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(p.dk));
  const std::string what = detail::concat(op, " (", shapes_str(q, k, v), ")");
  p.batch = broadcast_shapes(broadcast_shapes(leading(q), kv_batch_as_q(k, p.gqa_group), what.c_str()),
                             kv_batch_as_q(v, p.gqa_group), what.c_str());
  p.batch_size = shape_numel(p.batch);
  p.heads_q = p.batch.empty() ? 1 : p.batch.back();

  auto with = [&](int64_t rows, int64_t cols) {
    Shape s = p.batch;
    s.push_back(rows);
    s.push_back(cols);
    return s;
  };
  p.q = q.expand(with(p.lq, p.dk));
  if (p.gqa_group == 1) {
    p.k = k.expand(with(p.lk, p.dk));
    p.v = v.expand(with(p.lk, p.dv));
  } else {
    Shape kv_batch = p.batch;
    kv_batch.back() /= p.gqa_group;
    auto kv_with = [&](int64_t cols) {
      Shape s = kv_batch;
      s.push_back(p.lk);
      s.push_back(cols);
      return s;
    };
    p.k = k.expand(kv_with(p.dk));
    p.v = v.expand(kv_with(p.dv));
  }
  if (options.attn_mask) {
    const Tensor& m = *options.attn_mask;
    if (m.dtype() != DType::b8 && !is_floating(m.dtype())) {
      fail<DTypeError>(op, ": attn_mask must be bool or floating point, got ", dtype_name(m.dtype()));
    }
    const Shape full = with(p.lq, p.lk);
    if (!broadcasts_to(m.shape(), full)) {
      fail<ShapeError>(op, ": attn_mask of shape ", shape_str(m.shape()), " does not broadcast to the scores ",
                       shape_str(full), " (", shapes_str(q, k, v), ")");
    }
    p.mask = m.expand(full);
  }
  return p;
}

int64_t batch_offset(const Tensor& t, const Shape& batch, int64_t b, int64_t gqa_group) {
  int64_t off = 0;
  for (size_t d = batch.size(); d-- > 0;) {
    int64_t i = b % batch[d];
    b /= batch[d];
    if (gqa_group > 1 && d + 1 == batch.size()) i /= gqa_group;
    off += i * t.strides()[d];
  }
  return off;
}

}  // namespace qkv::attention
