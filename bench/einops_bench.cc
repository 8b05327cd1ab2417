// einops rearrange copies of >= 64 MB float32 tensors (seed patterns, 4-D and 5-D
// permutations) against memcpy of the same bytes, measured in the same program.
// Each iteration produces a new contiguous result: rearrange, then materialize when
// rearrange returned a view. "bytes" counts bytes read + written (2 x tensor size).
// Arg: thread count (1, and every core).
//
//   build/release/einops_bench --benchmark_min_time=0.5
//   python bench/peers/einops_numpy.py build/release/einops_bench   # + numpy, one table (docs/einops.md)
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "bench_main.h"
#include "qkv/einops.h"
#include "qkv/parallel.h"

namespace {

struct Case {
  const char* name;
  const char* pattern;
  qkv::Shape shape;
  qkv::einops::AxisLengths lengths;
};

// Keep in step with bench/peers/einops_numpy.py.
const std::vector<Case>& cases() {
  static const std::vector<Case> c = {
      {"seed000_merge_heads", "b h t d -> b t (h d)", {8, 16, 2048, 64}, {}},
      {"seed000_split_heads", "b t (d k h) -> k b h t d", {6, 2048, 1536}, {{"k", 3}, {"h", 8}}},
      {"seed004_to_batch_heads", "batch seq heads eachhead -> (batch heads) seq eachhead", {8, 2048, 16, 64}, {}},
      {"seed004_from_batch_heads",
       "(batch heads) numq eachhead -> batch numq (heads eachhead)",
       {128, 2048, 64},
       {{"batch", 8}}},
      {"4d_reverse", "a b c d -> d c b a", {64, 64, 64, 64}, {}},
      {"4d_swap_middle", "a b c d -> a c b d", {16, 256, 64, 64}, {}},
      {"4d_last_to_front", "a b c d -> d a b c", {8, 64, 512, 64}, {}},
      {"5d_reverse", "a b c d e -> e d c b a", {16, 16, 16, 16, 256}, {}},
      {"5d_mixed", "a b c d e -> a c e b d", {16, 32, 16, 64, 32}, {}},
  };
  return c;
}

void set_rate(benchmark::State& state, int64_t bytes_per_iteration) {
  state.counters["bytes"] =
      benchmark::Counter(static_cast<double>(bytes_per_iteration) * static_cast<double>(state.iterations()),
                         benchmark::Counter::kIsRate, benchmark::Counter::kIs1000);
}

void BM_Rearrange(benchmark::State& state, const Case& c) {
  const int before = qkv::get_num_threads();
  qkv::set_num_threads(static_cast<int>(state.range(0)));
  const qkv::Tensor x = qkv::bench::huge_page_uniform(c.shape);
  for (auto _ : state) {
    qkv::Tensor y = qkv::einops::materialize(qkv::einops::rearrange(x, c.pattern, c.lengths));
    benchmark::DoNotOptimize(y.raw_data());
    benchmark::ClobberMemory();
  }
  set_rate(state, 2 * static_cast<int64_t>(x.nbytes()));
  qkv::set_num_threads(before);
}

// memcpy of 64 MB into a buffer allocated once (mapped, huge-page advised): the copy
// bandwidth of the machine, on one thread or split in equal chunks over parallel_for.
// (rearrange's results come from kernels::empty_pooled, which reuses freed buffers
// of the same size, so its iterations also write into mapped memory.)
void BM_Memcpy(benchmark::State& state) {
  const int before = qkv::get_num_threads();
  const int threads = static_cast<int>(state.range(0));
  qkv::set_num_threads(threads);
  const qkv::Tensor x = qkv::bench::huge_page_uniform({int64_t{1} << 24});
  const auto n = static_cast<int64_t>(x.nbytes());
  void* buffer = std::aligned_alloc(size_t{2} << 20, static_cast<size_t>(n));
  (void)madvise(buffer, static_cast<size_t>(n), MADV_HUGEPAGE);
  std::memset(buffer, 0, static_cast<size_t>(n));
  auto* dst = static_cast<char*>(buffer);
  const auto* src = static_cast<const char*>(x.raw_data());
  for (auto _ : state) {
    qkv::parallel_for(0, threads, 1, [&](int64_t b, int64_t e) {
      const int64_t lo = n * b / threads, hi = n * e / threads;
      std::memcpy(dst + lo, src + lo, static_cast<size_t>(hi - lo));
    });
    benchmark::DoNotOptimize(buffer);
    benchmark::ClobberMemory();
  }
  std::free(buffer);
  set_rate(state, 2 * n);
  qkv::set_num_threads(before);
}

void thread_args(benchmark::internal::Benchmark* b) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  b->Arg(1);
  if (cores > 1) b->Arg(cores);
  b->Unit(benchmark::kMillisecond)->UseRealTime();
}

const bool registered = [] {
  benchmark::RegisterBenchmark("BM_Memcpy", BM_Memcpy)->Apply(thread_args);
  for (const Case& c : cases()) {
    benchmark::RegisterBenchmark((std::string("BM_Rearrange/") + c.name).c_str(), [&c](benchmark::State& s) {
      BM_Rearrange(s, c);
    })->Apply(thread_args);
  }
  return true;
}();

}  // namespace

int main(int argc, char** argv) { return qkv::bench::run_benchmarks(argc, argv); }
