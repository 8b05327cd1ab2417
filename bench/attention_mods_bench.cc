// Attention with mask modifiers (qkv/attention_mods.h): work in proportion to the tiles the
// mask leaves. Each case runs the fused kernel at B = 1, H = 8, D = 64, f32 with
//   full     no mask (the yardstick: its GFLOP/s are the kernel's rate)
//   window   a causal sliding window of W keys (mods: left W - 1, right 0)
//   dense    the same window as a dense bool attn_mask [L, L] (every tile computed)
//   bigbird  BigBird blocks of 64, one block each side, 2 random blocks, first/last global
// "flops" counts 4 * H * D * (allowed (query, key) pairs), so a kernel that skips the empty
// tiles and wastes little in partial ones keeps full attention's GFLOP/s; "pairs" is the
// allowed fraction of the L x L scores.
//
//   QKV_NUM_THREADS=2 build/release/attention_mods_bench --benchmark_min_time=1
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "bench_main.h"
#include "qkv/attention.h"

namespace {

constexpr int64_t kHeads = 8, kDim = 64;

enum Kind : int64_t { kFull = 0, kWindow = 1, kDense = 2, kBigBird = 3 };

// Allowed pairs of a causal window of w keys over L queries.
double window_pairs(int64_t l, int64_t w) {
  double n = 0;
  for (int64_t i = 0; i < l; ++i) n += static_cast<double>(std::min(i + 1, w));
  return n;
}

qkv::Tensor window_mask(int64_t l, int64_t w) {  // [L, L] bool, True = take part
  std::vector<uint8_t> m(static_cast<size_t>(l * l), 0);
  for (int64_t i = 0; i < l; ++i) {
    for (int64_t j = std::max<int64_t>(0, i - w + 1); j <= i; ++j) m[static_cast<size_t>(i * l + j)] = 1;
  }
  qkv::Tensor t = qkv::Tensor::empty({l, l}, qkv::DType::b8);
  std::copy(m.begin(), m.end(), t.data<bool>());
  return t;
}

// Allowed pairs of AttentionMods::bigbird(u, 1, 2, 0, L) for L a multiple of u: block pairs
// within one block of the diagonal, in the first or last block row or column (global), or
// among the query block's random key blocks.
double bigbird_pairs(int64_t l, int64_t u) {
  const int64_t blocks = l / u;
  double n = 0;
  for (int64_t qb = 0; qb < blocks; ++qb) {
    const std::vector<int64_t> random = qkv::random_key_blocks(0, qb, blocks, 2);
    for (int64_t kb = 0; kb < blocks; ++kb) {
      const bool global = qb == 0 || qb == blocks - 1 || kb == 0 || kb == blocks - 1;
      const bool near = kb >= qb - 1 && kb <= qb + 1;
      const bool drawn = std::find(random.begin(), random.end(), kb) != random.end();
      n += (global || near || drawn) ? static_cast<double>(u * u) : 0.0;
    }
  }
  return n;
}

// state.range: L, W (window / block size), kind.
void BM_Mods(benchmark::State& state) {
  const int64_t l = state.range(0), w = state.range(1), kind = state.range(2);
  const qkv::Tensor q = qkv::Tensor::randn({1, kHeads, l, kDim}, 1);  // [B, H, L, D]
  const qkv::Tensor k = qkv::Tensor::randn({1, kHeads, l, kDim}, 2);
  const qkv::Tensor v = qkv::Tensor::randn({1, kHeads, l, kDim}, 3);
  qkv::AttentionOptions o;
  double pairs = static_cast<double>(l) * static_cast<double>(l);
  if (kind == kWindow) o.mods = qkv::AttentionMods::sliding_window(w - 1, 0);
  if (kind == kDense) o.attn_mask = window_mask(l, w);
  if (kind == kWindow || kind == kDense) pairs = window_pairs(l, w);
  if (kind == kBigBird) {
    o.mods = qkv::AttentionMods::bigbird(w, 1, 2, 0, l);
    pairs = bigbird_pairs(l, w);
  }
  for (auto _ : state) {
    qkv::AttentionResult r = qkv::scaled_dot_product_attention(q, k, v, o);
    benchmark::DoNotOptimize(r.output.raw_data());
  }
  state.counters["flops"] =
      benchmark::Counter(4.0 * kHeads * kDim * pairs, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["pairs"] = pairs / (static_cast<double>(l) * static_cast<double>(l));
}
BENCHMARK(BM_Mods)
    ->ArgNames({"L", "W", "kind"})
    ->Args({4096, 512, kFull})
    ->Args({4096, 512, kWindow})
    ->Args({4096, 512, kDense})
    ->Args({4096, 64, kBigBird})
    ->Args({16384, 512, kFull})  // the yardstick at the length of the window's and BigBird's figures
    ->Args({16384, 512, kWindow})
    ->Args({16384, 512, kDense})
    ->Args({16384, 64, kBigBird})
    ->Args({65536, 512, kWindow})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

int main(int argc, char** argv) { return qkv::bench::run_benchmarks(argc, argv); }
