// The allocator registry and the CPU allocator (qkv/allocator.h).
#include "qkv/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

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
  if (it == r.allocators.end()) {
    fail<DeviceError>(op, ": no allocator for device ", device.to_string(),
                      " (this build of qkv has no backend for it)");
  }
  return *it->second;
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
