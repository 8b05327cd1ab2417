// The main() of every qkv Google Benchmark program.
#pragma once

#include <benchmark/benchmark.h>

#include <string>

#include "qkv/parallel.h"

namespace qkv::bench {

// Applies QKV_NUM_THREADS to this thread's OpenMP runtime (so raw oneDNN and
// peers in the same program use qkv's thread count), records it in the
// report's context, and runs the registered benchmarks.
inline int run_benchmarks(int argc, char** argv) {
  set_num_threads(get_num_threads());
  benchmark::AddCustomContext("qkv_num_threads", std::to_string(get_num_threads()));
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace qkv::bench
