// The allocator registry and the CPU allocator (qkv/allocator.h).
#include "qkv/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "kernels/cuda/cuda_runtime.h"
#include "qkv/cuda.h"
#include "qkv/tensor.h"

namespace qkv {

namespace {

class CpuAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    // aligned_alloc needs a size that is a multiple of the alignment (and > 0).
    size_t padded = 0;
    if (__builtin_add_overflow(nbytes, kAlign - 1, &padded)) return nullptr;
    return std::aligned_alloc(kAlign, std::max(kAlign, padded / kAlign * kAlign));
  }
  void deallocate(void* p, size_t) noexcept override { std::free(p); }

 private:
  static constexpr size_t kAlign = Storage::kAlignment;
};

// Device memory of one GPU (cudaMalloc/cudaFree through the CUDA runtime): what
// cuda:N gets unless an allocator was registered for it.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(int index) : index_(index) {}
  void* allocate(size_t nbytes) override { return kernels::cuda::malloc_device(nbytes, index_); }
  void deallocate(void* p, size_t) noexcept override { kernels::cuda::free_device(p, index_); }

 private:
  int index_;
};

// The CUDA allocator of cuda:`index` (one per GPU, made on first use), or a
// DeviceError naming `op` when the build has no CUDA backend or no such GPU.
Allocator& cuda_allocator(int index, std::string_view op) {
  if (!cuda::built()) {
    fail<DeviceError>(op, ": no allocator for device cuda:", index,
                      " (this build of qkv has no CUDA backend: rebuild with nvcc on PATH, QKV_CUDA=ON)");
  }
  const int count = cuda::device_count();
  if (index >= count) {
    fail<DeviceError>(op, ": no allocator for device cuda:", index, " (no such GPU: ", count, " visible)");
  }
  static std::mutex mutex;
  // Never destroyed: storages may be freed during static destruction.
  static auto& allocators = *new std::map<int, std::unique_ptr<CudaAllocator>>();
  const std::lock_guard lock(mutex);
  auto& a = allocators[index];
  if (!a) a = std::make_unique<CudaAllocator>(index);
  return *a;
}

struct Registry {
  std::mutex mutex;
  std::map<std::pair<DeviceKind, int>, Allocator*> allocators;  // every device but the CPU
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

Allocator& cpu_allocator() {
  static CpuAllocator a;
  return a;
}

Allocator& allocator_for(Device device, std::string_view op) {
  if (device.is_cpu()) return cpu_allocator();  // no lock on the common path
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  const auto it = r.allocators.find({device.kind, device.index});
  if (it == r.allocators.end() && device.kind == DeviceKind::cuda) return cuda_allocator(device.index, op);
  if (it == r.allocators.end()) {
    fail<DeviceError>(op, ": no allocator for device ", device.to_string(),
                      " (this build of qkv has no backend for it)");
  }
  return *it->second;
}

bool served_by_backend(Device device) {
  if (device.kind != DeviceKind::cuda || !cuda::built() || device.index >= cuda::device_count()) return false;
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  return r.allocators.find({device.kind, device.index}) == r.allocators.end();
}

void register_allocator(Device device, Allocator* allocator) {
  if (device.is_cpu()) fail<ValueError>("register_allocator: the CPU allocator cannot be replaced");
  Registry& r = registry();
  const std::lock_guard lock(r.mutex);
  if (allocator) {
    r.allocators[{device.kind, device.index}] = allocator;
  } else {
    r.allocators.erase({device.kind, device.index});
  }
}

}  // namespace qkv
