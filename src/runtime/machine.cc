// machine_info and machine_line (qkv/machine.h): /proc/cpuinfo, Highway's target (asked of
// the dispatch, simd_dispatch.cc) and oneDNN's ISA (asked through the GEMM wrapper,
// gemm_onednn_isa.cc).
#include "qkv/machine.h"

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include "kernels/cpu/gemm_internal.h"
#include "qkv/parallel.h"
#include "runtime/simd_dispatch.h"

namespace qkv {

namespace {

// The flags that choose qkv's and oneDNN's kernels (and that the docs' tables name).
bool isa_flag(const std::string& flag) {
  return flag == "avx2" || flag == "fma" || flag == "f16c" || flag.rfind("avx512", 0) == 0 || flag.rfind("amx", 0) == 0;
}

// "value" of a "key<tabs> : value" line of /proc/cpuinfo whose key is `key`, else nullopt.
std::optional<std::string> cpuinfo_value(const std::string& line, const std::string& key) {
  if (line.rfind(key, 0) != 0) return std::nullopt;
  const size_t colon = line.find(':');
  if (colon == std::string::npos || line.find_first_not_of(" \t", key.size()) != colon) return std::nullopt;
  const size_t start = line.find_first_not_of(' ', colon + 1);
  return start == std::string::npos ? std::string() : line.substr(start);
}

// Model and ISA flags of the first processor listed (all list the same on the machines
// qkv runs on; a hybrid CPU's cores share their ISA too).
void read_cpuinfo(const std::string& path, MachineInfo& info) {
  std::ifstream in(path);
  bool have_model = false;
  for (std::string line; std::getline(in, line) && !(have_model && info.isa_flags);) {
    if (const auto model = cpuinfo_value(line, "model name"); model && !have_model) {
      have_model = true;
      if (!model->empty()) info.cpu_model = *model;
    } else if (const auto flags = cpuinfo_value(line, "flags"); flags && !info.isa_flags) {
      std::istringstream words(*flags);
      std::vector<std::string> picked;
      for (std::string w; words >> w;) {
        if (isa_flag(w)) picked.push_back(w);
      }
      std::sort(picked.begin(), picked.end());
      info.isa_flags = std::move(picked);
    }
  }
}

std::string onednn_isa() {
  std::string isa = detail::gemm_onednn_isa();
  for (const char* cap : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {  // oneDNN's order
    if (const char* value = std::getenv(cap); value != nullptr && *value != '\0') {
      return isa + " (" + cap + "=" + value + ")";
    }
  }
  return isa;
}

}  // namespace

namespace detail {

MachineInfo machine_info_from(const std::string& cpuinfo_path) {
  MachineInfo info;
  read_cpuinfo(cpuinfo_path, info);
  // What the dispatch runs (not hwy::SupportedTargets()' best, which on Zen 4 is AVX3_DL, a
  // target qkv does not compile), under QKV_MAX_SIMD_TARGET; throws for a bad value of it.
  info.simd_target = dispatched_simd_target();
  info.simd_target_cap = simd_target_cap_value();
  info.onednn_isa = onednn_isa();
  info.logical_cpus = static_cast<int>(std::thread::hardware_concurrency());
  info.threads = get_num_threads();
  return info;
}

}  // namespace detail

MachineInfo machine_info() { return detail::machine_info_from("/proc/cpuinfo"); }

std::string machine_flags(const MachineInfo& info) {
  if (!info.isa_flags) return "unknown";
  if (info.isa_flags->empty()) return "none";
  std::string flags;
  for (const std::string& f : *info.isa_flags) flags += (flags.empty() ? "" : " ") + f;
  return flags;
}

std::string machine_simd_target(const MachineInfo& info) {
  if (info.simd_target_cap.empty()) return info.simd_target;
  return info.simd_target + " (QKV_MAX_SIMD_TARGET=" + info.simd_target_cap + ")";
}

std::string machine_line(const MachineInfo& info) {
  const std::string cpus = info.logical_cpus > 0 ? std::to_string(info.logical_cpus) : "unknown";
  const std::string threads = std::to_string(info.threads) + (info.threads == 1 ? " thread" : " threads");
  return info.cpu_model + ", " + cpus + " vCPUs, " + threads + "; flags: " + machine_flags(info) +
         "; Highway: " + machine_simd_target(info) + "; oneDNN isa: " + info.onednn_isa;
}

std::string machine_line() { return machine_line(machine_info()); }

}  // namespace qkv
