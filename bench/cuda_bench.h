// Shared by the CUDA benchmarks (attention_cuda_bench, attention_backward_cuda_bench):
// GPU timing with CUDA events, and the GPU's name and CUDA versions in the JSON context.
#pragma once

#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>

#include "qkv/cuda.h"
#include "qkv/tensor.h"

namespace qkv::bench {

// Milliseconds of `fn` on the GPU between two events on the legacy default stream
// (where qkv queues its work unless a StreamGuard names another).
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

// Random bf16 q, k, v [B, H, L, D] on cuda:0 (seeds 1, 2, 3) for state.range (B, H, L,
// D, causal), or nullopt after SkipWithError when there is no GPU.
inline std::optional<std::array<qkv::Tensor, 3>> gpu_qkv(benchmark::State& state) {
  if (!qkv::cuda::available()) {
    state.SkipWithError("no GPU");
    return std::nullopt;
  }
  const int64_t b = state.range(0), h = state.range(1), l = state.range(2), d = state.range(3);
  std::array<qkv::Tensor, 3> qkv_tensors;
  for (uint64_t i = 0; i < 3; ++i) {
    qkv_tensors[i] = qkv::Tensor::randn({b, h, l, d}, i + 1, qkv::DType::bf16).to(qkv::Device::cuda());
  }
  return qkv_tensors;
}

// The shapes of issue 19's table (B, H, L, D, causal): (4, 16, 4096, 128) and
// (1, 16, 16384, 128), causal and not, timed by gpu_ms (manual time), in ms.
inline benchmark::internal::Benchmark* attention_shapes(benchmark::internal::Benchmark* b) {
  return b->ArgNames({"B", "H", "L", "D", "causal"})
      ->Args({4, 16, 4096, 128, 0})
      ->Args({4, 16, 4096, 128, 1})
      ->Args({1, 16, 16384, 128, 0})
      ->Args({1, 16, 16384, 128, 1})
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->MinTime(0.5);
}

// Context keys gpu, gpu_sm, cuda_driver, cuda_runtime (read by bench/peers/cuda_report.py).
inline void add_gpu_context() {
  if (!qkv::cuda::available()) return;
  const qkv::cuda::DeviceProperties p = qkv::cuda::properties(0);
  benchmark::AddCustomContext("gpu", p.name);
  benchmark::AddCustomContext("gpu_sm", std::to_string(p.major) + std::to_string(p.minor));
  benchmark::AddCustomContext("cuda_driver", std::to_string(p.driver_version));
  benchmark::AddCustomContext("cuda_runtime", std::to_string(p.runtime_version));
}

}  // namespace qkv::bench
