#include "attention/problem.h"

#include "attention/mods.h"

#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cpu/strided_walk.h"

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

// Batch dims of k/v as q sees them: under GQA their head dim counts as q's (group 0: no q
// heads, so none of theirs either).
Shape kv_batch_as_q(const Tensor& kv, int64_t group) {
  Shape b = leading(kv);
  if (group != 1) b.back() *= group;
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

// q heads per k/v head; 0 when q has no heads (torch repeats each k/v head 0 / Hk = 0 times:
// the output is [..., 0, Lq, Dv] for any Hk > 0).
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
  return hq / hk;
}

void check_options(const AttentionOptions& o, const char* op) {
  if (!(o.dropout_p >= 0.0 && o.dropout_p <= 1.0)) {
    fail<ValueError>(op, ": dropout_p must be in [0, 1], got ", o.dropout_p);
  }
  if (o.is_causal && o.attn_mask) {
    fail<ValueError>(op,
                     ": attn_mask and is_causal cannot both be set (as in PyTorch); "
                     "fold the causal mask into attn_mask instead");
  }
  if (o.scale && !std::isfinite(*o.scale)) fail<ValueError>(op, ": scale must be finite, got ", *o.scale);
  const FlashTiles& t = o.tuning.flash_tiles;
  if (!t.is_auto() && (t.br <= 0 || t.bc <= 0)) {
    fail<ValueError>(op, ": tuning.flash_tiles must be both positive or both 0 (automatic), got ", t.br, "x", t.bc);
  }
  if (o.tuning.widen_head_bytes < -1) {
    fail<ValueError>(op, ": tuning.widen_head_bytes must be -1 (automatic) or >= 0, got ", o.tuning.widen_head_bytes);
  }
}

// The batch dims of q, k and v broadcast together; the error names the call.
Shape broadcast_batch(const Tensor& q, const Tensor& k, const Tensor& v, int64_t group, const char* op) {
  try {
    return broadcast_shapes(broadcast_shapes(leading(q), kv_batch_as_q(k, group), ""), kv_batch_as_q(v, group), "");
  } catch (const ShapeError& e) {  // e: ": shapes [2] and [3] cannot be broadcast together (...)"
    fail<ShapeError>(op, " (", shapes_str(q, k, v), ")", e.what());
  }
}

void check_mask(const Tensor& m, const Shape& full, const Problem& p) {
  if (m.dtype() != DType::b8 && !is_floating(m.dtype())) {
    fail<DTypeError>(p.op, ": attn_mask must be bool or floating point, got ", dtype_name(m.dtype()));
  }
  if (!broadcasts_to(m.shape(), full)) {
    fail<ShapeError>(p.op, ": attn_mask of shape ", shape_str(m.shape()), " does not broadcast to the scores ",
                     shape_str(full), " (", shapes_str(p.q_in, p.k_in, p.v_in), ")");
  }
}

// k or v as heads of `kv_batch`: all of them, except under GQA with no q heads, where no
// k/v head is read and none is kept (their Hk heads cannot expand to 0).
Tensor kv_heads_for(const Tensor& kv, const Shape& kv_batch) {
  const bool no_heads = kv.dim() >= 3 && !kv_batch.empty() && kv_batch.back() == 0 && kv.size(-3) != 0;
  return no_heads ? kv.slice(kv.dim() - 3, 0, 0) : kv;
}

// p.q, p.k, p.v and p.mask: the operands expanded to the batch (zero strides).
void expand_operands(Problem& p) {
  p.q = p.q_in.expand(with_tail(p.batch, {p.lq, p.dk}));
  Shape kv_batch = p.batch;  // k/v keep their own head dim under GQA
  if (p.gqa_group > 1) kv_batch.back() /= p.gqa_group;
  p.k = kv_heads_for(p.k_in, kv_batch).expand(with_tail(kv_batch, {p.lk, p.dk}));
  p.v = kv_heads_for(p.v_in, kv_batch).expand(with_tail(kv_batch, {p.lk, p.dv}));
  p.mask.reset();
  if (p.mask_in) p.mask = p.mask_in->expand(with_tail(p.batch, {p.lq, p.lk}));
}

}  // namespace

Problem make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                     const char* op) {
  check_inputs(q, k, v, op);
  check_options(options, op);
  Problem p;
  p.op = op;
  p.device = common_device(op, {&q, &k, &v, options.attn_mask ? &*options.attn_mask : nullptr});
  const int64_t group = gqa_group_of(q, k, v, options, op);
  p.gqa_group = group == 0 ? 1 : group;  // no q heads: no group to walk
  p.lq = q.size(-2);
  p.lk = k.size(-2);
  p.dk = q.size(-1);
  p.dv = v.size(-1);
  p.out_dtype = q.dtype();
  if (options.qk_quantization != QKQuantization::none && q.dtype() != DType::f32) {
    fail<ValueError>(op, ": qk_quantization='", qk_quantization_name(options.qk_quantization),
                     "' needs float32 q, k and v, got ", dtype_name(q.dtype()));
  }
  p.scale = options.scale ? *options.scale : 1.0 / std::sqrt(static_cast<double>(p.dk));
  p.batch = broadcast_batch(q, k, v, group, op);
  p.batch_size = shape_numel(p.batch);
  p.heads_q = p.batch.empty() ? 1 : p.batch.back();
  p.q_in = q;
  p.k_in = k;
  p.v_in = v;
  p.mask_in = options.attn_mask;
  if (p.mask_in) check_mask(*p.mask_in, with_tail(p.batch, {p.lq, p.lk}), p);
  check_mods(options.mods, options, p.lq, p.lk, p.heads_q, op);
  expand_operands(p);
  return p;
}

Problem with_operands(const Problem& p, Tensor q, Tensor k, Tensor v, std::optional<Tensor> mask) {
  const bool same = q.shape() == p.q_in.shape() && k.shape() == p.k_in.shape() && v.shape() == p.v_in.shape() &&
                    mask.has_value() == p.mask_in.has_value() && (!mask || mask->shape() == p.mask_in->shape());
  if (!same) throw std::logic_error(std::string(p.op) + ": with_operands: operands of other shapes");
  Problem out = p;
  out.q_in = std::move(q);
  out.k_in = std::move(k);
  out.v_in = std::move(v);
  out.mask_in = std::move(mask);
  expand_operands(out);
  return out;
}

Problem zero_dk_problem(const Tensor& q, const Tensor& k, const Tensor& v, AttentionOptions& options, const char* op) {
  auto zero_column = [](const Tensor& t) {  // [..., L, 0] -> [..., L, 1] of zeros
    Shape s = t.shape();
    s.back() = 1;
    return Tensor::zeros(s, t.dtype());
  };
  options.scale = 1.0;
  options.qk_quantization = QKQuantization::none;  // the scores are exact zeros already
  return make_problem(zero_column(q), zero_column(k), v, options, op);
}

Shape with_tail(Shape leading, std::initializer_list<int64_t> tail) {
  leading.insert(leading.end(), tail);
  return leading;
}

int64_t batch_offset(const Tensor& t, const Shape& batch, int64_t b, int64_t gqa_group) {
  kernels::WalkDims<1> dims;
  for (size_t d = 0; d < batch.size(); ++d) dims.push_back({batch[d], {t.strides()[d]}});
  if (gqa_group > 1) {  // q heads [Hk * group] as [Hk, group]: the group's q heads share a k/v head
    dims.back().size /= gqa_group;
    dims.push_back({gqa_group, {0}});
  }
  return kernels::walk_offsets_at<1>(dims, b)[0];
}

}  // namespace qkv::attention
