// The CUDA runtime of qkv (qkv/cuda.h, kernels/cuda/cuda_runtime.h) over the CUDA
// runtime API: device queries, the per-thread current stream, device memory and the
// byte copies between host and device.
#include <cuda_runtime_api.h>

#include "kernels/cuda/cuda_runtime.h"
#include "qkv/error.h"

namespace qkv {
namespace cuda {

namespace {
thread_local Stream t_stream = nullptr;  // the stream of StreamGuard, else the legacy default
}  // namespace

bool built() { return true; }

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();  // no driver or no GPU: not an error for the caller
    return 0;
  }
  return n;
}

DeviceProperties properties(int index) {
  if (index < 0 || index >= device_count()) {
    fail<DeviceError>("cuda::properties: no GPU cuda:", index, " (", device_count(), " visible)");
  }
  cudaDeviceProp p{};
  kernels::cuda::check(cudaGetDeviceProperties(&p, index), "cuda::properties", "cudaGetDeviceProperties");
  DeviceProperties out;
  out.name = p.name;
  out.major = p.major;
  out.minor = p.minor;
  out.multiprocessors = p.multiProcessorCount;
  out.total_memory = p.totalGlobalMem;
  out.l2_cache_bytes = static_cast<size_t>(p.l2CacheSize);
  out.shared_memory_per_block_optin = p.sharedMemPerBlockOptin;
  kernels::cuda::check(cudaDriverGetVersion(&out.driver_version), "cuda::properties", "cudaDriverGetVersion");
  kernels::cuda::check(cudaRuntimeGetVersion(&out.runtime_version), "cuda::properties", "cudaRuntimeGetVersion");
  return out;
}

Stream current_stream() { return t_stream; }

StreamGuard::StreamGuard(Stream stream) : previous_(t_stream) { t_stream = stream; }
StreamGuard::~StreamGuard() { t_stream = previous_; }

void synchronize(int index) {
  if (index < 0 || index >= device_count()) {
    fail<DeviceError>("cuda::synchronize: no GPU cuda:", index, " (", device_count(), " visible)");
  }
  const kernels::cuda::DeviceGuard guard(index, "cuda::synchronize");
  kernels::cuda::check(cudaStreamSynchronize(static_cast<cudaStream_t>(t_stream)), "cuda::synchronize",
                       "cudaStreamSynchronize");
}

}  // namespace cuda

namespace kernels::cuda {

namespace {
cudaStream_t stream() { return static_cast<cudaStream_t>(qkv::cuda::current_stream()); }
}  // namespace

void check(int status, const char* op, const char* what) {
  if (status == cudaSuccess) return;
  const auto e = static_cast<cudaError_t>(status);
  (void)cudaGetLastError();  // clear a non-sticky error so later calls start clean
  fail<DeviceError>(op, ": CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ") in ", what);
}

DeviceGuard::DeviceGuard(int index, const char* op) {
  check(cudaGetDevice(&previous_), op, "cudaGetDevice");
  if (previous_ != index) check(cudaSetDevice(index), op, "cudaSetDevice");
}

DeviceGuard::~DeviceGuard() {
  int now = -1;
  if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
}

void* malloc_device(size_t nbytes, int index) {
  const DeviceGuard guard(index);
  void* p = nullptr;
  if (cudaMalloc(&p, nbytes == 0 ? 1 : nbytes) != cudaSuccess) {
    (void)cudaGetLastError();  // out of memory: the caller reports it (OutOfMemoryError)
    return nullptr;
  }
  return p;
}

void free_device(void* p, int index) noexcept {
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  if (previous != index) (void)cudaSetDevice(index);
  (void)cudaFree(p);
  if (previous != index) (void)cudaSetDevice(previous);
}

void copy_to_device(void* dst, const void* src, size_t nbytes, int device, const char* op) {
  const DeviceGuard guard(device);
  check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyHostToDevice, stream()), op, "cudaMemcpyAsync to the device");
  // The source is pageable host memory the caller may free on return: wait for it.
  check(cudaStreamSynchronize(stream()), op, "cudaStreamSynchronize after a copy to the device");
}

void copy_to_host(void* dst, const void* src, size_t nbytes, int device, const char* op) {
  const DeviceGuard guard(device);
  check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToHost, stream()), op, "cudaMemcpyAsync to the host");
  check(cudaStreamSynchronize(stream()), op, "cudaStreamSynchronize after a copy to the host");
}

void copy_device_to_device(void* dst, const void* src, size_t nbytes, int device, const char* op) {
  const DeviceGuard guard(device);
  check(cudaMemcpyAsync(dst, src, nbytes, cudaMemcpyDeviceToDevice, stream()), op, "cudaMemcpyAsync on the device");
}

}  // namespace kernels::cuda
}  // namespace qkv
