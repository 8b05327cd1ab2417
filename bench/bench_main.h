// The main() of every qkv Google Benchmark program.
#pragma once

#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <string>

#include "qkv/machine.h"
#include "qkv/parallel.h"
#include "qkv/tensor.h"

namespace qkv::bench {

// Tensor::uniform values in a 2 MB-aligned buffer advised as transparent huge pages
// before it is touched: the sources of memcpy and of the copies measured against it,
// as numpy's rng.random arrays in the peer scripts get huge pages (numpy advises
// every array of 4 MB and more).
inline Tensor huge_page_uniform(const Shape& shape) {
  const Tensor values = Tensor::uniform(shape, 1);
  constexpr size_t kHuge = size_t{2} << 20;
  const size_t bytes = (values.nbytes() + kHuge - 1) / kHuge * kHuge;
  void* buffer = std::aligned_alloc(kHuge, bytes);
  if (buffer == nullptr) std::abort();
  (void)madvise(buffer, bytes, MADV_HUGEPAGE);
  std::memcpy(buffer, values.raw_data(), values.nbytes());
  return Tensor::from_blob(buffer, shape, values.dtype(), {}, std::shared_ptr<void>(buffer, std::free));
}

// Applies QKV_NUM_THREADS to this thread's OpenMP runtime (so raw oneDNN and
// peers in the same program use qkv's thread count) and records the machine in the
// report's context (its header, and "context" of --benchmark_format=json), as
// machine_info() names it (qkv/machine.h): cpu (model), cpu_isa (AVX2/FMA/F16C/AVX-512/AMX
// flags), simd_target (Highway's, with " (QKV_MAX_SIMD_TARGET=...)" where that caps it),
// onednn_isa (with ONEDNN_MAX_CPU_ISA's), qkv_num_threads.
inline void add_machine_context() {
  set_num_threads(get_num_threads());
  const MachineInfo m = machine_info();
  benchmark::AddCustomContext("cpu", m.cpu_model);
  benchmark::AddCustomContext("cpu_isa", machine_flags(m));
  benchmark::AddCustomContext("simd_target", machine_simd_target(m));
  benchmark::AddCustomContext("onednn_isa", m.onednn_isa);
  benchmark::AddCustomContext("qkv_num_threads", std::to_string(m.threads));
}

// add_machine_context, then the registered benchmarks. A bad QKV_MAX_SIMD_TARGET (machine_info's
// ValueError) ends the program with its message before any benchmark runs.
inline int run_benchmarks(int argc, char** argv) {
  try {
    add_machine_context();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}

}  // namespace qkv::bench
