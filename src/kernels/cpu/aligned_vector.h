// std::vector on cache-line aligned storage, for kernels' scratch that a GEMM or a SIMD loop
// reads as an operand.
//
// std::vector's allocator gives 16-byte alignment; a buffer of 128 KiB and more comes from mmap
// at a page start plus glibc's 16-byte header, so its rows start 16 bytes into a cache line and
// every 256-byte row (64 floats) spans five lines instead of four. Tensors are 64-byte aligned
// (qkv/allocator.h): scratch that stands in for them (a widened K tile, a worker's scores) is too.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <new>
#include <vector>

namespace qkv::kernels {

inline constexpr size_t kCacheLine = 64;

template <class T>
struct CacheAlignedAllocator {
  using value_type = T;
  CacheAlignedAllocator() noexcept = default;
  template <class U>
  CacheAlignedAllocator(const CacheAlignedAllocator<U>&) noexcept {}  // NOLINT: rebinding, as std::allocator
  T* allocate(size_t n) {
    if (n > static_cast<size_t>(-1) / sizeof(T) - kCacheLine) throw std::bad_array_new_length();
    // aligned_alloc needs a size that is a multiple of the alignment.
    const size_t bytes = (n * sizeof(T) + kCacheLine - 1) / kCacheLine * kCacheLine;
    void* p = std::aligned_alloc(kCacheLine, bytes == 0 ? kCacheLine : bytes);
    if (p == nullptr) throw std::bad_alloc();
    return static_cast<T*>(p);
  }
  void deallocate(T* p, size_t) noexcept { std::free(p); }
  template <class U>
  bool operator==(const CacheAlignedAllocator<U>&) const noexcept {
    return true;
  }
  template <class U>
  bool operator!=(const CacheAlignedAllocator<U>&) const noexcept {
    return false;
  }
};

// A std::vector whose data() is 64-byte aligned.
template <class T>
using AlignedVector = std::vector<T, CacheAlignedAllocator<T>>;

}  // namespace qkv::kernels
