// Element-wise copies between tensors of any layout and dtype, all through the one
// copy engine (kernels/cpu/copy.h): contiguous, clone, reshape (when it copies),
// to(dtype), fill and copy_from.
#include "kernels/cpu/copy.h"
#include "qkv/tensor.h"

namespace qkv {

void Tensor::copy_from(const Tensor& src) const {
  require_cpu("copy_from", {this, &src});
  check_writable("copy_from");
  const Tensor source = src.expand(shape_);  // numpy broadcasting of src onto this shape
  kernels::strided_copy(shape_, {source.raw_data(), source.dtype(), source.strides()}, {raw_data(), dtype_, strides_});
}

void Tensor::fill(double value) const {
  require_cpu("fill", {this});
  check_writable("fill");
  Tensor scalar = Tensor::empty({}, dtype_);
  scalar.set_item(std::span<const int64_t>(), value);
  copy_from(scalar);
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  require_cpu("clone", {this});
  Tensor out = empty(shape_, dtype_);
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  require_cpu("to", {this});
  Tensor out = empty(shape_, dtype);
  out.copy_from(*this);
  return out;
}

}  // namespace qkv
