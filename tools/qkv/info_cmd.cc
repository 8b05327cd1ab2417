// qkv info [--json]: the machine as every benchmark table names it (qkv/machine.h): the CPU,
// its AVX2/FMA/F16C/AVX-512/AMX flags, the Highway target qkv's kernels dispatch to (with
// QKV_MAX_SIMD_TARGET where that caps it) and oneDNN's ISA. bench/peers/precision_peers.py's machine() reads `qkv info
// --json`.
#include <nlohmann/json.hpp>

#include <cstdio>

#include "commands.h"
#include "qkv/machine.h"

namespace qkv::cli {

void print_machine_line(bool json) { std::fprintf(json ? stderr : stdout, "Machine: %s\n", machine_line().c_str()); }

void register_info(CLI::App& app) {
  auto json = std::make_shared<bool>(false);
  CLI::App* cmd = app.add_subcommand(
      "info", "This machine: CPU, ISA flags, Highway target, oneDNN ISA, threads (the line qkv bench prints)");
  cmd->add_flag("--json", *json,
                "one JSON object: cpu_model, isa_flags (null without /proc/cpuinfo flags), simd_target, "
                "simd_target_cap (QKV_MAX_SIMD_TARGET, null when unset), onednn_isa, logical_cpus, threads");
  cmd->callback([json] {
    const MachineInfo info = machine_info();
    if (!*json) {
      std::printf("%s\n", machine_line(info).c_str());
      return;
    }
    nlohmann::ordered_json out = {{"cpu_model", info.cpu_model},     {"isa_flags", nullptr},
                                  {"simd_target", info.simd_target}, {"simd_target_cap", nullptr},
                                  {"onednn_isa", info.onednn_isa},   {"logical_cpus", info.logical_cpus},
                                  {"threads", info.threads}};
    if (info.isa_flags) out["isa_flags"] = *info.isa_flags;
    if (!info.simd_target_cap.empty()) out["simd_target_cap"] = info.simd_target_cap;
    std::printf("%s\n", out.dump().c_str());
  });
}

}  // namespace qkv::cli
