// qkv::einsum throughput on the seed equations and attention-shaped contractions
// (B=8, H=12, L=512, D=64, E=768), beside qkv::gemm running the same GEMM on
// preallocated operands: "einsum/<case>" vs "gemm/<case>" gives einsum's overhead
// (planning, allocation of the result) where the contraction is one GEMM.
//
//   QKV_NUM_THREADS=2 build/release/einsum_bench --benchmark_min_time=0.5
//   /work/fixenv/bin/python bench/peers/einsum_peers.py build/release/einsum_bench   # + numpy, torch
//
// "flops" (GFLOP/s) = opt_einsum's flop count of the path (2 per multiply-add for
// pairwise contractions). "of_gemm" on einsum cases that are one GEMM: qkv::gemm's
// best time for that GEMM, measured right after the einsum loop, over einsum's mean
// time per call (1.0 = einsum adds nothing; target >= 0.8).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "bench_main.h"
#include "qkv/einsum.h"
#include "qkv/gemm.h"

namespace {

struct Case {
  const char* name;
  const char* equation;
  std::vector<qkv::Shape> shapes;
  bool one_gemm;        // the contraction is exactly one (batched) GEMM
  qkv::GemmShape gemm;  // that GEMM on contiguous operands of `shapes`
  qkv::GemmBatch batch;
  qkv::DType dtype = qkv::DType::f32;  // cases named "f64_..." run in float64
};

constexpr int64_t B = 8, H = 12, L = 512, D = 64, E = 768;

qkv::GemmShape gs(bool ta, bool tb, int64_t m, int64_t n, int64_t k, int64_t lda, int64_t ldb, int64_t ldc) {
  qkv::GemmShape s;
  s.trans_a = ta, s.trans_b = tb, s.m = m, s.n = n, s.k = k, s.lda = lda, s.ldb = ldb, s.ldc = ldc;
  return s;
}

// Keep the names in step with bench/peers/einsum_peers.py.
std::vector<Case> cases() {
  // A table, one case per line:
  // clang-format off
  return {
      {"scores_bhid_bhjd", "b h i d, b h j d -> b h i j", {{B, H, L, D}, {B, H, L, D}}, true,
       gs(false, true, L, L, D, D, D, L), {{B * H}, {L * D}, {L * D}, {L * L}}},
      {"values_bhij_bhjd", "b h i j, b h j d -> b h i d", {{B, H, L, L}, {B, H, L, D}}, true,
       gs(false, false, L, D, L, L, D, D), {{B * H}, {L * L}, {L * D}, {L * D}}},
      {"seed000_bid_bjd", "b i d, b j d -> b i j", {{B, L, E}, {B, L, E}}, true,
       gs(false, true, L, L, E, E, E, L), {{B}, {L * E}, {L * E}, {L * L}}},
      {"scores_unpermuted_k", "bhid,bjhd->bhij", {{B, H, L, D}, {B, L, H, D}}, true,
       gs(false, true, L, L, D, D, H * D, L), {{B, H}, {H * L * D, L * D}, {L * H * D, D}, {H * L * L, L * L}}},
      {"keras_proj_abc_cde", "abc,cde->abde", {{B, L, E}, {E, H, D}}, true,
       gs(false, false, B * L, H * D, E, E, H * D, H * D), {}},
      {"keras_scores_aecd_abcd", "aecd,abcd->acbe", {{B, L, H, D}, {B, L, H, D}}, true,
       gs(false, true, L, L, D, H * D, H * D, L), {{B, H}, {L * H * D, D}, {L * H * D, D}, {H * L * L, L * L}}},
      {"keras_values_acbe_aecd", "acbe,aecd->abcd", {{B, H, L, L}, {B, L, H, D}}, true,
       gs(false, false, L, D, L, L, H * D, H * D), {{B, H}, {H * L * L, L * L}, {L * H * D, D}, {L * H * D, D}}},
      {"keras_out_abcd_cde", "abcd,cde->abe", {{B, L, H, D}, {H, D, E}}, true,
       gs(false, false, B * L, E, H * D, H * D, E, E), {}},
      {"keras_dense_abc_cd", "abc,cd->abd", {{B, L, E}, {E, E}}, true, gs(false, false, B * L, E, E, E, E, E), {}},
      {"chain_ea_fb_abcd_gc_hd", "ea,fb,abcd,gc,hd->efgh", {{48, 48}, {48, 48}, {48, 48, 48, 48}, {48, 48}, {48, 48}},
       false, {}, {}},
      // float64, numpy's default dtype (OpenBLAS dgemm underneath).
      {"f64_seed000_bid_bjd", "b i d, b j d -> b i j", {{B, L, E}, {B, L, E}}, true,
       gs(false, true, L, L, E, E, E, L), {{B}, {L * E}, {L * E}, {L * L}}, qkv::DType::f64},
      {"f64_keras_proj_abc_cde", "abc,cde->abde", {{B, L, E}, {E, H, D}}, true,
       gs(false, false, B * L, H * D, E, E, H * D, H * D), {}, qkv::DType::f64},
      {"f64_scores_bhid_bhjd", "b h i d, b h j d -> b h i j", {{B, H, L, D}, {B, H, L, D}}, true,
       gs(false, true, L, L, D, D, D, L), {{B * H}, {L * D}, {L * D}, {L * L}}, qkv::DType::f64},
  };
  // clang-format on
}

std::vector<qkv::Tensor> operands(const Case& c) {
  std::vector<qkv::Tensor> ops;
  for (size_t i = 0; i < c.shapes.size(); ++i) ops.push_back(qkv::Tensor::randn(c.shapes[i], 1 + i, c.dtype));
  return ops;
}

double path_flops(const Case& c) {
  const qkv::EinsumPath p = qkv::einsum_path(c.equation, std::span<const qkv::Shape>(c.shapes));
  return p.optimized_flops;  // opt_einsum's flop_count: 2 per multiply-add for pairwise inner products
}

// The case's GEMM on preallocated operands and result.
struct GemmRun {
  std::vector<qkv::Tensor> ops;
  qkv::Tensor out;
  const Case& c;
  explicit GemmRun(const Case& cs) : ops(operands(cs)), c(cs) {
    int64_t batch = 1;
    for (int64_t n : c.batch.shape) batch *= n;
    out = qkv::Tensor::zeros({batch, c.gemm.m, c.gemm.n}, c.dtype);
  }
  double flops() const { return 2.0 * static_cast<double>(out.numel()) * static_cast<double>(c.gemm.k); }
  void operator()() const {
    const bool first_is_a = c.equation != std::string("aecd,abcd->acbe");  // key first: query is A
    const qkv::Tensor &a = ops[first_is_a ? 0 : 1], &b = ops[first_is_a ? 1 : 0];
    if (c.dtype == qkv::DType::f64) {
      qkv::gemm(c.gemm, 1.0, a.data<double>(), b.data<double>(), 0.0, out.data<double>(), c.batch);
    } else {
      qkv::gemm(c.gemm, 1.0f, a.data<float>(), b.data<float>(), 0.0f, out.data<float>(), c.batch);
    }
  }
};

double seconds_of(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// "of_gemm": qkv::gemm's best time for the same GEMM (5 calls, measured next to the
// einsum loop) over einsum's best time per call; 1.0 = no overhead. Best against best,
// so that load from other processes does not count as overhead.
void run_einsum(benchmark::State& state, const Case& c) {
  const std::vector<qkv::Tensor> ops = operands(c);
  benchmark::DoNotOptimize(qkv::einsum(c.equation, ops).raw_data());  // warm-up: plans, primitives
  double best_einsum = 1e30;
  for (auto _ : state) {
    best_einsum = std::min(best_einsum, seconds_of([&] {
                             qkv::Tensor out = qkv::einsum(c.equation, ops);
                             benchmark::DoNotOptimize(out.raw_data());
                           }));
  }
  state.counters["flops"] = benchmark::Counter(path_flops(c), benchmark::Counter::kIsIterationInvariantRate);
  if (c.one_gemm) {
    const GemmRun g(c);
    g();  // warm-up
    double best = 1e30;
    for (int r = 0; r < 5; ++r) best = std::min(best, seconds_of([&] { g(); }));
    state.counters["of_gemm"] = best / best_einsum;
  }
}

void run_gemm(benchmark::State& state, const Case& c) {
  const GemmRun g(c);
  g();  // warm-up
  for (auto _ : state) {
    g();
    benchmark::DoNotOptimize(g.out.raw_data());
  }
  state.counters["flops"] = benchmark::Counter(g.flops(), benchmark::Counter::kIsIterationInvariantRate);
}

const bool registered = [] {
  for (const Case& c : cases()) {
    benchmark::RegisterBenchmark(("einsum/" + std::string(c.name)).c_str(), run_einsum, c)
        ->Unit(benchmark::kMillisecond)
        ->UseRealTime();
    if (c.one_gemm) {
      benchmark::RegisterBenchmark(("gemm/" + std::string(c.name)).c_str(), run_gemm, c)
          ->Unit(benchmark::kMillisecond)
          ->UseRealTime();
    }
  }
  return true;
}();

}  // namespace

int main(int argc, char** argv) { return qkv::bench::run_benchmarks(argc, argv); }
