// Fused CPU attention (scaled_dot_product_attention forward: f32, f64, bf16, f16)
// throughput, beside qkv::gemm's per dtype on the same machine, and the tile-size
// sweep that chose the constants of src/attention/flash_tiles.h. bf16/f16 run on
// oneDNN's 16-bit tiles where the CPU has them; ONEDNN_MAX_CPU_ISA=AVX2 shows the
// float32-tile path of an AVX2 machine (its f32 GEMMs capped alike).
//
//   QKV_NUM_THREADS=2 build/release/attention_bench --benchmark_min_time=1
//
// "flops" (G/s = GFLOP/s) counts the two products: 4 * B * H * Lq * Lk * D
// non-causal; causal counts only the unmasked part, 4 * B * H * D * L(L+1)/2 where Lq = Lk,
// so causal GFLOP/s are those of useful work (the masked part of diagonal
// tiles is computed but not counted). Peers: bench/peers/attention_peers.py.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "bench_main.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/attention_flops.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"

namespace {

using qkv::attention_flops;

// state.range: B, H, L, D, causal; BM_Flash64 / BM_FlashBf16 / BM_FlashF16 run the
// same in float64 / bfloat16 / float16.
// The timed loop of the fused forward over q [B, H, Lq, D] and k, v [B, H, Lk, D] in `dtype`.
void flash_loop(benchmark::State& state, int64_t b, int64_t h, int64_t lq, int64_t lk, int64_t d, bool causal,
                qkv::DType dtype) {
  const qkv::Tensor q = qkv::Tensor::randn({b, h, lq, d}, 1).to(dtype);  // [B, H, Lq, D]
  const qkv::Tensor k = qkv::Tensor::randn({b, h, lk, d}, 2).to(dtype);  // [B, H, Lk, D]
  const qkv::Tensor v = qkv::Tensor::randn({b, h, lk, d}, 3).to(dtype);
  qkv::AttentionOptions o;
  o.is_causal = causal;
  for (auto _ : state) {
    qkv::AttentionResult r = qkv::scaled_dot_product_attention(q, k, v, o);
    benchmark::DoNotOptimize(r.output.raw_data());
  }
  state.counters["flops"] =
      benchmark::Counter(attention_flops(b, h, lq, lk, d, causal), benchmark::Counter::kIsIterationInvariantRate);
}
void flash(benchmark::State& state, qkv::DType dtype) {
  const int64_t b = state.range(0), h = state.range(1), l = state.range(2), d = state.range(3);
  flash_loop(state, b, h, l, l, d, state.range(4) != 0, dtype);
}
void BM_Flash(benchmark::State& state) { flash(state, qkv::DType::f32); }
void BM_Flash64(benchmark::State& state) { flash(state, qkv::DType::f64); }
void BM_FlashBf16(benchmark::State& state) { flash(state, qkv::DType::bf16); }
void BM_FlashF16(benchmark::State& state) { flash(state, qkv::DType::f16); }
// float64 (NumPy's default dtype) at the issue-6 shapes short enough for a quick run.
BENCHMARK(BM_Flash64)
    ->ArgNames({"B", "H", "L", "D", "causal"})
    ->Args({1, 8, 1024, 64, 0})
    ->Args({1, 8, 1024, 64, 1})
    ->Args({4, 8, 1024, 64, 0})
    ->Args({1, 16, 4096, 64, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();
// The issue-6 shapes (bench/peers/attention_peers.py), every 16-bit and 32-bit dtype.
void issue6_shapes(benchmark::internal::Benchmark* bm) {
  bm->ArgNames({"B", "H", "L", "D", "causal"});
  for (int64_t causal : {0, 1}) {
    bm->Args({1, 8, 512, 64, causal});
    bm->Args({4, 8, 1024, 64, causal});
    bm->Args({1, 16, 4096, 64, causal});
    bm->Args({1, 8, 16384, 128, causal});
  }
}
BENCHMARK(BM_Flash)->Apply(issue6_shapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_FlashBf16)->Apply(issue6_shapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_FlashF16)->Apply(issue6_shapes)->Unit(benchmark::kMillisecond)->UseRealTime();

// A query block over long keys (a prefill chunk against a long cache): B H ceil(Lq / Br) work
// items, fewer than the workers or not a multiple of them, so that each item's keys are cut
// into parts (attention_cpu_split.h). state.range: B, H, Lq, Lk, D, causal.
void BM_FlashLongKeys(benchmark::State& state) {
  flash_loop(state, state.range(0), state.range(1), state.range(2), state.range(3), state.range(4), state.range(5) != 0,
             qkv::DType::f32);
}
BENCHMARK(BM_FlashLongKeys)
    ->ArgNames({"B", "H", "Lq", "Lk", "D", "causal"})
    ->Args({1, 1, 128, 16384, 64, 0})
    ->Args({1, 1, 256, 65536, 128, 0})
    ->Args({1, 3, 256, 8192, 64, 0})
    ->Args({1, 8, 128, 32768, 128, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Backward (scaled_dot_product_attention_backward from the forward's saved output and
// logsumexp), f32 and f64; "flops" counts its five products, 2.5x the forward's.
void flash_backward(benchmark::State& state, qkv::DType dtype) {
  const int64_t b = state.range(0), h = state.range(1), l = state.range(2), d = state.range(3);
  const bool causal = state.range(4) != 0;
  const qkv::Tensor q = qkv::Tensor::randn({b, h, l, d}, 1).to(dtype);  // [B, H, L, D]
  const qkv::Tensor k = qkv::Tensor::randn({b, h, l, d}, 2).to(dtype);
  const qkv::Tensor v = qkv::Tensor::randn({b, h, l, d}, 3).to(dtype);
  const qkv::Tensor g = qkv::Tensor::randn({b, h, l, d}, 4).to(dtype);
  qkv::AttentionOptions o;
  o.is_causal = causal;
  o.return_logsumexp = true;
  const qkv::AttentionResult fwd = qkv::scaled_dot_product_attention(q, k, v, o);
  for (auto _ : state) {
    qkv::AttentionGradients r = qkv::scaled_dot_product_attention_backward(q, k, v, fwd.output, g, *fwd.logsumexp, o);
    benchmark::DoNotOptimize(r.dq.raw_data());
  }
  state.counters["flops"] =
      benchmark::Counter(2.5 * attention_flops(b, h, l, d, causal), benchmark::Counter::kIsIterationInvariantRate);
}
void BM_FlashBackward(benchmark::State& state) { flash_backward(state, qkv::DType::f32); }
void BM_FlashBackward64(benchmark::State& state) { flash_backward(state, qkv::DType::f64); }
BENCHMARK(BM_FlashBackward)->Apply(issue6_shapes)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_FlashBackward64)
    ->ArgNames({"B", "H", "L", "D", "causal"})
    ->Args({1, 8, 1024, 64, 0})
    ->Args({4, 8, 1024, 64, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The tile sweep: (B, H, L, D) = (1, 8, L, D) with AttentionOptions::tuning tiles BR x BC.
void BM_FlashTiles(benchmark::State& state) {
  const int64_t l = state.range(0), d = state.range(1);
  const bool causal = state.range(4) != 0;
  const qkv::Tensor q = qkv::Tensor::randn({1, 8, l, d}, 1), k = qkv::Tensor::randn({1, 8, l, d}, 2);
  const qkv::Tensor v = qkv::Tensor::randn({1, 8, l, d}, 3);
  qkv::AttentionOptions o;
  o.is_causal = causal;
  o.tuning.flash_tiles = {state.range(2), state.range(3)};
  for (auto _ : state) {
    qkv::AttentionResult r = qkv::scaled_dot_product_attention(q, k, v, o);
    benchmark::DoNotOptimize(r.output.raw_data());
  }
  state.counters["flops"] =
      benchmark::Counter(attention_flops(1, 8, l, d, causal), benchmark::Counter::kIsIterationInvariantRate);
}

void tile_args(benchmark::internal::Benchmark* bm) {
  for (int64_t causal : {0, 1}) {
    for (int64_t d : {64, 128}) {
      for (int64_t br : {32, 64, 128}) {
        for (int64_t bc : {64, 128, 256, 512}) {
          if (causal && bc != br) continue;  // causal tiles are square (flash_tiles.h)
          bm->Args({2048, d, br, bc, causal});
        }
      }
      if (causal) bm->Args({2048, d, 256, 256, causal});
    }
  }
}
BENCHMARK(BM_FlashTiles)
    ->ArgNames({"L", "D", "Br", "Bc", "causal"})
    ->Apply(tile_args)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The yardsticks: qkv::gemm f32 (oneDNN), f64 (OpenBLAS), bf16 and f16 operands (oneDNN
// or widened, f32 C) on square matrices.
template <class AB, class C = AB>
void gemm(benchmark::State& state) {
  const int64_t n = state.range(0);
  std::vector<AB> a(static_cast<size_t>(n * n), AB(0.5f)), b(a);
  std::vector<C> c(a.size());
  qkv::GemmShape s;
  s.m = s.n = s.k = s.lda = s.ldb = s.ldc = n;
  for (auto _ : state) {
    qkv::gemm(s, C(1), a.data(), b.data(), C(0), c.data());
    benchmark::DoNotOptimize(c.data());
  }
  state.counters["flops"] =
      benchmark::Counter(2.0 * static_cast<double>(n * n * n), benchmark::Counter::kIsIterationInvariantRate);
}
void BM_Gemm(benchmark::State& state) { gemm<float>(state); }
void BM_Gemm64(benchmark::State& state) { gemm<double>(state); }
void BM_GemmBf16(benchmark::State& state) { gemm<qkv::bfloat16, float>(state); }
void BM_GemmF16(benchmark::State& state) { gemm<qkv::float16, float>(state); }
BENCHMARK(BM_Gemm)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_Gemm64)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GemmBf16)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();
BENCHMARK(BM_GemmF16)->Arg(1024)->Arg(2048)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) { return qkv::bench::run_benchmarks(argc, argv); }
