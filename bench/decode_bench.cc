// One decode step (qkv::decode_attention, Lq = 1) against a KV cache: time and the bandwidth
// it achieves (bytes of K and V read per step / time), beside memcpy's on the same machine.
// Hq = 32, Hk = 8, D = 128 (a Llama-style GQA layer), B = 1 and 8, cache f32, bf16, f16 or int8.
//
//   QKV_NUM_THREADS=2 build/release/decode_bench --benchmark_min_time=0.5
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "bench_main.h"
#include "qkv/kv_cache.h"
#include "qkv/parallel.h"

namespace {

constexpr int64_t kHq = 32, kHk = 8, kDim = 128;

// state.range: cache length, batch, dtype (0 f32, 1 bf16, 2 bf16 with matmul_precision medium:
// bf16 GEMMs on the cache in place where the CPU has them, 3 int8, 4 f16).
void BM_DecodeStep(benchmark::State& state) {
  const int64_t len = state.range(0), b = state.range(1);
  const qkv::DType dtypes[] = {qkv::DType::f32, qkv::DType::bf16, qkv::DType::bf16, qkv::DType::i8, qkv::DType::f16};
  const qkv::DType dtype = dtypes[state.range(2)];
  qkv::DecodeOptions o;
  if (state.range(2) == 2) o.matmul_precision = qkv::MatmulPrecision::medium;
  qkv::KVCache cache({b, kHk, kDim, len, kDim, dtype});
  // filled with one random slice of 4096 positions, appended again and again: the random tensors
  // stay small, and B = 8 at 32k keys no longer spends a minute in randn before it runs
  const int64_t step = std::min<int64_t>(4096, len);
  const qkv::Tensor k = qkv::Tensor::randn({b, kHk, step, kDim}, 0), v = qkv::Tensor::randn({b, kHk, step, kDim}, 1);
  for (int64_t at = 0; at < len; at += step) cache.append(k, v);
  const qkv::Tensor q = qkv::Tensor::randn({b, kHq, 1, kDim}, 7);  // [B, Hq, 1, D]
  for (auto _ : state) {
    qkv::AttentionResult r = qkv::decode_attention(q, cache, o);
    benchmark::DoNotOptimize(r.output.raw_data());
  }
  // int8: a bfloat16 scale per 16 channels besides the bytes (qkv/kv_cache.h), 144 bytes a row of 128
  const double row = dtype == qkv::DType::i8 ? static_cast<double>(kDim + 2 * (kDim / qkv::KVCache::kInt8Group))
                                             : static_cast<double>(kDim * static_cast<int64_t>(qkv::itemsize(dtype)));
  const double bytes = 2.0 * static_cast<double>(b * kHk * len) * row;
  state.counters["bytes"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeStep)
    ->ArgNames({"len", "B", "cache"})
    ->ArgsProduct({{1024, 8192, 32768, 131072}, {1}, {0, 1, 2, 3, 4}})
    ->ArgsProduct({{1024, 8192, 16384, 32768}, {8}, {0, 1, 2, 3, 4}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Layouts (f32, Lq = 1): 0 contiguous, 1 paged (16-position pages), 2 paged (256), 3 a window of
// 4096 keys in a ring of 4096 slots (the step reads 4096 keys whatever the length). The pages of
// the B sequences interleave (filled slice by slice, every sequence in turn).
void BM_DecodeLayout(benchmark::State& state) {
  const int64_t len = state.range(0), b = state.range(1), layout = state.range(2), window = 4096;
  qkv::KVCacheConfig c{b, kHk, kDim, len, kDim, qkv::DType::f32};
  if (layout == 1 || layout == 2) c.page_size = layout == 1 ? 16 : 256;
  if (layout == 3) c.window = window, c.capacity = window;
  qkv::KVCache cache(c);
  for (int64_t at = 0; at < len; at += 4096) {
    const int64_t n = std::min<int64_t>(4096, len - at);
    cache.append(qkv::Tensor::randn({b, kHk, n, kDim}, at), qkv::Tensor::randn({b, kHk, n, kDim}, at + 1));
  }
  const qkv::Tensor q = qkv::Tensor::randn({b, kHq, 1, kDim}, 7);  // [B, Hq, 1, D]
  for (auto _ : state) {
    qkv::AttentionResult r = qkv::decode_attention(q, cache);
    benchmark::DoNotOptimize(r.output.raw_data());
  }
  const int64_t keys = layout == 3 ? std::min(len, window) : len;
  const double bytes = 2.0 * static_cast<double>(b * kHk * keys * kDim) * 4.0;
  state.counters["bytes"] = benchmark::Counter(bytes, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_DecodeLayout)
    ->ArgNames({"len", "B", "layout"})
    ->ArgsProduct({{8192, 32768}, {1}, {0, 1, 2, 3}})
    ->ArgsProduct({{8192}, {8}, {0, 1, 2, 3}})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// memcpy of 256 MB split over the threads (parallel_for), counting the bytes read, as the
// decode step counts the cache bytes it reads.
void BM_Memcpy(benchmark::State& state) {
  const int64_t n = int64_t{256} << 20, parts = 64;
  std::vector<char> a(static_cast<size_t>(n), 1), b(static_cast<size_t>(n), 0);
  for (auto _ : state) {
    qkv::parallel_for(0, parts, 1, [&](int64_t p0, int64_t p1) {
      std::memcpy(b.data() + p0 * (n / parts), a.data() + p0 * (n / parts),
                  static_cast<size_t>((p1 - p0) * (n / parts)));
    });
    benchmark::DoNotOptimize(b.data());
  }
  state.counters["bytes"] = benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Memcpy)->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace

int main(int argc, char** argv) { return qkv::bench::run_benchmarks(argc, argv); }
