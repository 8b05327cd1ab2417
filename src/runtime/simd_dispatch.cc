// QKV_MAX_SIMD_TARGET and the target Highway's dispatch picks (runtime/simd_dispatch.h).
// DispatchedTarget (simd_dispatch-inl.h) is compiled once per target, so that asking it which
// target runs is asking the dispatch itself.
#include "kernels/cpu/hwy_targets.h"  // the target list, before any hwy/ header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "runtime/simd_dispatch-inl.h"
#include "hwy/foreach_target.h"  // must come before highway.h
#include "hwy/highway.h"
#include "runtime/simd_dispatch-inl.h"

#if HWY_ONCE

#include <cctype>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "qkv/error.h"
#include "runtime/simd_dispatch.h"

namespace qkv {
namespace runtime {
HWY_EXPORT(DispatchedTarget);
}  // namespace runtime

namespace detail {

std::atomic<bool> simd_target_cap_applied{false};

namespace {

constexpr const char* kCapVariable = "QKV_MAX_SIMD_TARGET";

// Every target the installed Highway names on this architecture, best first.
std::vector<int64_t> named_targets() {
  std::vector<int64_t> targets;
  for (int bit = 0; bit < 63; ++bit) {
    const int64_t target = int64_t{1} << bit;
    if (std::string_view(hwy::TargetName(target)) != "Unknown") targets.push_back(target);
  }
  return targets;
}

// hwy::SupportedTargets() without its side effect: in Highway (1.0.3, 1.2.0) a call with no test mock
// re-detects the CPU and points the dispatch at all its targets, ignoring DisableTargets (its
// caller, the dispatch's first call, then narrows it; any other caller left it so, and the next
// kernels ran above the cap). Pointing it at what it returns is what that first call does.
int64_t supported_targets() {
  const int64_t targets = hwy::SupportedTargets();
  hwy::GetChosenTarget().Update(targets);
  return targets;
}

// The names of the targets in `mask`, best first, comma-separated.
std::string target_names(int64_t mask) {
  std::string names;
  for (const int64_t target : named_targets()) {
    if ((mask & target) == 0) continue;
    if (!names.empty()) names += ", ";
    names += hwy::TargetName(target);
  }
  return names;
}

struct EnvCap {
  std::string value;  // as set ("" when unset)
  int64_t target = 0;
  std::string error;  // parse_simd_target_cap's message for a bad value
};

const EnvCap& env_cap() {
  static const EnvCap cap = [] {
    EnvCap read;
    const char* value = std::getenv(kCapVariable);
    read.value = value == nullptr ? "" : value;
    try {
      read.target = parse_simd_target_cap(value);
    } catch (const ValueError& e) {
      read.error = e.what();
    }
    return read;
  }();
  return cap;
}

}  // namespace

int64_t simd_target_by_name(std::string_view name) {
  for (const int64_t target : named_targets()) {
    const std::string_view known = hwy::TargetName(target);
    bool same = known.size() == name.size();
    for (size_t i = 0; same && i < name.size(); ++i) {
      same = std::toupper(static_cast<unsigned char>(name[i])) == known[i];
    }
    if (same) return target;
  }
  return 0;
}

int64_t simd_targets_at_most(int64_t target) { return target == 0 ? 0 : ~(target - 1); }

int64_t parse_simd_target_cap(const char* value) {
  if (value == nullptr || *value == '\0') return 0;
  const int64_t target = simd_target_by_name(value);
  const std::string have = target_names(supported_targets() & HWY_TARGETS);
  if (target == 0) {
    fail<ValueError>(kCapVariable, "='", value, "' names no Highway SIMD target: it takes one of ",
                     target_names(~int64_t{0}), " (qkv dispatches to ", have, " on this CPU)");
  }
  if ((simd_targets_at_most(target) & HWY_TARGETS) == 0) {
    fail<ValueError>(kCapVariable, "='", value, "' is below every target qkv is compiled for (",
                     target_names(HWY_TARGETS), ")");
  }
  return target;
}

void set_simd_target_cap(int64_t target) {
  // Every target better than `target` (lower bits). The dispatch is pointed at the capped
  // targets here, before the cap counts as applied: left to Highway's re-choice at the next
  // dispatch, threads dispatching together each re-detected the CPU (Highway's
  // SupportedTargets points the dispatch at every target it has) and one could run above the cap.
  hwy::DisableTargets(target == 0 ? 0 : target - 1);
  (void)supported_targets();
}

std::string simd_target_cap_value() { return env_cap().value; }

std::vector<int64_t> dispatch_targets() {
  apply_simd_target_cap();
  std::vector<int64_t> targets;
  for (int64_t left = supported_targets() & HWY_TARGETS; left != 0; left &= left - 1) {
    targets.push_back(left & -left);  // the lowest bit: the best target left
  }
  return targets;
}

std::string dispatched_simd_target() { return hwy::TargetName(QKV_DYNAMIC_DISPATCH(runtime::DispatchedTarget)()); }

void apply_simd_target_cap_once() {
  const EnvCap& cap = env_cap();
  if (!cap.error.empty()) throw ValueError(cap.error);
  // Threads that reach their first dispatch together wait here until the cap is set.
  static std::once_flag once;
  std::call_once(once, [&] { set_simd_target_cap(cap.target); });
  simd_target_cap_applied.store(true, std::memory_order_release);
}

}  // namespace detail
}  // namespace qkv

#endif  // HWY_ONCE
