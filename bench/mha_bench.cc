// qkv::nn::MultiheadAttention (PyTorch flavour) end to end: packed in-projection (one
// GEMM), fused attention, head merge, output projection; f32, eval, self-attention with
// batch_first and need_weights=false (the call PyTorch's fast path serves).
//
//   QKV_NUM_THREADS=2 build/release/mha_bench --benchmark_min_time=2
//
// Peers in the same invocation: bench/peers/mha_peers.py (qkv.nn vs torch, same threads).
// "flops" counts the three products: 2*B*L*E*3E + 4*B*L*L*E + 2*B*L*E*E.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <string>

#include "bench_main.h"
#include "qkv/attention.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/mha.h"
#include "qkv/parallel.h"

namespace {

double mha_flops(int64_t b, int64_t l, int64_t e) {
  const double bl = static_cast<double>(b * l), ed = static_cast<double>(e);
  return 2.0 * bl * ed * 3.0 * ed + 4.0 * bl * static_cast<double>(l) * ed + 2.0 * bl * ed * ed;
}

// state.range: B, L, E, H.
void BM_MultiheadAttention(benchmark::State& state) {
  const int64_t b = state.range(0), l = state.range(1), e = state.range(2), h = state.range(3);
  qkv::nn::MultiheadAttentionConfig c;
  c.embed_dim = e;
  c.num_heads = h;
  c.batch_first = true;
  const qkv::nn::MultiheadAttention mha(c, 1);
  const qkv::Tensor x = qkv::Tensor::randn({b, l, e}, 2);  // [B, L, E]
  qkv::nn::MultiheadAttentionOptions o;
  o.need_weights = false;
  for (auto _ : state) {
    qkv::nn::MultiheadAttentionResult r = mha.forward(x, x, x, o);
    benchmark::DoNotOptimize(r.output.raw_data());
  }
  state.counters["flops"] = benchmark::Counter(mha_flops(b, l, e), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MultiheadAttention)
    ->ArgNames({"B", "L", "E", "H"})
    ->Args({8, 512, 768, 12})
    ->Args({1, 4096, 512, 8})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// The parts of the same call, to see where the time goes (state.range: B, L, E, H, part):
// 0 = in-projection GEMM [B*L, E] x [E, 3E] + bias, 1 = attention on the strided head views,
// 2 = head merge copy [B, H, L, D] -> [B, L, E], 3 = output projection.
void BM_MultiheadAttentionParts(benchmark::State& state) {
  const int64_t b = state.range(0), l = state.range(1), e = state.range(2), h = state.range(3);
  const int64_t part = state.range(4);
  const qkv::nn::Linear in = qkv::nn::Linear::torch(qkv::Tensor::randn({3 * e, e}, 1), qkv::Tensor::randn({3 * e}, 2));
  const qkv::nn::Linear out = qkv::nn::Linear::torch(qkv::Tensor::randn({e, e}, 3), qkv::Tensor::randn({e}, 4));
  const qkv::Tensor x = qkv::Tensor::randn({b, l, e}, 5);
  const qkv::nn::Linear in_t = qkv::nn::Linear::keras(in.to_keras_layout(), in.bias());
  const qkv::nn::Linear in_nb = qkv::nn::Linear::torch(in.to_torch_layout(), std::nullopt);
  const qkv::Tensor all = in.forward(x).view({b, l, 3, h, e / h});                 // [B, L, 3, H, D]
  auto heads = [&](int64_t i) { return all.select(2, i).permute({0, 2, 1, 3}); };  // [B, H, L, D]
  const qkv::Tensor o = qkv::scaled_dot_product_attention(heads(0), heads(1), heads(2)).output;
  for (auto _ : state) {
    qkv::Tensor r;
    if (part == 0) r = in.forward(x);
    if (part == 1) r = qkv::scaled_dot_product_attention(heads(0), heads(1), heads(2)).output;
    if (part == 2) r = o.permute({0, 2, 1, 3}).reshape({b, l, e});
    if (part == 3) r = out.forward(x);
    if (part == 4) r = in_t.forward(x);
    if (part == 5) r = in_nb.forward(x);
    benchmark::DoNotOptimize(r.raw_data());
  }
}
BENCHMARK(BM_MultiheadAttentionParts)
    ->ArgNames({"B", "L", "E", "H", "part"})
    ->ArgsProduct({{8}, {512}, {768}, {12}, {0, 1, 2, 3, 4, 5}})
    ->ArgsProduct({{1}, {4096}, {512}, {8}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) { return qkv::bench::run_benchmarks(argc, argv); }
