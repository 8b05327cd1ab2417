// Devices: names, and the device of an operation's inputs.
#include "qkv/device.h"

#include <algorithm>
#include <charconv>

#include "qkv/tensor.h"

namespace qkv {

// ---- names ------------------------------------------------------------------------------

Device Device::cuda(int index) {
  if (index < 0) fail<ValueError>("Device::cuda: index must be >= 0, got ", index);
  return {DeviceKind::cuda, index};
}

Device Device::parse(std::string_view text) {
  if (text == "cpu") return cpu();
  constexpr std::string_view kCuda = "cuda:";
  if (text.size() > kCuda.size() && text.substr(0, kCuda.size()) == kCuda) {
    const std::string_view digits = text.substr(kCuda.size());
    int index = 0;
    const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
    const bool all_digits = std::all_of(digits.begin(), digits.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (ec == std::errc() && end == digits.data() + digits.size() && all_digits) return cuda(index);
  }
  fail<ValueError>("Device::parse: '", text, "' is not a device (expected 'cpu' or 'cuda:N')");
}

std::string Device::to_string() const {
  switch (kind) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::cuda: return "cuda:" + std::to_string(index);
  }
  return "unknown";
}

// ---- the device of an operation ------------------------------------------------------------

namespace {

template <class Range, class Get>
Device common_device_of(std::string_view op, const Range& tensors, Get get) {
  const Tensor* first = nullptr;
  for (const auto& item : tensors) {
    const Tensor* t = get(item);
    if (t == nullptr) continue;
    if (first == nullptr) {
      first = t;
    } else if (t->device() != first->device()) {
      fail<DeviceError>(op, ": tensors on ", first->device().to_string(), " and ", t->device().to_string(), " (shapes ",
                        shape_str(first->shape()), " and ", shape_str(t->shape()),
                        "); every input must be on one device");
    }
  }
  return first ? first->device() : Device::cpu();
}

}  // namespace

Device common_device(std::string_view op, std::initializer_list<const Tensor*> tensors) {
  return common_device_of(op, tensors, [](const Tensor* t) { return t; });
}

Device common_device(std::string_view op, std::span<const Tensor> tensors) {
  return common_device_of(op, tensors, [](const Tensor& t) { return &t; });
}

void fail_no_kernel(std::string_view op, Device device) {
  fail<DeviceError>(op, ": no kernel for tensors on ", device.to_string(),
                    " (qkv has no kernel for this operation there; move the tensors to the CPU)");
}

void require_cpu(std::string_view op, std::initializer_list<const Tensor*> tensors) {
  if (const Device d = common_device(op, tensors); !d.is_cpu()) fail_no_kernel(op, d);
}

void require_cpu(std::string_view op, std::span<const Tensor> tensors) {
  if (const Device d = common_device(op, tensors); !d.is_cpu()) fail_no_kernel(op, d);
}

}  // namespace qkv
