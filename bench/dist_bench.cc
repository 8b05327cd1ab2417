// qkv::dist under mpiexec: time per attention step of ring, Ulysses and head-parallel
// attention on P ranks, beside the compute-only time of a ring rank (the same kernel calls
// and merges on blocks already in hand, no transfers). docs/distributed.md's scale study.
//
//   mpiexec -n 2 build/release/dist_bench --benchmark_format=json > dist_2.json
//
// Every rank runs the same fixed number of iterations (Google Benchmark would pick counts per
// process and the collectives would then wait on each other); each iteration starts at a
// barrier and its time is the slowest rank's (manual time). Only rank 0 reports. Heads: each
// rank's share of the heads plus the all-reduce tensor parallelism adds. Shapes:
// B = 1, H = 8, D = 64, f32, L = 4096 and 16384 (the targets' L >= 16384); counters: total
// GFLOP/s of the whole attention (4 L^2 D H flops, half for causal), MB sent per rank.
#include <benchmark/benchmark.h>

#include <chrono>
#include <string>
#include <vector>

#include "bench_main.h"
#include "qkv/dist/ring_attention.h"
#include "qkv/dist/ulysses_attention.h"

namespace qkv::bench {
namespace {

constexpr int64_t kB = 1, kH = 8, kD = 64;

dist::Communicator& world() {
  static dist::Communicator c = dist::Communicator::world();
  return c;
}

// Seconds of fn() on the slowest rank, all ranks starting together.
template <class Fn>
double timed(Fn&& fn) {
  world().barrier();
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, world().handle());
  return s;
}

struct Shards {
  Tensor q, k, v;
  Shards(int64_t l, dist::SequenceLayout layout) {
    const int r = world().rank(), p = world().size();
    q = dist::shard_sequence(Tensor::randn({kB, kH, l, kD}, 1), -2, r, p, layout).contiguous();
    k = dist::shard_sequence(Tensor::randn({kB, kH, l, kD}, 2), -2, r, p, layout).contiguous();
    v = dist::shard_sequence(Tensor::randn({kB, kH, l, kD}, 3), -2, r, p, layout).contiguous();
  }
};

void report(benchmark::State& state, int64_t l, bool causal, double mb_sent) {
  const double flops = 4.0 * double(l) * double(l) * kD * kH * kB * (causal ? 0.5 : 1.0);
  state.counters["GFLOP/s"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ranks"] = world().size();
  state.counters["MB_sent_per_rank"] = mb_sent;
}

// K and V blocks of every other rank pass through each rank once.
double ring_mb(int64_t l) { return 2.0 * kB * kH * double(l) / world().size() * kD * 4 * (world().size() - 1) / 1e6; }
// q, k, v and the output each leave (P - 1) / P of a rank's shard.
double ulysses_mb(int64_t l) {
  const double p = world().size();
  return 4.0 * kB * kH * double(l) / p * kD * 4 * (p - 1) / p / 1e6;
}

void compute_only(const Shards& s);  // below: this rank's ring work without transfers

void BM_Ring(benchmark::State& state) {
  const int64_t l = state.range(0);
  const bool causal = state.range(1) != 0;
  const dist::SequenceLayout layout = causal ? dist::SequenceLayout::zigzag : dist::SequenceLayout::contiguous;
  const Shards s(l, layout);
  dist::RingAttentionOptions o;
  o.is_causal = causal;
  o.layout = layout;
  // Non-causal: every iteration also times the same rank's compute alone (compute_only below),
  // right after the ring under the same load, so their ratio holds on a busy machine too.
  double ring_s = 0, compute_s = 0;
  for (auto _ : state) {
    const double t = timed([&] { (void)dist::ring_attention(s.q, s.k, s.v, world(), o); });
    state.SetIterationTime(t);
    ring_s += t;
    if (!causal) compute_s += timed([&] { compute_only(s); });
  }
  report(state, l, causal, ring_mb(l));
  if (!causal) state.counters["ring_over_compute_only"] = ring_s / compute_s;
}

// What a ring rank computes, without transfers: its queries against P blocks of its own
// size (the K/V shard it holds stands in for each), each folded in by logsumexp, through
// ring_attention on a one-rank communicator (one kernel call and one merge per block).
void compute_only(const Shards& s) {
  static dist::Communicator self = world().split(world().rank(), 0);
  for (int b = 0; b < world().size(); ++b) (void)dist::ring_attention(s.q, s.k, s.v, self);
}

void BM_RingComputeOnly(benchmark::State& state) {
  const int64_t l = state.range(0);
  const Shards s(l, dist::SequenceLayout::contiguous);
  for (auto _ : state) state.SetIterationTime(timed([&] { compute_only(s); }));
  report(state, l, false, 0.0);
}

void BM_Ulysses(benchmark::State& state) {
  const int64_t l = state.range(0);
  const bool causal = state.range(1) != 0;
  const Shards s(l, dist::SequenceLayout::contiguous);
  dist::UlyssesAttentionOptions o;
  o.is_causal = causal;
  for (auto _ : state) state.SetIterationTime(timed([&] { (void)dist::ulysses_attention(s.q, s.k, s.v, world(), o); }));
  report(state, l, causal, ulysses_mb(l));
}

// Tensor parallelism's attention: each rank its H / P heads over the whole sequence, then
// the all-reduce of the [L, H D] output that the row-parallel output projection needs.
void BM_Heads(benchmark::State& state) {
  const int64_t l = state.range(0);
  const bool causal = state.range(1) != 0;
  const int64_t heads = dist::split_sizes(kH, world().size())[static_cast<size_t>(world().rank())];
  const Tensor q = Tensor::randn({kB, heads, l, kD}, 1), k = Tensor::randn({kB, heads, l, kD}, 2),
               v = Tensor::randn({kB, heads, l, kD}, 3);
  const Tensor partial = Tensor::randn({l, kB, kH * kD}, 4);
  AttentionOptions o;
  o.is_causal = causal;
  for (auto _ : state) {
    state.SetIterationTime(timed([&] {
      if (heads > 0) (void)scaled_dot_product_attention(q, k, v, o);
      world().all_reduce_sum(partial);
    }));
  }
  const double p = world().size();
  report(state, l, causal, 2.0 * (p - 1) / p * double(partial.nbytes()) / 1e6);  // ring all-reduce
}

class Quiet : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

void shapes(benchmark::internal::Benchmark* b) {
  for (int64_t l : {4096, 16384}) b->Args({l, 0})->Args({l, 1});
  b->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);
}

BENCHMARK(BM_Ring)->Apply(shapes);
BENCHMARK(BM_Ulysses)->Apply(shapes);
BENCHMARK(BM_Heads)->Apply(shapes);
BENCHMARK(BM_RingComputeOnly)->Arg(4096)->Arg(16384)->UseManualTime()->Iterations(3)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace qkv::bench

int main(int argc, char** argv) {
  qkv::dist::MpiSession mpi(&argc, &argv);
  qkv::bench::add_machine_context();  // cpu_isa: the flags bench/peers/dist_model.py prints
  benchmark::AddCustomContext("ranks", std::to_string(qkv::bench::world().size()));
  benchmark::Initialize(&argc, argv);
  if (qkv::bench::world().rank() == 0) {
    benchmark::RunSpecifiedBenchmarks();
  } else {
    qkv::bench::Quiet quiet;  // the other ranks run the same iterations, rank 0 reports
    benchmark::RunSpecifiedBenchmarks(&quiet);
  }
  benchmark::Shutdown();
  return 0;
}
