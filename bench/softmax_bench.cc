// Softmax row kernels: Highway (qkv::kernels::softmax_rows, best SIMD target of
// this CPU) against the same three passes written as a plain loop over std::exp.
// Single-threaded, in place, rows x cols floats; bytes/s counts the tensor once
// per iteration (rows * cols * 4 bytes).
//
//   build/release/softmax_bench --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "bench_main.h"
#include "qkv/parallel.h"
#include "qkv/softmax.h"
#include "qkv/tensor.h"

namespace {

std::vector<float> inputs(int64_t n) {
  std::vector<float> v(static_cast<size_t>(n));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((i * 37) % 101) * 0.1f - 5.0f;
  return v;
}

// The baseline: what one would write without SIMD (the compiler may still
// vectorise max and the scaling, but not std::exp).
void softmax_rows_std(float* x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < cols; ++c) m = std::max(m, row[c]);
    float sum = 0.0f;
    for (int64_t c = 0; c < cols; ++c) {
      row[c] = std::exp(row[c] - m);
      sum += row[c];
    }
    const float inv = 1.0f / sum;
    for (int64_t c = 0; c < cols; ++c) row[c] *= inv;
  }
}

void set_bytes(benchmark::State& state, int64_t elements) {
  state.SetBytesProcessed(state.iterations() * elements * static_cast<int64_t>(sizeof(float)));
}

// Softmax of probabilities stays in [0, 1], so repeating it in place keeps the
// inputs (and the work) alike from one iteration to the next.
void BM_SoftmaxRowsHighway(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  std::vector<float> x = inputs(rows * cols);
  for (auto _ : state) {
    qkv::kernels::softmax_rows(x.data(), rows, cols, cols);
    benchmark::ClobberMemory();
  }
  set_bytes(state, rows * cols);
}

void BM_SoftmaxRowsStdExp(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  std::vector<float> x = inputs(rows * cols);
  for (auto _ : state) {
    softmax_rows_std(x.data(), rows, cols);
    benchmark::ClobberMemory();
  }
  set_bytes(state, rows * cols);
}

void shapes(benchmark::internal::Benchmark* b) {
  b->Args({4096, 64})->Args({1024, 1000})->Args({1024, 1024})->Args({256, 4096})->Args({16, 65536});
}
BENCHMARK(BM_SoftmaxRowsHighway)->Apply(shapes);
BENCHMARK(BM_SoftmaxRowsStdExp)->Apply(shapes);

// exp alone; each iteration copies fresh inputs first (in both variants), since
// exp in place would run away to +inf.
void BM_ExpHighway(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<float> src = inputs(n);
  std::vector<float> x(src.size());
  for (auto _ : state) {
    std::copy(src.begin(), src.end(), x.begin());
    qkv::kernels::exp_inplace(x.data(), n);
    benchmark::ClobberMemory();
  }
  set_bytes(state, n);
}

void BM_ExpStd(benchmark::State& state) {
  const int64_t n = state.range(0);
  const std::vector<float> src = inputs(n);
  std::vector<float> x(src.size());
  for (auto _ : state) {
    std::copy(src.begin(), src.end(), x.begin());
    for (float& v : x) v = std::exp(v);
    benchmark::ClobberMemory();
  }
  set_bytes(state, n);
}
BENCHMARK(BM_ExpHighway)->Arg(4096)->Arg(1 << 20);
BENCHMARK(BM_ExpStd)->Arg(4096)->Arg(1 << 20);

// The online-softmax step of fused attention on one score tile, [128, 512] floats (the
// f32 forward's tile, in L2): x = exp(x - shift) row by row with the row sums, by
// exp_shift_sum (Highway's Exp) and by exp_shift_sum_fast (attention's polynomial), the
// inputs refreshed each iteration in both.
template <bool kFast>
void BM_ExpShiftSumTile(benchmark::State& state) {
  constexpr int64_t kRows = 128, kCols = 512;
  const std::vector<float> src = inputs(kRows * kCols);  // in [-5, 5]: shift 5 keeps x - shift <= 0
  std::vector<float> x(src.size());
  for (auto _ : state) {
    std::copy(src.begin(), src.end(), x.begin());
    float total = 0.0f;
    for (int64_t r = 0; r < kRows; ++r) {
      float* row = x.data() + r * kCols;
      total +=
          kFast ? qkv::kernels::exp_shift_sum_fast(row, kCols, 5.0f) : qkv::kernels::exp_shift_sum(row, kCols, 5.0f);
    }
    benchmark::DoNotOptimize(total);
  }
  set_bytes(state, kRows * kCols);
}
BENCHMARK(BM_ExpShiftSumTile<false>)->Name("BM_ExpShiftSumTile/highway");
BENCHMARK(BM_ExpShiftSumTile<true>)->Name("BM_ExpShiftSumTile/fast");

// The tensor op: copy, rows on get_num_threads() threads, f32 [rows, cols].
void BM_SoftmaxTensor(benchmark::State& state) {
  const int64_t rows = state.range(0), cols = state.range(1);
  const qkv::Tensor x = qkv::Tensor::randn({rows, cols}, 1);
  for (auto _ : state) benchmark::DoNotOptimize(qkv::softmax(x).raw_data());
  set_bytes(state, rows * cols);
}
BENCHMARK(BM_SoftmaxTensor)->Args({1024, 1024})->Args({8192, 1024})->UseRealTime();

}  // namespace

int main(int argc, char** argv) { return qkv::bench::run_benchmarks(argc, argv); }
