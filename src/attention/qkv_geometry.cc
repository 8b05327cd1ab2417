#include "attention/qkv_geometry.h"

#include "qkv/error.h"

namespace qkv::attention {

std::string qkv_shapes(const Tensor& q, const Tensor& k, const Tensor& v) {
  return "(q " + shape_str(q.shape()) + ", k " + shape_str(k.shape()) + ", v " + shape_str(v.shape()) + ")";
}

QkvGeometry check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v) {
  require_cpu(op, {&q, &k, &v});
  for (const Tensor* t : {&q, &k, &v}) {
    if (!is_floating(t->dtype())) fail<DTypeError>(op, ": q, k and v must be floating point ", qkv_shapes(q, k, v));
  }
  if (q.dim() < 2 || k.dim() != q.dim() || v.dim() != q.dim()) {
    fail<ShapeError>(op, ": q, k and v must have the same rank >= 2 ", qkv_shapes(q, k, v));
  }
  QkvGeometry g;
  g.lead.assign(q.shape().begin(), q.shape().end() - 2);
  if (Shape(k.shape().begin(), k.shape().end() - 2) != g.lead ||
      Shape(v.shape().begin(), v.shape().end() - 2) != g.lead) {
    fail<ShapeError>(op, ": q, k and v must have the same leading dims ", qkv_shapes(q, k, v));
  }
  if (k.size(-1) != q.size(-1) || v.size(-2) != k.size(-2)) {
    fail<ShapeError>(op, ": k must be [..., Lk, D] with q's D and v [..., Lk, Dv] ", qkv_shapes(q, k, v));
  }
  g.batch = shape_numel(g.lead);
  g.lq = q.size(-2), g.lk = k.size(-2), g.d = q.size(-1), g.dv = v.size(-1);
  g.out_shape = g.lead;
  g.out_shape.insert(g.out_shape.end(), {g.lq, g.dv});
  return g;
}

}  // namespace qkv::attention
