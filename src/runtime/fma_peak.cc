// measure_fma_peak (qkv/machine.h): the float32 multiply-add rate of this machine's cores, the
// ceiling under every GEMM and fused kernel (docs/performance.md, "The machine's FMA peak").
// FmaChains (fma_peak-inl.h) is compiled once per SIMD target here and nowhere else.
#include "kernels/cpu/hwy_targets.h"  // the target list, before any hwy/ header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "runtime/fma_peak-inl.h"
// clang-format off
#include "hwy/foreach_target.h"  // must come before highway.h
#include "hwy/highway.h"
#include "runtime/fma_peak-inl.h"
// clang-format on

#if HWY_ONCE

#include <algorithm>
#include <chrono>
#include <vector>

#include "qkv/error.h"
#include "qkv/machine.h"
#include "qkv/parallel.h"
#include "runtime/fma_peak.h"
#include "runtime/simd_dispatch.h"

namespace qkv {
namespace runtime {
HWY_EXPORT(FmaChains);
}  // namespace runtime

int64_t detail::fma_chains(int64_t steps, float x, float y, float* ends) {
  return QKV_DYNAMIC_DISPATCH(runtime::FmaChains)(steps, x, y, ends);
}

namespace {

// x and y keep every chain finite and away from denormals however many steps run: a <- a * x + y
// tends to y / (1 - x) = 1024, which float32 represents (and then keeps: 1024 x + y rounds to 1024).
constexpr float kX = 1.0f - 0x1p-20f;
constexpr float kY = 0x1p-10f;

// Seconds for every worker to run `steps` steps of its chains at once (parallel_for: one index
// per worker).
double time_chains(int threads, int64_t steps) {
  std::vector<float> ends(static_cast<size_t>(threads) * detail::kFmaChains);
  const auto start = std::chrono::steady_clock::now();
  parallel_for(0, threads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t w = begin; w < end; ++w) detail::fma_chains(steps, kX, kY, &ends[w * detail::kFmaChains]);
  });
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

FmaPeak measure_fma_peak(double min_seconds) {
  if (!(min_seconds >= 0) || min_seconds > 3600)
    throw ValueError("measure_fma_peak: min_seconds must be in [0, 3600], got " + std::to_string(min_seconds));
  FmaPeak peak;
  peak.threads = get_num_threads();
  peak.simd_target = detail::dispatched_simd_target();  // machine_info().simd_target, without /proc/cpuinfo
  float ends[detail::kFmaChains];
  peak.lanes = static_cast<int>(detail::fma_chains(1, kX, kY, ends));
  // Steps grow until one run takes 20 ms (timer and thread start-up then cost < 1%); the rate is
  // the best run's, as the other benchmarks take the fastest call: a shared VM only slows runs.
  int64_t steps = 1 << 16;
  double total = 0;
  for (int runs = 0; runs < 3 || total < min_seconds;) {
    const double seconds = time_chains(peak.threads, steps);
    if (seconds < 0.02) {  // too short to count: twice the steps
      steps *= 2;
      continue;
    }
    ++runs, total += seconds;
    const double flops = 2.0 * detail::kFmaChains * peak.lanes * static_cast<double>(steps) * peak.threads;
    peak.gflops = std::max(peak.gflops, flops / seconds * 1e-9);
  }
  return peak;
}

}  // namespace qkv

#endif  // HWY_ONCE
