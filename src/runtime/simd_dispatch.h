// The run-time side of qkv's Highway dispatch (simd_dispatch.cc): QKV_MAX_SIMD_TARGET, the cap
// of the SIMD target HWY_DYNAMIC_DISPATCH may pick, as ONEDNN_MAX_CPU_ISA caps oneDNN's ISA, and
// the target the dispatch picks now. Every dispatch goes through QKV_DYNAMIC_DISPATCH
// (kernels/cpu/hwy_targets.h), which applies the cap before the process's first dispatch.
//
// QKV_MAX_SIMD_TARGET=<name>: a Highway target name as hwy::TargetName spells it (any case;
// Highway 1.2.0 on x86: AVX3_SPR, AVX3_ZEN4, AVX3_DL, AVX3, AVX2, SSE4, SSSE3, SSE2, EMU128, SCALAR,
// best first). Dispatch then picks the best target qkv is compiled for (AVX3_DL, AVX3, AVX2, the
// fallback: kernels/cpu/hwy_targets.h) that this CPU runs
// and that is no better than <name>: AVX2 on this AVX-512 machine makes its kernels those of an
// AVX2-only one. A cap above the CPU changes nothing (it is a maximum, as oneDNN's is). A name
// Highway does not know, or one below every compiled target, makes the first dispatch and
// machine_info() throw ValueError naming the variable, its value and the targets.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::detail {

// The Highway target named `name` (hwy::TargetName's spelling, any case), or 0 when Highway
// names none so.
int64_t simd_target_by_name(std::string_view name);

// `target` and every worse target (Highway's bits grow as targets get worse); 0 for 0.
int64_t simd_targets_at_most(int64_t target);

// The cap a QKV_MAX_SIMD_TARGET value sets: 0 (none) for null or empty, else its target.
// Throws ValueError for a name Highway does not know or one that leaves none of qkv's
// compiled targets.
int64_t parse_simd_target_cap(const char* value);

// Makes dispatch pick no target better than `target` (0: lifts the cap). Process-wide (it
// composes with the tests' force_simd_target); the tests use it, the library sets it once.
void set_simd_target_cap(int64_t target);

// QKV_MAX_SIMD_TARGET as read at the first dispatch ("" when unset or empty).
std::string simd_target_cap_value();

// The targets qkv is compiled for that the dispatch may pick now, best first: those this CPU
// runs (or the tests' force_simd_target lets it), at or below the cap. Applies the cap first.
std::vector<int64_t> dispatch_targets();

// The name of the target QKV_DYNAMIC_DISPATCH calls now ("AVX3", "AVX2", "SCALAR", ...), asked
// of a dispatched function (HWY_TARGET of the code it runs). Applies the cap first.
std::string dispatched_simd_target();

// Applies QKV_MAX_SIMD_TARGET (read once) unless done; every call throws its ValueError while
// the value is bad. The fast path is one load: it runs before every dispatch.
extern std::atomic<bool> simd_target_cap_applied;
void apply_simd_target_cap_once();
inline void apply_simd_target_cap() {
  if (!simd_target_cap_applied.load(std::memory_order_acquire)) apply_simd_target_cap_once();
}

}  // namespace qkv::detail
