// The copy engine's GPU side (kernels/cuda/cuda_runtime.h): one thread per element,
// its multi-index decoded row-major from the thread's linear index. Used for
// contiguous()/clone() of device tensors and the layout changes before a kernel;
// bandwidth-bound, so simple: the layouts that matter in attention are already
// contiguous and take cudaMemcpyAsync (Tensor::clone checks that first).
#include <cuda_runtime.h>

#include <array>
#include <cstdint>

#include "kernels/cuda/cuda_runtime.h"
#include "qkv/error.h"

namespace qkv::kernels::cuda {

namespace {

struct Geometry {
  int ndim;
  int64_t numel;
  int64_t shape[kMaxCopyDims];
  int64_t src_strides[kMaxCopyDims];
  int64_t dst_strides[kMaxCopyDims];
};

template <class Word>
__global__ void strided_copy_kernel(const Word* __restrict__ src, Word* __restrict__ dst, Geometry g) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < g.numel; i += int64_t{gridDim.x} * blockDim.x) {
    int64_t rest = i, s = 0, d = 0;
    for (int k = g.ndim - 1; k >= 0; --k) {
      const int64_t index = rest % g.shape[k];
      rest /= g.shape[k];
      s += index * g.src_strides[k];
      d += index * g.dst_strides[k];
    }
    dst[d] = src[s];
  }
}

template <class Word>
void launch(const void* src, void* dst, const Geometry& g, cudaStream_t stream) {
  constexpr int kThreads = 256;
  const int64_t blocks = (g.numel + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < 65535 * 16 ? blocks : 65535 * 16);  // grid-stride past that
  strided_copy_kernel<Word><<<grid, kThreads, 0, stream>>>(static_cast<const Word*>(src), static_cast<Word*>(dst), g);
}

}  // namespace

void strided_copy(std::span<const int64_t> shape, const void* src, std::span<const int64_t> src_strides, void* dst,
                  std::span<const int64_t> dst_strides, size_t itemsize, int device, const char* op) {
  if (shape.size() > static_cast<size_t>(kMaxCopyDims)) {
    fail<ValueError>(op, ": a copy on the GPU takes at most ", kMaxCopyDims, " dims, got ", shape.size());
  }
  Geometry g{};
  g.ndim = static_cast<int>(shape.size());
  g.numel = 1;
  for (size_t k = 0; k < shape.size(); ++k) {
    g.shape[k] = shape[k];
    g.src_strides[k] = src_strides[k];
    g.dst_strides[k] = dst_strides[k];
    g.numel *= shape[k];
  }
  if (g.numel == 0) return;
  const DeviceGuard guard(device);
  const auto stream = static_cast<cudaStream_t>(qkv::cuda::current_stream());
  switch (itemsize) {
    case 1: launch<uint8_t>(src, dst, g, stream); break;
    case 2: launch<uint16_t>(src, dst, g, stream); break;
    case 4: launch<uint32_t>(src, dst, g, stream); break;
    case 8: launch<uint64_t>(src, dst, g, stream); break;
    default: fail<ValueError>(op, ": no GPU copy for elements of ", itemsize, " bytes");
  }
  check(cudaGetLastError(), op, "the strided copy kernel's launch");
}

}  // namespace qkv::kernels::cuda
