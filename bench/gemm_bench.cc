// qkv::gemm throughput, and the same products through raw oneDNN (primitive and
// memory objects made once, outside the timed loop) to show what the wrapper
// costs: the Gemm/Raw ratio should be ~1.0.
//
//   QKV_NUM_THREADS=2 build/release/gemm_bench --benchmark_min_time=0.5
//
// The "flops" counter is 2*M*N*K*batch per second (the "G/s" suffix = GFLOP/s).
#include <benchmark/benchmark.h>

#include <oneapi/dnnl/dnnl.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "bench_main.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"

namespace {

// One batched problem: the qkv arguments plus the equivalent oneDNN descriptors.
struct Problem {
  qkv::GemmShape s;
  qkv::GemmBatch batch;
  int64_t a_size, b_size, c_size;  // buffer lengths in floats
  dnnl::memory::dims a_dims, a_strides, b_dims, b_strides, c_dims, c_strides;
};

double flops(const Problem& p) {
  double count = 2.0 * static_cast<double>(p.s.m) * static_cast<double>(p.s.n) * static_cast<double>(p.s.k);
  for (int64_t d : p.batch.shape) count *= static_cast<double>(d);
  return count;
}

Problem square(int64_t n) {
  return {{false, false, n, n, n, n, n, n}, {}, n * n, n * n, n * n, {n, n}, {n, 1}, {n, n}, {n, 1}, {n, n}, {n, 1}};
}

// Attention on [BH, L, D] contiguous heads: scores = q @ k^T, out = p @ v.
constexpr int64_t kBH = 32, kL = 1024, kD = 64;

Problem attention_scores() {
  return {{false, true, kL, kL, kD, kD, kD, kL},
          {{kBH}, {kL * kD}, {kL * kD}, {kL * kL}},
          kBH * kL * kD,
          kBH * kL * kD,
          kBH * kL * kL,
          {kBH, kL, kD},
          {kL * kD, kD, 1},
          {kBH, kD, kL},
          {kL * kD, 1, kD},
          {kBH, kL, kL},
          {kL * kL, kL, 1}};
}

Problem attention_values() {
  return {{false, false, kL, kD, kL, kL, kD, kD},
          {{kBH}, {kL * kL}, {kL * kD}, {kL * kD}},
          kBH * kL * kL,
          kBH * kL * kD,
          kBH * kL * kD,
          {kBH, kL, kL},
          {kL * kL, kL, 1},
          {kBH, kL, kD},
          {kL * kD, kD, 1},
          {kBH, kL, kD},
          {kL * kD, kD, 1}};
}

// Scores with q and k stored [B, L, H, D] (B = 4, H = 8), as a model lays them out.
Problem attention_scores_blhd() {
  constexpr int64_t B = 4, H = 8;
  return {{false, true, kL, kL, kD, H * kD, H * kD, kL},
          {{B, H}, {kL * H * kD, kD}, {kL * H * kD, kD}, {H * kL * kL, kL * kL}},
          B * kL * H * kD,
          B * kL * H * kD,
          B * H * kL * kL,
          {B, H, kL, kD},
          {kL * H * kD, kD, H * kD, 1},
          {B, H, kD, kL},
          {kL * H * kD, kD, 1, H * kD},
          {B, H, kL, kL},
          {H * kL * kL, kL * kL, kL, 1}};
}

std::vector<float> filled(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 17) * 0.0625f - 0.5f;
  return v;
}

void run_qkv(benchmark::State& state, const Problem& p) {
  const std::vector<float> a = filled(p.a_size), b = filled(p.b_size);
  std::vector<float> c(static_cast<size_t>(p.c_size));
  for (auto _ : state) {
    qkv::gemm(p.s, 1.0f, a.data(), b.data(), 0.0f, c.data(), p.batch);
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["flops"] = benchmark::Counter(flops(p), benchmark::Counter::kIsIterationInvariantRate);
}

void run_raw(benchmark::State& state, const Problem& p) {
  using dnnl::memory;
  std::vector<float> a = filled(p.a_size), b = filled(p.b_size);
  std::vector<float> c(static_cast<size_t>(p.c_size));
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::desc a_md(p.a_dims, memory::data_type::f32, p.a_strides);
  const memory::desc b_md(p.b_dims, memory::data_type::f32, p.b_strides);
  const memory::desc c_md(p.c_dims, memory::data_type::f32, p.c_strides);
  const dnnl::matmul prim(dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_md, b_md, c_md), engine));
  memory ma(a_md, engine, a.data()), mb(b_md, engine, b.data()), mc(c_md, engine, c.data());
  for (auto _ : state) {
    prim.execute(stream, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
    stream.wait();
    benchmark::DoNotOptimize(c.data());
    benchmark::ClobberMemory();
  }
  state.counters["flops"] = benchmark::Counter(flops(p), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_GemmSquare(benchmark::State& state) { run_qkv(state, square(state.range(0))); }
void BM_RawSquare(benchmark::State& state) { run_raw(state, square(state.range(0))); }
BENCHMARK(BM_GemmSquare)->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->UseRealTime();
BENCHMARK(BM_RawSquare)->Arg(256)->Arg(512)->Arg(1024)->Arg(2048)->UseRealTime();

void BM_GemmAttentionScores(benchmark::State& state) { run_qkv(state, attention_scores()); }
void BM_RawAttentionScores(benchmark::State& state) { run_raw(state, attention_scores()); }
void BM_GemmAttentionValues(benchmark::State& state) { run_qkv(state, attention_values()); }
void BM_RawAttentionValues(benchmark::State& state) { run_raw(state, attention_values()); }
void BM_GemmAttentionScoresBLHD(benchmark::State& state) { run_qkv(state, attention_scores_blhd()); }
void BM_RawAttentionScoresBLHD(benchmark::State& state) { run_raw(state, attention_scores_blhd()); }
BENCHMARK(BM_GemmAttentionScores)->UseRealTime();
BENCHMARK(BM_RawAttentionScores)->UseRealTime();
BENCHMARK(BM_GemmAttentionValues)->UseRealTime();
BENCHMARK(BM_RawAttentionValues)->UseRealTime();
BENCHMARK(BM_GemmAttentionScoresBLHD)->UseRealTime();
BENCHMARK(BM_RawAttentionScoresBLHD)->UseRealTime();

// A batch oneDNN cannot take in one call (A and B both broadcast), so qkv loops
// over it: small matrices on parallel_for, large ones serially with threaded
// calls. Compare with the same work as one contiguous batched call.
Problem looped(int64_t n, int64_t count, bool contiguous) {
  Problem p = square(n);
  p.batch = {{count}, {contiguous ? n * n : 0}, {contiguous ? n * n : 0}, {n * n}};
  p.a_size = p.b_size = contiguous ? count * n * n : n * n;
  p.c_size = count * n * n;
  return p;
}

void BM_GemmLoopedBatch(benchmark::State& state) { run_qkv(state, looped(state.range(0), state.range(1), false)); }
void BM_GemmOneCallBatch(benchmark::State& state) { run_qkv(state, looped(state.range(0), state.range(1), true)); }
BENCHMARK(BM_GemmLoopedBatch)->Args({32, 512})->Args({64, 256})->Args({128, 64})->Args({256, 16})->UseRealTime();
BENCHMARK(BM_GemmOneCallBatch)->Args({32, 512})->Args({64, 256})->Args({128, 64})->Args({256, 16})->UseRealTime();

// Per-call overhead of the wrapper (checks, key, cache lookup) on a tiny product.
void BM_GemmTiny(benchmark::State& state) { run_qkv(state, square(8)); }
void BM_RawTiny(benchmark::State& state) { run_raw(state, square(8)); }
BENCHMARK(BM_GemmTiny);
BENCHMARK(BM_RawTiny);

}  // namespace

int main(int argc, char** argv) { return qkv::bench::run_benchmarks(argc, argv); }
