// The machine qkv runs on, as every benchmark table names it: the CPU, its SIMD flags, the
// Highway target qkv's kernels dispatch to and the ISA oneDNN's GEMM kernels run at. One
// place for what `qkv info`, `qkv bench`, the Google Benchmark programs (bench/bench_main.h)
// and the peer scripts (bench/peers/, through `qkv info --json`) print.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace qkv {

struct MachineInfo {
  // /proc/cpuinfo's first "model name" ("AMD EPYC 9R14 96-Core Processor"); "unknown"
  // where there is none (not Linux, or a CPU whose cpuinfo names no model).
  std::string cpu_model = "unknown";
  // The flags of /proc/cpuinfo's first "flags" line that decide qkv's kernels: avx2, fma,
  // f16c, every avx512* and every amx*, sorted. nullopt where there is no flags line (not
  // Linux, not x86); empty where there is one without any of them.
  std::optional<std::vector<std::string>> isa_flags;
  // The Highway target the SIMD kernels dispatch to ("AVX3", "AVX2", "EMU128" or "SCALAR"):
  // the best of those qkv compiles (kernels/cpu/hwy_targets.h: AVX3, AVX2 and the portable
  // fallback) that this CPU runs and QKV_MAX_SIMD_TARGET allows.
  std::string simd_target;
  // QKV_MAX_SIMD_TARGET's value, as set ("" when unset): the cap of Highway's dispatch, as
  // ONEDNN_MAX_CPU_ISA is oneDNN's (e.g. "AVX2": this AVX-512 CPU's kernels are then those of an
  // AVX2-only one; src/runtime/simd_dispatch.h).
  std::string simd_target_cap;
  // oneDNN's effective ISA (dnnl::get_effective_cpu_isa, so ONEDNN_MAX_CPU_ISA lowers it),
  // named as oneDNN's cpu_isa enum and as ONEDNN_MAX_CPU_ISA takes it in lower case
  // ("avx512_core_bf16", "avx2"), followed by " (ONEDNN_MAX_CPU_ISA=AVX2)" where that
  // variable (or the older DNNL_MAX_CPU_ISA) is set.
  std::string onednn_isa;
  int logical_cpus = 0;  // std::thread::hardware_concurrency() (0: unknown)
  int threads = 0;       // get_num_threads(): the threads qkv's kernels use now
};

// This machine, now (threads follows set_num_threads; the rest is fixed for the process).
// Never throws for a missing or unreadable /proc/cpuinfo: those fields say "unknown". Throws
// ValueError where QKV_MAX_SIMD_TARGET names no Highway target (as every SIMD kernel does).
MachineInfo machine_info();

// machine_info() on one line, the header of every benchmark table:
//   "<cpu_model>, <logical_cpus> vCPUs, <threads> thread(s); flags: <isa_flags, space-separated>;
//    Highway: <machine_simd_target>; oneDNN isa: <onednn_isa>"
// e.g. "AMD EPYC 9R14 96-Core Processor, 2 vCPUs, 2 threads; flags: avx2 avx512_bf16 avx512bw
// ... f16c fma; Highway: AVX3; oneDNN isa: avx512_core_bf16". Flags read "unknown" without a
// flags line and "none" with one that has none of them.
std::string machine_line();
std::string machine_line(const MachineInfo& info);
// The line's flags: isa_flags space-separated, "unknown" or "none".
std::string machine_flags(const MachineInfo& info);
// The line's Highway target: simd_target, followed by " (QKV_MAX_SIMD_TARGET=AVX2)" where that
// variable is set (as onednn_isa names ONEDNN_MAX_CPU_ISA).
std::string machine_simd_target(const MachineInfo& info);

// The float32 multiply-add peak of this machine's cores, measured (`qkv bench peak`): the
// ceiling under qkv::gemm and every fused kernel, against which "% of the gemm rate" can be
// read (docs/performance.md, "The machine's FMA peak").
struct FmaPeak {
  double gflops = 0;        // 2 flops per lane per multiply-add, all workers together; best run
  int threads = 0;          // workers: get_num_threads(), each on its own chains at once
  std::string simd_target;  // the Highway target the chains ran on (machine_info().simd_target)
  int lanes = 0;            // float32 lanes of one vector on that target
};

// Each of get_num_threads() workers (parallel_for) runs twelve independent chains of float32
// multiply-adds on the dispatched Highway target, nothing else in the loop; runs repeat, each at
// least 20 ms, until `min_seconds` have passed (at least three), and the fastest gives the rate.
// ValueError for min_seconds outside [0, 3600] or NaN.
FmaPeak measure_fma_peak(double min_seconds = 0.3);

namespace detail {
// machine_info() with `cpuinfo_path` read in place of /proc/cpuinfo (tests: missing files).
MachineInfo machine_info_from(const std::string& cpuinfo_path);
}  // namespace detail

}  // namespace qkv
