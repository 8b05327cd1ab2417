// Tensor::contiguous() of a permuted float32 tensor (attention's split-heads copy:
// [8, 1024, 12, 64] viewed as [8, 12, 1024, 64], 24 MiB) against memcpy of the same
// bytes and einops::materialize of the same view, in the same program. Every
// iteration produces a new contiguous result. "bytes" counts bytes read + written
// (2 x tensor size); "vs_memcpy" is the copy's rate over memcpy's, both timed in the
// same repetition (memcpy runs as many times right after the copy's loop), so it
// compares like with like on a shared machine. Arg: thread count (1, every core).
//
//   nice -n 0 build/release/copy_bench --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "bench_main.h"
#include "qkv/einops.h"
#include "qkv/parallel.h"
#include "qkv/tensor.h"

namespace {

using Clock = std::chrono::steady_clock;

const qkv::Shape kShape = {8, 1024, 12, 64};             // [B, L, H, D]
const std::vector<int64_t> kPermutation = {0, 2, 1, 3};  // -> [B, H, L, D]

// Seconds for `iterations` memcpys of src's bytes into a buffer allocated (mapped,
// huge-page advised) once, split in equal chunks over the current thread count.
double memcpy_seconds(const qkv::Tensor& src, int64_t iterations) {
  const auto n = static_cast<int64_t>(src.nbytes());
  const int threads = qkv::get_num_threads();
  void* buffer = std::aligned_alloc(size_t{2} << 20, static_cast<size_t>(n));
  if (buffer == nullptr) std::abort();
  (void)madvise(buffer, static_cast<size_t>(n), MADV_HUGEPAGE);
  std::memset(buffer, 0, static_cast<size_t>(n));
  auto* dst = static_cast<char*>(buffer);
  const auto* s = static_cast<const char*>(src.raw_data());
  const auto start = Clock::now();
  for (int64_t i = 0; i < iterations; ++i) {
    qkv::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
      const int64_t lo = n * b / threads, hi = n * e / threads;
      std::memcpy(dst + lo, s + lo, static_cast<size_t>(hi - lo));
    });
    benchmark::DoNotOptimize(buffer);
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  std::free(buffer);
  return seconds;
}

void set_rates(benchmark::State& state, int64_t tensor_bytes, double copy_seconds, double memcpy_s) {
  const auto iterations = static_cast<double>(state.iterations());
  state.counters["bytes"] = benchmark::Counter(2.0 * static_cast<double>(tensor_bytes) * iterations,
                                               benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
  state.counters["vs_memcpy"] = memcpy_s / copy_seconds;
}

// One benchmark: `copy` turns the permuted view into a new contiguous tensor.
void run_copy(benchmark::State& state, const std::function<qkv::Tensor(const qkv::Tensor&)>& copy) {
  const int before = qkv::get_num_threads();
  qkv::set_num_threads(static_cast<int>(state.range(0)));
  const qkv::Tensor x = qkv::bench::huge_page_uniform(kShape).permute(kPermutation);  // [B, H, L, D] view
  const auto start = Clock::now();
  for (auto _ : state) {
    qkv::Tensor y = copy(x);
    benchmark::DoNotOptimize(y.raw_data());
    benchmark::ClobberMemory();
  }
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  set_rates(state, static_cast<int64_t>(x.nbytes()), seconds, memcpy_seconds(x, state.iterations()));
  qkv::set_num_threads(before);
}

void BM_Contiguous(benchmark::State& state) {
  run_copy(state, [](const qkv::Tensor& x) { return x.contiguous(); });
}

// The einops copy of the same view, the speed contiguous() is expected to reach.
void BM_EinopsMaterialize(benchmark::State& state) {
  run_copy(state, [](const qkv::Tensor& x) { return qkv::einops::materialize(x); });
}

void thread_args(benchmark::internal::Benchmark* b) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  b->Arg(1);
  if (cores > 1) b->Arg(cores);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

BENCHMARK(BM_Contiguous)->Apply(thread_args);
BENCHMARK(BM_EinopsMaterialize)->Apply(thread_args);

}  // namespace

// The context's simd_target (bench_main.h) is the ISA the copy kernels dispatch to.
int main(int argc, char** argv) { return qkv::bench::run_benchmarks(argc, argv); }
