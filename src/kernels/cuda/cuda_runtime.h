// Internal helpers of the CUDA backend (qkv/cuda.h is the public side): the CUDA
// error check, the guard that makes a device current, and the byte copies between
// host and device memory that Tensor::to(Device) and the kernels use. Declared
// without CUDA headers so that C++ code of every layer can call them; defined in
// runtime.cc (a CUDA build) or runtime_none.cc (none: they throw DeviceError).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "qkv/cuda.h"
#include "qkv/dtype.h"

namespace qkv::kernels::cuda {

// Throws DeviceError "<op>: CUDA error <name> (<text>) <what>" unless `status` is 0
// (cudaSuccess). `status` is a cudaError_t.
void check(int status, const char* op, const char* what);

// Makes cuda:`index` current on this thread while alive (cudaSetDevice), then restores
// the previous device.
class DeviceGuard {
 public:
  // `op` names the operation in the DeviceError of a failed switch.
  explicit DeviceGuard(int index, const char* op = "cuda");
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Device memory of cuda:`index` (cudaMalloc, 256-byte aligned); nullptr when the
// device is out of memory. free_device takes it back.
void* malloc_device(size_t nbytes, int index);
void free_device(void* p, int index) noexcept;

// Byte copies on the current stream. Host to device and device to host return once
// the bytes are there (the host buffer is pageable memory the caller may free at once);
// device to device is queued.
void copy_to_device(void* dst, const void* src, size_t nbytes, int device, const char* op);
void copy_to_host(void* dst, const void* src, size_t nbytes, int device, const char* op);
void copy_device_to_device(void* dst, const void* src, size_t nbytes, int device, const char* op);

// The integer in environment variable `name`, or `fallback` when it is unset or not a
// number: the kernels' tuning knobs (QKV_CUDA_FLASH_BC, QKV_CUDA_BWD_BC,
// QKV_CUDA_FLASH_GROUP, QKV_CUDA_BWD_GROUP) that measuring runs set; callers check the
// range (the tile sizes are read once, the group sizes at each launch: order_group).
// Defined in a CUDA build only.
int64_t env_int(const char* name, int64_t fallback);

// The copy engine on the GPU: dst[i...] = src[i...] for every multi-index of `shape`
// (at most kMaxCopyDims dims, same dtype on both sides, element strides of any sign,
// zero strides broadcast the source), on cuda:`device`, queued on the current stream.
constexpr int kMaxCopyDims = 8;
void strided_copy(std::span<const int64_t> shape, const void* src, std::span<const int64_t> src_strides, void* dst,
                  std::span<const int64_t> dst_strides, size_t itemsize, int device, const char* op);

}  // namespace qkv::kernels::cuda
