// apply_rotary (qkv/rotary.h): checks, the position of every row, and the rotation, rows on
// parallel_for; apply_rotary_reference beside it in float64.
#include "qkv/rotary.h"

#include <cmath>
#include <vector>

#include "qkv/error.h"
#include "qkv/parallel.h"

namespace qkv {

namespace {

constexpr const char* kOp = "apply_rotary";

struct Plan {
  int64_t rows = 0, t = 0, d = 0, half = 0, heads = 1;  // heads: rows per [B] entry / T (positions [B, T])
  std::vector<int64_t> positions;                       // [T] or [B, T]
  bool per_batch = false;
};

Plan plan(const Tensor& x, const RotaryOptions& o, const char* op) {
  if (!is_floating(x.dtype())) {  // a DTypeError (Python TypeError), not the shape's ShapeError
    fail<DTypeError>(op, ": x must be floating [..., T, D], got ", dtype_name(x.dtype()), " ", shape_str(x.shape()));
  }
  if (x.dim() < 2) {
    fail<ShapeError>(op, ": x must be floating [..., T, D], got ", dtype_name(x.dtype()), " ", shape_str(x.shape()));
  }
  Plan p;
  p.t = x.size(-2), p.d = x.size(-1), p.rows = p.t == 0 || p.d == 0 ? 0 : x.numel() / p.d;  // D = 0: no rows to turn
  const int64_t rd = o.rotary_dim == 0 ? p.d : o.rotary_dim;
  if (rd < 0 || rd > p.d || rd % 2 != 0 || !(o.base > 0.0) || !std::isfinite(o.base)) {
    fail<ValueError>(op, ": rotary_dim must be even and <= D = ", p.d, " (got ", o.rotary_dim,
                     "), base positive and finite (got ", o.base, ")");
  }
  p.half = rd / 2;
  if (!o.positions) {  // offset .. offset + T - 1 within +-2^53, checked before the sum (offset near INT64_MAX)
    if (p.t > 0 && (o.offset < -kMaxRotaryPosition || o.offset > kMaxRotaryPosition - (p.t - 1))) {
      fail<ValueError>(op, ": positions offset + t must lie within +-2^53 = ", kMaxRotaryPosition,
                       " (float64 holds every integer only up to 2^53), got offset ", o.offset, " and T = ", p.t);
    }
    for (int64_t t = 0; t < p.t; ++t) p.positions.push_back(o.offset + t);
    return p;
  }
  const Tensor& pos = *o.positions;
  const bool integer = pos.dtype() == DType::i32 || pos.dtype() == DType::i64;
  p.per_batch = pos.dim() == 2;
  const bool fits = (pos.dim() == 1 && pos.size(0) == p.t) ||
                    (p.per_batch && x.dim() == 4 && pos.size(0) == x.size(0) && pos.size(1) == p.t);
  if (!integer) {
    fail<DTypeError>(op, ": positions must be integer (int32 or int64) [T] or [B, T], got ", dtype_name(pos.dtype()),
                     " ", shape_str(pos.shape()));
  }
  if (!fits) {
    fail<ShapeError>(op, ": positions must be integer [T] or [B, T] (x [B, H, T, D]) for x ", shape_str(x.shape()),
                     ", got ", dtype_name(pos.dtype()), " ", shape_str(pos.shape()));
  }
  p.positions = pos.contiguous().to_vector<int64_t>();
  for (size_t i = 0; i < p.positions.size(); ++i) {
    if (p.positions[i] < -kMaxRotaryPosition || p.positions[i] > kMaxRotaryPosition) {
      fail<ValueError>(op, ": positions must lie within +-2^53 = ", kMaxRotaryPosition,
                       " (float64 holds every integer only up to 2^53), got ", p.positions[i], " at flat index ", i);
    }
  }
  if (p.per_batch) p.heads = x.size(1);
  return p;
}

int64_t position_of(const Plan& p, int64_t row) {  // row of the flattened [..., T]
  const int64_t t = row % p.t;
  return p.per_batch ? p.positions[static_cast<size_t>((row / p.t / p.heads) * p.t + t)]
                     : p.positions[static_cast<size_t>(t)];
}

// The feature index pairs (a, b) of pair i.
inline void pair(RotaryLayout layout, int64_t half, int64_t i, int64_t& a, int64_t& b) {
  a = layout == RotaryLayout::neox ? i : 2 * i;
  b = layout == RotaryLayout::neox ? i + half : 2 * i + 1;
}

template <class T>
void rotate_rows(const Plan& p, const RotaryOptions& o, T* data, int64_t r0, int64_t r1) {
  std::vector<T> c(static_cast<size_t>(p.half)), s(c.size());
  for (int64_t r = r0; r < r1; ++r) {
    const auto pos = static_cast<double>(position_of(p, r));
    for (int64_t i = 0; i < p.half; ++i) {
      const double angle = pos * std::pow(o.base, -2.0 * static_cast<double>(i) / static_cast<double>(2 * p.half));
      c[i] = static_cast<T>(std::cos(angle)), s[i] = static_cast<T>(std::sin(angle));
    }
    T* x = data + r * p.d;  // [D]
    for (int64_t i = 0; i < p.half; ++i) {
      int64_t a = 0, b = 0;
      pair(o.layout, p.half, i, a, b);
      const T xa = x[a], xb = x[b];
      x[a] = xa * c[i] - xb * s[i];
      x[b] = xb * c[i] + xa * s[i];
    }
  }
}

}  // namespace

Tensor apply_rotary(const Tensor& x, const RotaryOptions& o) {
  require_cpu(kOp, {&x});  // rotated on the host below (clone alone would work on a GPU)
  const Plan p = plan(x, o, kOp);
  const DType compute = x.dtype() == DType::f64 ? DType::f64 : DType::f32;
  Tensor out = x.to(compute).contiguous().clone();  // [..., T, D], rotated in place below
  parallel_for(0, p.rows, 64, [&](int64_t r0, int64_t r1) {
    if (compute == DType::f64) {
      rotate_rows(p, o, out.data<double>(), r0, r1);
    } else {
      rotate_rows(p, o, out.data<float>(), r0, r1);
    }
  });
  return out.to(x.dtype());
}

Tensor apply_rotary_reference(const Tensor& x, const RotaryOptions& o) {
  require_cpu("apply_rotary_reference", {&x});
  const Plan p = plan(x, o, "apply_rotary_reference");
  std::vector<double> v = x.contiguous().to_vector<double>();
  const int64_t rd = 2 * p.half;
  for (int64_t r = 0; r < p.rows; ++r) {  // written from the definition: theta_i = p base^(-2i/rd)
    const double pos = static_cast<double>(position_of(p, r));
    double* row = v.data() + r * p.d;
    for (int64_t i = 0; i < p.half; ++i) {
      const double theta = pos / std::pow(o.base, static_cast<double>(2 * i) / static_cast<double>(rd));
      const int64_t a = o.layout == RotaryLayout::neox ? i : 2 * i;
      const int64_t b = o.layout == RotaryLayout::neox ? i + p.half : 2 * i + 1;
      const double xa = row[a], xb = row[b];
      row[a] = xa * std::cos(theta) - xb * std::sin(theta);
      row[b] = xb * std::cos(theta) + xa * std::sin(theta);
    }
  }
  return Tensor::from_vector(v, x.shape()).to(x.dtype());
}

}  // namespace qkv
