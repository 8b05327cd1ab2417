// GPU timing for the CUDA benchmarks: milliseconds between two CUDA events on the
// legacy default stream (where qkv queues its work unless a StreamGuard names another).
#pragma once

#include <cuda_runtime_api.h>

namespace qkv::bench {

// Milliseconds of `fn` on the GPU between two events on the current stream.
template <class Fn>
double gpu_ms(Fn&& fn) {
  cudaEvent_t start = nullptr, stop = nullptr;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, nullptr);
  fn();
  cudaEventRecord(stop, nullptr);
  cudaEventSynchronize(stop);
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return ms;
}

}  // namespace qkv::bench
