// The CUDA runtime of a build without the backend (QKV_CUDA=OFF, or no nvcc): no
// devices, and every device operation is a DeviceError saying why.
#include "kernels/cuda/cuda_runtime.h"
#include "qkv/error.h"

namespace qkv {

namespace {
[[noreturn]] void no_backend(const char* op) {
  fail<DeviceError>(op, ": this build of qkv has no CUDA backend (rebuild with nvcc on PATH, QKV_CUDA=ON)");
}
}  // namespace

namespace cuda {

bool built() { return false; }
int device_count() { return 0; }
DeviceProperties properties(int index) {
  fail<DeviceError>("cuda::properties: no GPU cuda:", index, " (this build of qkv has no CUDA backend)");
}
Stream current_stream() { return nullptr; }
StreamGuard::StreamGuard(Stream) : previous_(nullptr) {}
StreamGuard::~StreamGuard() = default;
void synchronize(int) { no_backend("cuda::synchronize"); }
void synchronize_device(int) { no_backend("cuda::synchronize_device"); }
void empty_cache(int) { no_backend("cuda::empty_cache"); }
MemoryStats memory_stats(int) { no_backend("cuda::memory_stats"); }

}  // namespace cuda

namespace kernels::cuda {

void check(int status, const char* op, const char*) {
  if (status != 0) no_backend(op);
}
DeviceGuard::DeviceGuard(int, const char* op) { no_backend(op); }
// Never constructed (the constructor throws); previous_ named so that clang, which sees
// every member function of the class here, does not call it unused (-Wunused-private-field).
DeviceGuard::~DeviceGuard() { (void)previous_; }
void* malloc_device(size_t, int) { return nullptr; }
void free_device(void*, int) noexcept {}
void copy_to_device(void*, const void*, size_t, int, const char* op) { no_backend(op); }
void copy_to_host(void*, const void*, size_t, int, const char* op) { no_backend(op); }
void copy_device_to_device(void*, const void*, size_t, int, const char* op) { no_backend(op); }
void strided_copy(std::span<const int64_t>, const void*, std::span<const int64_t>, void*, std::span<const int64_t>,
                  size_t, int, const char* op) {
  no_backend(op);
}

}  // namespace kernels::cuda
}  // namespace qkv
