// Memory of one device, behind the one interface Storage allocates through.
//
// Storage::allocate (qkv/tensor.h) checks the size first (overflow and
// QKV_MAX_ALLOC_BYTES, qkv/size.h: the same limit for every device), then asks
// the allocator of the requested device. The CPU allocator is built in; a
// backend (a CUDA build, a test's fake device) registers one per device it
// serves. Allocators are not owned by the registry and must outlive every
// storage they allocated (a static object does).
#pragma once

#include <cstddef>
#include <string_view>

#include "qkv/device.h"

namespace qkv {

class Allocator {
 public:
  virtual ~Allocator() = default;
  // `nbytes` (possibly 0) bytes on the allocator's device, aligned to at least
  // Storage::kAlignment (64); nullptr when the device refuses (Storage then
  // throws OutOfMemoryError naming the operation and the bytes). Thread-safe.
  virtual void* allocate(size_t nbytes) = 0;
  // Gives back `p`, `nbytes` as allocated. Thread-safe, never throws.
  virtual void deallocate(void* p, size_t nbytes) noexcept = 0;
};

// The built-in allocator of host memory: std::aligned_alloc, 64-byte aligned,
// sizes rounded up to a multiple of 64 (at least 64).
Allocator& cpu_allocator();

// The allocator of `device`: cpu_allocator() for the CPU, else the one
// registered for it; DeviceError naming `op` and the device when there is none.
Allocator& allocator_for(Device device, std::string_view op = "Storage::allocate");

// True when `device`'s memory comes from qkv's own backend for it (cuda:N in a CUDA
// build with that GPU present, no allocator registered over it): only then do the
// backend's copies and kernels run on its tensors. False for the CPU and for devices
// served by a registered allocator (a test's fake device), whose tensors every
// operation refuses with DeviceError.
bool served_by_backend(Device device);

// Serves `device` with `allocator` from now on (nullptr: no longer served).
// ValueError for the CPU, whose allocator is fixed.
void register_allocator(Device device, Allocator* allocator);

}  // namespace qkv
