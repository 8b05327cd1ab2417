// The CUDA backend's runtime: which GPUs there are, the stream qkv's work goes to,
// and waiting for it (docs/cuda.md).
//
// qkv builds the backend when CMake finds nvcc (QKV_CUDA=auto, the default; ON
// requires it, OFF leaves it out). A build without it still has these functions:
// built() is false, device_count() is 0, and a tensor on "cuda:N" cannot be
// allocated (DeviceError naming the operation and the device).
//
// Tensors on cuda:N (Tensor::empty(shape, dtype, Device::cuda(n)), Tensor::to(device),
// or a wrapped device pointer from DLPack) live in that GPU's memory. Their storage
// comes from a stream-ordered memory pool of qkv's own on that GPU (cudaMallocFromPoolAsync
// on the current stream) and goes back to it on the stream it was allocated on (cudaFreeAsync): freed
// blocks stay cached for the next allocation instead of going back to the device
// (as PyTorch's caching allocator keeps them), until empty_cache(). A tensor used on
// another stream than the one it was allocated on must be synchronized with before it
// is freed (torch's record_stream rule), and a stream must outlive the tensors
// allocated on it. QKV_CUDA_ALLOC=plain (read once) uses plain cudaMalloc/cudaFree,
// which synchronize the device. Copies between the host and
// the device, and operations on device tensors, are queued on the calling thread's
// current stream (below) and are asynchronous with respect to the host, except
// that a copy to the host waits for its stream before it returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace qkv::cuda {

// True when this build of qkv has the CUDA backend (whether or not a GPU is present).
bool built();
// The number of GPUs the CUDA runtime sees (0 without the backend, without a driver,
// or without a GPU; never throws).
int device_count();
// device_count() > 0.
inline bool available() { return device_count() > 0; }

struct DeviceProperties {
  std::string name;                          // "NVIDIA H100 80GB HBM3"
  int major = 0, minor = 0;                  // compute capability (9.0 on Hopper)
  int multiprocessors = 0;                   // streaming multiprocessors
  size_t total_memory = 0;                   // bytes of device memory
  size_t l2_cache_bytes = 0;                 //
  size_t shared_memory_per_block_optin = 0;  // the most a block may ask for
  int driver_version = 0;                    // CUDA driver API version, e.g. 13000
  int runtime_version = 0;                   // the CUDA runtime qkv was linked with
};
// Properties of cuda:`index`; DeviceError naming the index when there is no such GPU.
DeviceProperties properties(int index = 0);

// A CUDA stream (cudaStream_t) as an opaque handle; nullptr is the legacy default
// stream, which synchronizes with every other blocking stream (PyTorch's default).
using Stream = void*;

// The stream this thread's qkv work is queued on: nullptr unless a StreamGuard is alive.
Stream current_stream();

// Queues this thread's qkv work on `stream` while the guard lives, then restores the
// previous stream. The caller owns the stream and keeps it alive meanwhile.
class StreamGuard {
 public:
  explicit StreamGuard(Stream stream);
  ~StreamGuard();
  StreamGuard(const StreamGuard&) = delete;
  StreamGuard& operator=(const StreamGuard&) = delete;

 private:
  Stream previous_;
};

// Bytes of cuda:`index`'s memory pool (as torch.cuda.memory_allocated / memory_reserved):
// `allocated` in live blocks, `reserved` held by the pool (live and cached). With
// plain allocations (QKV_CUDA_ALLOC=plain, or a GPU without memory pools) `caching`
// is false and both are 0.
struct MemoryStats {
  bool caching = false;
  uint64_t allocated = 0;
  uint64_t reserved = 0;
};
MemoryStats memory_stats(int index = 0);

// Returns the cached, unused blocks of cuda:`index`'s pool to the device, after
// waiting for its work (torch.cuda.empty_cache). DeviceError for no such GPU.
void empty_cache(int index = 0);

// Waits for the work of every stream on cuda:`index` (cudaDeviceSynchronize): what
// must happen before memory another framework used on its own streams is reused
// (the Python package does it when an exported qkv array is released).
void synchronize_device(int index = 0);

// Waits for the work queued on current_stream() (on cuda:`index`). DeviceError with
// the CUDA error text when a kernel before it failed.
void synchronize(int index = 0);

}  // namespace qkv::cuda
