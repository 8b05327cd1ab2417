// qkv bench peak: the float32 multiply-add peak of this machine's cores (measure_fma_peak,
// qkv/machine.h), the ceiling above `qkv bench attention`'s gemm and kernels, so that their
// "% of gemm" can be read against the hardware too (docs/performance.md, "The machine's FMA
// peak"). The machine line (qkv info) goes first, as for qkv bench attention.
//
//   qkv bench peak [--threads 2] [--min-time 1] [--json]
#include <cstdio>
#include <memory>

#include "commands.h"
#include "qkv/machine.h"
#include "qkv/parallel.h"

namespace qkv::cli {

namespace {

struct PeakArgs {
  int threads = 0;  // 0: QKV_NUM_THREADS / OMP_NUM_THREADS / cores
  double min_time = 1.0;
  bool json = false;
};

void run_bench_peak(const PeakArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  print_machine_line(a.json);
  const FmaPeak peak = measure_fma_peak(a.min_time);
  if (a.json) {
    std::printf("{\"op\": \"fma_peak\", \"dtype\": \"float32\", \"threads\": %d, \"gflops\": %.2f, "
                "\"simd_target\": \"%s\", \"lanes\": %d}\n",
                peak.threads, peak.gflops, peak.simd_target.c_str(), peak.lanes);
  } else {
    std::printf("fma peak float32, %d thread(s), %s (%d lanes): %.1f GFLOP/s\n", peak.threads,
                peak.simd_target.c_str(), peak.lanes, peak.gflops);
  }
}

}  // namespace

void register_bench_peak(CLI::App* bench) {
  auto a = std::make_shared<PeakArgs>();
  CLI::App* cmd = bench->add_subcommand("peak", "float32 multiply-add peak of the cores (GFLOP/s)");
  cmd->add_option("--threads", a->threads, "threads (default QKV_NUM_THREADS, else OMP_NUM_THREADS, else cores)")
      ->check(integer_in(1, 4096));
  cmd->add_option("--min-time", a->min_time, "seconds of timed runs (default 1; at least three runs of 20 ms)")
      ->check(real_in(0.0, 3600.0));
  cmd->add_flag("--json", a->json, "one JSON object per line");
  cmd->callback([a] { run_bench_peak(*a); });
}

}  // namespace qkv::cli
