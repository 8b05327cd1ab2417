// lsh_attention (Reformer: chunks of 64 keys, 2 chunks seen per query, n_hashes rounds) beside
// the fused scaled_dot_product_attention at growing L, f32, (B, H) = (1, 8), D = 64, the
// bucket count Reformer's default for L (2 L / 64 rounded down to a power of two). "tokens"
// counts query rows per second.
//
//   QKV_NUM_THREADS=2 build/release/lsh_attention_bench --benchmark_min_time=0.3
#include <benchmark/benchmark.h>

#include <cstdint>

#include "bench_main.h"
#include "qkv/attention.h"
#include "qkv/lsh_attention.h"

namespace {

void tokens(benchmark::State& state) {
  state.counters["tokens"] =
      benchmark::Counter(8.0 * static_cast<double>(state.range(0)), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_LshAttention(benchmark::State& state) {  // state.range: L, n_hashes
  const int64_t l = state.range(0);
  const qkv::Tensor qk = qkv::Tensor::randn({1, 8, l, 64}, 1),
                    v = qkv::Tensor::randn({1, 8, l, 64}, 3);  // [B, H, L, D]
  qkv::LshAttentionOptions o;
  o.n_hashes = state.range(1);
  for (auto _ : state) benchmark::DoNotOptimize(qkv::lsh_attention(qk, v, o).raw_data());
  tokens(state);
}

void BM_SoftmaxAttention(benchmark::State& state) {  // state.range: L
  const int64_t l = state.range(0);
  const qkv::Tensor q = qkv::Tensor::randn({1, 8, l, 64}, 1), v = qkv::Tensor::randn({1, 8, l, 64}, 3);
  for (auto _ : state) benchmark::DoNotOptimize(qkv::scaled_dot_product_attention(q, q, v).output.raw_data());
  tokens(state);
}

BENCHMARK(BM_LshAttention)
    ->ArgNames({"L", "hashes"})
    ->ArgsProduct({{1024, 4096, 16384}, {1, 2, 4}})
    ->Args({65536, 1})
    ->Args({65536, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
BENCHMARK(BM_SoftmaxAttention)
    ->ArgNames({"L"})
    ->Args({1024})
    ->Args({4096})
    ->Args({16384})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) { return qkv::bench::run_benchmarks(argc, argv); }
