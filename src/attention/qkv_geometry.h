// The checked geometry of the attention variants that take q, k, v without broadcasting
// (linear_attention.cc, additive_attention.cc): one check, one set of error messages.
#pragma once

#include <cstdint>
#include <string>

#include "qkv/tensor.h"

namespace qkv::attention {

struct QkvGeometry {
  Shape lead;  // the leading dims, equal in q, k and v
  int64_t batch = 1, lq = 0, lk = 0, d = 0, dv = 0;
  Shape out_shape;  // [..., Lq, Dv]
};

// q [..., Lq, D], k [..., Lk, D], v [..., Lk, Dv]: on the CPU, floating, the same rank >= 2 and
// the same leading dims. DTypeError / ShapeError naming `op` and the shapes otherwise.
QkvGeometry check_qkv(const char* op, const Tensor& q, const Tensor& k, const Tensor& v);

// "(q [...], k [...], v [...])": the shapes for a caller's own error messages (built only then).
std::string qkv_shapes(const Tensor& q, const Tensor& k, const Tensor& v);

}  // namespace qkv::attention
