// The pool of large result buffers (see buffer_pool.h).
#include "tensor/buffer_pool.h"

#include <sys/mman.h>

#include <cstdlib>
#include <mutex>
#include <vector>

namespace qkv::kernels {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kPooledMin = size_t{4} << 20;
constexpr size_t kPoolBytes = size_t{1} << 30;
constexpr size_t kPoolCount = 4;

struct Block {
  void* p;
  size_t bytes;
};

class Pool {
 public:
  // A block of at least `bytes` (and at most twice that), or null.
  void* take(size_t bytes, size_t& got) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < free_.size(); ++i) {
      if (free_[i].bytes >= bytes && free_[i].bytes <= 2 * bytes) {
        void* p = free_[i].p;
        got = free_[i].bytes;
        held_ -= got;
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return p;
      }
    }
    return nullptr;
  }
  void give(void* p, size_t bytes) {
    std::unique_lock<std::mutex> lock(mutex_);
    if (free_.size() == kPoolCount || held_ + bytes > kPoolBytes) {  // evict the oldest
      if (free_.empty() || bytes > kPoolBytes) {
        lock.unlock();
        std::free(p);
        return;
      }
      std::free(free_.front().p);
      held_ -= free_.front().bytes;
      free_.erase(free_.begin());
    }
    free_.push_back({p, bytes});
    held_ += bytes;
  }

 private:
  std::mutex mutex_;
  std::vector<Block> free_;
  size_t held_ = 0;
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: buffers may be released during exit
  return *p;
}

}  // namespace

Tensor empty_pooled(const Shape& shape, DType dtype, const char* role) {
  // Checked against overflow and QKV_MAX_ALLOC_BYTES before anything is taken.
  const size_t nbytes = checked_alloc_bytes(shape, dtype, role);
  size_t padded = 0;
  if (nbytes < kPooledMin || __builtin_add_overflow(nbytes, kHugePage - 1, &padded)) {
    return Tensor::empty(shape, dtype);
  }
  const size_t rounded = padded / kHugePage * kHugePage;
  size_t bytes = rounded;
  void* p = pool().take(rounded, bytes);
  if (p == nullptr) {
    p = std::aligned_alloc(kHugePage, rounded);
    if (p == nullptr) fail_out_of_memory(nbytes, allocation_what(shape, dtype, role), "empty_pooled");
    (void)madvise(p, rounded, MADV_HUGEPAGE);  // advice only
  }
  std::shared_ptr<void> owner(p, [bytes](void* q) { pool().give(q, bytes); });
  return Tensor::view_of(Storage::wrap(p, nbytes, std::move(owner)), dtype, shape, contiguous_strides(shape), 0);
}

}  // namespace qkv::kernels
