// The CUDA runtime of qkv (qkv/cuda.h, kernels/cuda/cuda_runtime.h) over the CUDA
// runtime API: device queries, the per-thread current stream, device memory and the
// byte copies between host and device.
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string_view>
#include <unordered_map>

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

namespace {
void check_index(int index, const char* op) {
  if (index < 0 || index >= device_count()) {
    fail<DeviceError>(op, ": no GPU cuda:", index, " (", device_count(), " visible)");
  }
}
}  // namespace

DeviceProperties properties(int index) {
  check_index(index, "cuda::properties");
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

void synchronize_device(int index) {
  check_index(index, "cuda::synchronize_device");
  const kernels::cuda::DeviceGuard guard(index, "cuda::synchronize_device");
  kernels::cuda::check(cudaDeviceSynchronize(), "cuda::synchronize_device", "cudaDeviceSynchronize");
}

void synchronize(int index) {
  check_index(index, "cuda::synchronize");
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

// ---- device memory: CUDA's stream-ordered pool as a caching allocator ---------------
//
// cudaFree waits for the whole device and cudaMalloc costs tens of microseconds, so
// an output allocated and freed per call stalled the GPU between calls (PyTorch keeps
// freed blocks in its caching allocator for the same reason). Memory comes from the
// device's default memory pool instead (cudaMallocAsync on the current stream, with a
// release threshold of "never", so freed blocks stay cached for reuse) and goes back
// with cudaFreeAsync on the stream it was allocated on: the block is reused only in
// that stream's order, as PyTorch's allocator does. QKV_CUDA_ALLOC=plain (read once)
// selects plain cudaMalloc/cudaFree, as does a device without memory pools.

namespace {

struct Pool {
  std::mutex mutex;
  std::unordered_map<void*, cudaStream_t> streams;  // live blocks and their allocation stream
  std::map<int, bool> pooled;                       // per device: the pool is used
};

Pool& pool() {
  static auto& p = *new Pool();  // never destroyed: storages may be freed at exit
  return p;
}

bool plain_requested() {
  static const bool plain = [] {
    const char* env = std::getenv("QKV_CUDA_ALLOC");
    return env != nullptr && std::string_view(env) == "plain";
  }();
  return plain;
}

// Whether cuda:`index` (current) allocates from its pool; configures the pool once.
bool pooled(int index) {
  Pool& p = pool();
  const std::lock_guard lock(p.mutex);
  const auto it = p.pooled.find(index);
  if (it != p.pooled.end()) return it->second;
  int supported = 0;
  cudaMemPool_t mem_pool = nullptr;
  bool use = !plain_requested() &&
             cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, index) == cudaSuccess &&
             supported != 0 && cudaDeviceGetDefaultMemPool(&mem_pool, index) == cudaSuccess;
  if (use) {
    uint64_t keep = UINT64_MAX;  // keep freed blocks cached until empty_cache
    use = cudaMemPoolSetAttribute(mem_pool, cudaMemPoolAttrReleaseThreshold, &keep) == cudaSuccess;
  }
  (void)cudaGetLastError();
  p.pooled[index] = use;
  return use;
}

// Returns the cached blocks of cuda:`index` (current) to the device, after its work.
void trim(int index) {
  cudaMemPool_t mem_pool = nullptr;
  if (cudaDeviceSynchronize() == cudaSuccess && cudaDeviceGetDefaultMemPool(&mem_pool, index) == cudaSuccess) {
    (void)cudaMemPoolTrimTo(mem_pool, 0);
  }
  (void)cudaGetLastError();
}

}  // namespace

void* malloc_device(size_t nbytes, int index) {
  const DeviceGuard guard(index);
  const size_t n = nbytes == 0 ? 1 : nbytes;
  void* p = nullptr;
  if (!pooled(index)) {
    if (cudaMalloc(&p, n) == cudaSuccess) return p;
    (void)cudaGetLastError();  // out of memory: the caller reports it (OutOfMemoryError)
    return nullptr;
  }
  const cudaStream_t s = stream();
  if (cudaMallocAsync(&p, n, s) != cudaSuccess) {
    (void)cudaGetLastError();
    trim(index);  // the cached blocks first, then once more (as PyTorch does)
    if (cudaMallocAsync(&p, n, s) != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
  }
  Pool& pl = pool();
  const std::lock_guard lock(pl.mutex);
  pl.streams[p] = s;
  return p;
}

void free_device(void* p, int index) noexcept {
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  if (previous != index) (void)cudaSetDevice(index);
  cudaStream_t s = nullptr;
  bool async = false;
  {
    Pool& pl = pool();
    const std::lock_guard lock(pl.mutex);
    const auto it = pl.streams.find(p);
    if (it != pl.streams.end()) {
      s = it->second;
      async = true;
      pl.streams.erase(it);
    }
  }
  if (async) {
    (void)cudaFreeAsync(p, s);
  } else {
    (void)cudaFree(p);
  }
  (void)cudaGetLastError();
  if (previous != index) (void)cudaSetDevice(previous);
}

int64_t env_int(const char* name, int64_t fallback) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  const long long v = std::strtoll(env, &end, 10);
  return *end == '\0' ? v : fallback;
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

namespace cuda {

namespace {

uint64_t pool_bytes(int index, cudaMemPoolAttr attribute) {
  cudaMemPool_t mem_pool = nullptr;
  uint64_t bytes = 0;
  kernels::cuda::check(cudaDeviceGetDefaultMemPool(&mem_pool, index), "cuda::memory_stats",
                       "cudaDeviceGetDefaultMemPool");
  kernels::cuda::check(cudaMemPoolGetAttribute(mem_pool, attribute, &bytes), "cuda::memory_stats",
                       "cudaMemPoolGetAttribute");
  return bytes;
}
}  // namespace

void empty_cache(int index) {
  check_index(index, "cuda::empty_cache");
  const kernels::cuda::DeviceGuard guard(index, "cuda::empty_cache");
  if (kernels::cuda::pooled(index)) kernels::cuda::trim(index);
}

MemoryStats memory_stats(int index) {
  check_index(index, "cuda::memory_stats");
  const kernels::cuda::DeviceGuard guard(index, "cuda::memory_stats");
  MemoryStats m;
  m.caching = kernels::cuda::pooled(index);
  if (m.caching) {
    m.allocated = pool_bytes(index, cudaMemPoolAttrUsedMemCurrent);
    m.reserved = pool_bytes(index, cudaMemPoolAttrReservedMemCurrent);
  }
  return m;
}

}  // namespace cuda
}  // namespace qkv
