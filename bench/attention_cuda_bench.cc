// The CUDA FlashAttention forward (scaled_dot_product_attention on cuda:0, bf16) in
// TFLOP/s, beside cuBLAS's bf16 GEMM as the yardstick of the same GPU. Only built
// with the CUDA backend; run on a machine with a GPU (docs/cuda.md):
//
//   build/release/attention_cuda_bench --benchmark_format=json > qkv.json
//   python3 bench/peers/sdpa_cuda.py --out torch.json      # PyTorch's flash SDPA
//   python3 bench/peers/cuda_report.py qkv.json torch.json
//
// Timed with CUDA events around each call (manual time): the kernel plus qkv's host
// work per call (checks, the output's allocation from qkv's memory pool). "TFLOPs" counts the two products,
// 4 B H L^2 D, causal only the unmasked half (attention_flops), as FlashAttention does.
#include <benchmark/benchmark.h>
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "bench_main.h"
#include "cuda_bench.h"
#include "qkv/attention.h"
#include "qkv/attention_flops.h"
#include "qkv/cuda.h"

namespace {

using qkv::Device;
using qkv::Tensor;

using qkv::bench::gpu_ms;

// state.range: B, H, L, D, causal.
void BM_AttentionCuda(benchmark::State& state) {
  const auto operands = qkv::bench::gpu_qkv(state);
  if (!operands) return;
  const auto& [q, k, v] = *operands;  // [B, H, L, D] bf16 on cuda:0
  const int64_t b = state.range(0), h = state.range(1), l = state.range(2), d = state.range(3);
  const bool causal = state.range(4) != 0;
  qkv::AttentionOptions o;
  o.is_causal = causal;
  (void)qkv::scaled_dot_product_attention(q, k, v, o);  // warm-up: module load, smem attribute
  qkv::cuda::synchronize();
  for (auto _ : state) {
    state.SetIterationTime(gpu_ms([&] { benchmark::DoNotOptimize(qkv::scaled_dot_product_attention(q, k, v, o)); }) /
                           1e3);
  }
  state.counters["TFLOPs"] = benchmark::Counter(qkv::attention_flops(b, h, l, d, causal) / 1e12,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionCuda)->Apply([](auto* b) { qkv::bench::attention_shapes(b)->Args({4, 16, 4096, 64, 0}); });

// The yardstick: cuBLAS bf16 GEMM, float32 accumulation (cublasGemmEx), M = N = K.
void BM_CublasGemmBf16(benchmark::State& state) {
  if (!qkv::cuda::available()) {
    state.SkipWithError("no GPU");
    return;
  }
  const int64_t n = state.range(0);
  const Tensor a = Tensor::randn({n, n}, 4, qkv::DType::bf16).to(Device::cuda());
  const Tensor bm = Tensor::randn({n, n}, 5, qkv::DType::bf16).to(Device::cuda());
  const Tensor c = Tensor::empty({n, n}, qkv::DType::bf16, Device::cuda());
  cublasHandle_t handle = nullptr;
  cublasCreate(&handle);
  const float one = 1, zero = 0;
  const int m = static_cast<int>(n);
  auto gemm = [&] {
    cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, m, m, m, &one, a.raw_data(), CUDA_R_16BF, m, bm.raw_data(),
                 CUDA_R_16BF, m, &zero, c.raw_data(), CUDA_R_16BF, m, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
  };
  gemm();
  cudaDeviceSynchronize();
  for (auto _ : state) state.SetIterationTime(gpu_ms(gemm) / 1e3);
  cublasDestroy(handle);
  state.counters["TFLOPs"] =
      benchmark::Counter(2.0 * static_cast<double>(n * n * n) / 1e12, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_CublasGemmBf16)->ArgNames({"M"})->Arg(8192)->UseManualTime()->Unit(benchmark::kMillisecond)->MinTime(0.5);

}  // namespace

int main(int argc, char** argv) {
  qkv::bench::add_gpu_context();
  return qkv::bench::run_benchmarks(argc, argv);
}
