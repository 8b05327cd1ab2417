// Element-wise copies between tensors of any layout and dtype, all through the one
// copy engine (kernels/cpu/copy.h, and its GPU side kernels/cuda/cuda_runtime.h):
// contiguous, clone, reshape (when it copies), to(dtype), to(device), fill and copy_from.
#include "kernels/cpu/copy.h"
#include "kernels/cuda/cuda_runtime.h"
#include "qkv/allocator.h"
#include "qkv/tensor.h"

namespace qkv {

void Tensor::copy_from(const Tensor& src) const {
  check_writable("copy_from");
  const Tensor source = src.expand(shape_);  // numpy broadcasting of src onto this shape
  if (served_by_backend(device())) {
    // On a GPU: same device and dtype only (no conversion kernels there yet).
    (void)common_device("copy_from", {this, &src});
    if (src.dtype() != dtype_) {
      fail<DeviceError>("copy_from: no dtype conversion on ", device().to_string(), " (", dtype_name(src.dtype()),
                        " to ", dtype_name(dtype_), "); convert on the CPU");
    }
    kernels::cuda::strided_copy(shape_, source.raw_data(), source.strides(), raw_data(), strides_, itemsize(),
                                device().index, "copy_from");
    return;
  }
  require_cpu("copy_from", {this, &src});
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
  const bool gpu = served_by_backend(device());
  if (!gpu) require_cpu("clone", {this});
  Tensor out = empty(shape_, dtype_, device());
  if (gpu && is_contiguous()) {
    kernels::cuda::copy_device_to_device(out.raw_data(), raw_data(), nbytes(), device().index, "clone");
    return out;
  }
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(Device device) const {
  const Device from = this->device();
  if (device == from) return *this;
  for (const Device d : {from, device}) {
    if (d.is_cpu() || served_by_backend(d)) continue;
    (void)allocator_for(d, "to");  // no backend or no such GPU: its DeviceError says which
    fail_no_kernel("to", d);       // served by a registered allocator only (a test's fake device)
  }
  const Tensor src = contiguous();  // on its own device
  Tensor out = empty(shape_, dtype_, device);
  if (nbytes() == 0) return out;
  if (from.is_cpu()) {
    kernels::cuda::copy_to_device(out.raw_data(), src.raw_data(), nbytes(), device.index, "to");
  } else if (device.is_cpu()) {
    kernels::cuda::copy_to_host(out.raw_data(), src.raw_data(), nbytes(), from.index, "to");
  } else {  // between GPUs: unified addressing lets the copy name both pointers
    kernels::cuda::copy_device_to_device(out.raw_data(), src.raw_data(), nbytes(), device.index, "to");
  }
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
