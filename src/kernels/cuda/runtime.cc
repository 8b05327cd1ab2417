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

// ---- device memory: a stream-ordered pool as a caching allocator -------------------
//
// cudaFree waits for the whole device and cudaMalloc costs tens of microseconds, so
// an output allocated and freed per call stalled the GPU between calls (PyTorch keeps
// freed blocks in its caching allocator for the same reason; on an H100 the pool is
// worth 2-13%, docs/cuda.md). Each GPU gets a memory pool of qkv's own
// (cudaMemPoolCreate, release threshold "never", so freed blocks stay cached), not the
// device's default pool, which other libraries (torch's cudaMallocAsync backend, CuPy)
// share: its statistics and empty_cache are qkv's alone, and the memory is on the
// pool's GPU whichever device the current stream belongs to. Blocks come from
// cudaMallocFromPoolAsync on the current stream and go back with cudaFreeAsync on the
// stream they were allocated on, as PyTorch's allocator does. QKV_CUDA_ALLOC=plain
// (read once) selects plain cudaMalloc/cudaFree, as does a GPU without memory pools.

namespace {

struct Pool {
  std::mutex mutex;
  std::unordered_map<void*, cudaStream_t> streams;  // live blocks and their allocation stream
  std::map<int, cudaMemPool_t> pools;               // per device: qkv's pool, or null (plain)
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

// A new pool of device memory on cuda:`index` that keeps freed blocks; null when the
// device has no memory pools (or one cannot be made).
cudaMemPool_t create_pool(int index) {
  int supported = 0;
  if (cudaDeviceGetAttribute(&supported, cudaDevAttrMemoryPoolsSupported, index) != cudaSuccess || supported == 0) {
    (void)cudaGetLastError();
    return nullptr;
  }
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = index;
  cudaMemPool_t mem_pool = nullptr;
  if (cudaMemPoolCreate(&mem_pool, &props) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  uint64_t keep = UINT64_MAX;  // keep freed blocks cached until empty_cache
  (void)cudaMemPoolSetAttribute(mem_pool, cudaMemPoolAttrReleaseThreshold, &keep);
  (void)cudaGetLastError();
  return mem_pool;
}

// qkv's pool of cuda:`index`, made on first use; null: plain allocations.
cudaMemPool_t pool_of(int index) {
  Pool& p = pool();
  const std::lock_guard lock(p.mutex);
  const auto it = p.pools.find(index);
  if (it != p.pools.end()) return it->second;
  return p.pools[index] = plain_requested() ? nullptr : create_pool(index);
}

// Returns the pool's cached blocks to the device, after the work of cuda:`index`.
void trim(int index, cudaMemPool_t mem_pool) {
  const DeviceGuard guard(index);
  if (cudaDeviceSynchronize() == cudaSuccess) (void)cudaMemPoolTrimTo(mem_pool, 0);
  (void)cudaGetLastError();
}

}  // namespace

void* malloc_device(size_t nbytes, int index) {
  const DeviceGuard guard(index);
  const size_t n = nbytes == 0 ? 1 : nbytes;
  void* p = nullptr;
  const cudaMemPool_t mem_pool = pool_of(index);
  if (mem_pool == nullptr) {
    if (cudaMalloc(&p, n) == cudaSuccess) return p;
    (void)cudaGetLastError();  // out of memory: the caller reports it (OutOfMemoryError)
    return nullptr;
  }
  const cudaStream_t s = stream();
  cudaError_t status = cudaMallocFromPoolAsync(&p, n, mem_pool, s);
  if (status == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    trim(index, mem_pool);  // the cached blocks first, then once more (as PyTorch does)
    status = cudaMallocFromPoolAsync(&p, n, mem_pool, s);
    if (status == cudaErrorMemoryAllocation) {
      (void)cudaGetLastError();
      return nullptr;  // the caller reports OutOfMemoryError
    }
  }
  // Anything else (a destroyed stream, an earlier kernel's error) is not a lack of memory.
  check(status, "cuda allocator", "cudaMallocFromPoolAsync");
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
  if (!async) {
    (void)cudaFree(p);
  } else if (cudaFreeAsync(p, s) != cudaSuccess) {
    // Its stream is gone (destroyed before the tensor, against the rule in qkv/cuda.h):
    // cudaFree does not wait for stream-ordered blocks, so wait for the device first
    // rather than leak the block.
    (void)cudaGetLastError();
    (void)cudaDeviceSynchronize();
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

uint64_t pool_bytes(cudaMemPool_t mem_pool, cudaMemPoolAttr attribute) {
  uint64_t bytes = 0;
  kernels::cuda::check(cudaMemPoolGetAttribute(mem_pool, attribute, &bytes), "cuda::memory_stats",
                       "cudaMemPoolGetAttribute");
  return bytes;
}
}  // namespace

void empty_cache(int index) {
  check_index(index, "cuda::empty_cache");
  const cudaMemPool_t mem_pool = kernels::cuda::pool_of(index);
  if (mem_pool != nullptr) kernels::cuda::trim(index, mem_pool);
}

MemoryStats memory_stats(int index) {
  check_index(index, "cuda::memory_stats");
  const kernels::cuda::DeviceGuard guard(index, "cuda::memory_stats");
  const cudaMemPool_t mem_pool = kernels::cuda::pool_of(index);
  MemoryStats m;
  m.caching = mem_pool != nullptr;
  if (m.caching) {
    m.allocated = pool_bytes(mem_pool, cudaMemPoolAttrUsedMemCurrent);
    m.reserved = pool_bytes(mem_pool, cudaMemPoolAttrReservedMemCurrent);
  }
  return m;
}

}  // namespace cuda
}  // namespace qkv
