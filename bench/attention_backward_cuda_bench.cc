// The CUDA FlashAttention backward (scaled_dot_product_attention_backward on cuda:0,
// bf16, from the GPU forward's output and logsumexp) in TFLOP/s. Only built with the
// CUDA backend; run on a machine with a GPU (docs/cuda.md):
//
//   build/release/attention_backward_cuda_bench --benchmark_out=qkv_backward.json
//   python3 bench/peers/sdpa_cuda.py --backward --out torch_backward.json
//   python3 bench/peers/cuda_report.py --backward --qkv qkv_backward.json --torch torch_backward.json
//
// Timed with CUDA events around each backward call (manual time): its four kernels plus
// qkv's host work per call (checks, the gradients' and accumulators' allocations); the
// forward runs once, outside. "TFLOPs" counts 2.5 times the forward's FLOPs (five
// products instead of two), causal the computed half, as FlashAttention does.
#include <benchmark/benchmark.h>

#include <cstdint>

#include "bench_main.h"
#include "cuda_bench.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/attention_flops.h"
#include "qkv/cuda.h"

namespace {

using qkv::Device;
using qkv::Tensor;

// state.range: B, H, L, D, causal.
void BM_AttentionBackwardCuda(benchmark::State& state) {
  const auto operands = qkv::bench::gpu_qkv(state);
  if (!operands) return;
  const auto& [q, k, v] = *operands;  // [B, H, L, D] bf16 on cuda:0
  const int64_t b = state.range(0), h = state.range(1), l = state.range(2), d = state.range(3);
  const bool causal = state.range(4) != 0;
  const Tensor dout = Tensor::randn({b, h, l, d}, 4, qkv::DType::bf16).to(Device::cuda());
  qkv::AttentionOptions o;
  o.is_causal = causal;
  o.return_logsumexp = true;
  const qkv::AttentionResult fwd = qkv::scaled_dot_product_attention(q, k, v, o);
  o.return_logsumexp = false;
  auto backward = [&] {
    return qkv::scaled_dot_product_attention_backward(q, k, v, fwd.output, dout, *fwd.logsumexp, o);
  };
  (void)backward();  // warm-up: module load, shared-memory attributes
  qkv::cuda::synchronize();
  for (auto _ : state) {
    state.SetIterationTime(qkv::bench::gpu_ms([&] { benchmark::DoNotOptimize(backward()); }) / 1e3);
  }
  state.counters["TFLOPs"] = benchmark::Counter(2.5 * qkv::attention_flops(b, h, l, d, causal) / 1e12,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_AttentionBackwardCuda)->Apply([](auto* b) { qkv::bench::attention_shapes(b); });

}  // namespace

int main(int argc, char** argv) {
  qkv::bench::add_gpu_context();
  return qkv::bench::run_benchmarks(argc, argv);
}
