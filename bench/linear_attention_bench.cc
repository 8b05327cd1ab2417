// linear_attention (O(L)) beside the fused scaled_dot_product_attention (O(L^2)) at growing L,
// f32, one head group (B, H) = (1, 8), D = 64: where the linear form overtakes softmax
// attention. "tokens" counts query rows per second.
//
//   QKV_NUM_THREADS=2 build/release/linear_attention_bench --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <cstdint>

#include "bench_main.h"
#include "qkv/attention.h"
#include "qkv/linear_attention.h"

namespace {

// state.range: L, causal
void inputs(benchmark::State& state, qkv::Tensor& q, qkv::Tensor& k, qkv::Tensor& v) {
  const int64_t l = state.range(0);
  q = qkv::Tensor::randn({1, 8, l, 64}, 1);  // [B, H, L, D]
  k = qkv::Tensor::randn({1, 8, l, 64}, 2);
  v = qkv::Tensor::randn({1, 8, l, 64}, 3);
}

void BM_LinearAttention(benchmark::State& state) {
  qkv::Tensor q, k, v;
  inputs(state, q, k, v);
  qkv::LinearAttentionOptions o;
  o.is_causal = state.range(1) != 0;
  for (auto _ : state) benchmark::DoNotOptimize(qkv::linear_attention(q, k, v, o).raw_data());
  state.counters["tokens"] =
      benchmark::Counter(8.0 * static_cast<double>(state.range(0)), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_SoftmaxAttention(benchmark::State& state) {
  qkv::Tensor q, k, v;
  inputs(state, q, k, v);
  qkv::AttentionOptions o;
  o.is_causal = state.range(1) != 0;
  for (auto _ : state) benchmark::DoNotOptimize(qkv::scaled_dot_product_attention(q, k, v, o).output.raw_data());
  state.counters["tokens"] =
      benchmark::Counter(8.0 * static_cast<double>(state.range(0)), benchmark::Counter::kIsIterationInvariantRate);
}

void lengths(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"L", "causal"});
  for (int64_t causal : {0, 1}) {
    for (int64_t l : {1024, 4096, 16384}) bm->Args({l, causal});
  }
}
BENCHMARK(BM_LinearAttention)->Apply(lengths)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_SoftmaxAttention)->Apply(lengths)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) { return qkv::bench::run_benchmarks(argc, argv); }
