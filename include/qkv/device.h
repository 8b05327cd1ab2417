// Where a tensor's bytes live, and how an operation picks its kernel by it.
//
// Every Storage (qkv/tensor.h) carries a Device: the CPU today, "cuda:N" once a
// CUDA backend registers an allocator for it (qkv/allocator.h). An operation's
// dispatcher finds the device of its inputs with common_device, then picks the
// kernel for that device and dtype (a switch on Device::kind); an operation
// that has no kernel for the device throws DeviceError naming the operation and
// the device. Operations with CPU kernels only call require_cpu at their entry.
// docs/architecture.md ("Devices and backends") says how a backend plugs in.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

namespace qkv {

enum class DeviceKind : uint8_t { cpu, cuda };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;  // the N of cuda:N; 0 for the CPU

  static constexpr Device cpu() { return {}; }
  // cuda:`index`; ValueError for a negative index.
  static Device cuda(int index = 0);
  // "cpu" or "cuda:N" (N a decimal index); ValueError naming the text otherwise.
  static Device parse(std::string_view text);

  bool is_cpu() const { return kind == DeviceKind::cpu; }
  // "cpu", "cuda:0".
  std::string to_string() const;
  friend bool operator==(const Device&, const Device&) = default;
};

class Tensor;

// The one device of `tensors` (null pointers skipped; the CPU when none): a
// DeviceError "<op>: tensors on cpu and cuda:0 ..." when they differ.
Device common_device(std::string_view op, std::initializer_list<const Tensor*> tensors);
Device common_device(std::string_view op, std::span<const Tensor> tensors);

// DeviceError "<op>: no kernel for tensors on cuda:0 (...)": what a dispatcher
// throws for a device it has no kernel for.
[[noreturn]] void fail_no_kernel(std::string_view op, Device device);

// For operations with CPU kernels only: fail_no_kernel unless every tensor is
// on the CPU (and common_device's error when they are on different devices).
void require_cpu(std::string_view op, std::initializer_list<const Tensor*> tensors);
void require_cpu(std::string_view op, std::span<const Tensor> tensors);

}  // namespace qkv
