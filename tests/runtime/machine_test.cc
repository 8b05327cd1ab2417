// machine_info / machine_line (qkv/machine.h) against /proc/cpuinfo read here on its own,
// the SIMD dispatch's target list and ONEDNN_MAX_CPU_ISA. The ctest avx2.machine runs these
// again under ONEDNN_MAX_CPU_ISA=AVX2, where oneDNN's ISA must read avx2, and simd_cap.avx2
// under QKV_MAX_SIMD_TARGET=avx2 too, where Highway's target must read AVX2.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "common/simd_targets.h"
#include "common/thread_guard.h"
#include "qkv/machine.h"
#include "qkv/parallel.h"
#include "softmax/softmax_cpu.h"  // simd_targets: the list the kernels dispatch over

namespace qkv {
namespace {

// The words of /proc/cpuinfo's first line starting with `key` (after its colon), and
// whether there was one.
bool first_cpuinfo_line(const std::string& key, std::string& value) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0 && line.find(':') != std::string::npos) {
      value = line.substr(line.find(':') + 1);
      value.erase(0, value.find_first_not_of(' '));
      return true;
    }
  }
  return false;
}

std::set<std::string> cpu_flags() {
  std::string line;
  EXPECT_TRUE(first_cpuinfo_line("flags", line)) << "qkv's tests run on x86 Linux";
  std::istringstream words(line);
  std::set<std::string> flags;
  for (std::string w; words >> w;) flags.insert(w);
  return flags;
}

std::filesystem::path write_cpuinfo(const std::string& name, const std::string& text) {
  // the pid: the ctests MachineInfo.* and avx2.machine may run at once
  const auto path =
      std::filesystem::temp_directory_path() / ("qkv_machine_test_" + std::to_string(getpid()) + "_" + name);
  std::ofstream(path) << text;
  return path;
}

TEST(MachineInfo, FlagsAreTheIsaFlagsOfProcCpuinfo) {
  const MachineInfo info = machine_info();
  const std::set<std::string> flags = cpu_flags();
  ASSERT_TRUE(info.isa_flags.has_value());
  const std::vector<std::string>& got = *info.isa_flags;
  EXPECT_TRUE(std::is_sorted(got.begin(), got.end()));
  for (const std::string& f : got) EXPECT_TRUE(flags.count(f)) << f << " is not in /proc/cpuinfo's flags";
  for (const std::string& f : flags) {
    const bool wanted = f == "avx2" || f == "fma" || f == "f16c" || f.rfind("avx512", 0) == 0 || f.rfind("amx", 0) == 0;
    EXPECT_EQ(std::count(got.begin(), got.end(), f), wanted ? 1 : 0) << f;
  }
  std::string model;
  ASSERT_TRUE(first_cpuinfo_line("model name", model));
  EXPECT_EQ(info.cpu_model, model);
  EXPECT_GE(info.logical_cpus, 1);
}

// Highway 1.2.0's x86 targets, best first, and the place of `name` among them.
size_t simd_rank(std::string name) {
  static const std::vector<std::string> order = {"AVX3_SPR", "AVX3_ZEN4", "AVX3_DL", "AVX3",   "AVX2",
                                                 "SSE4",     "SSSE3",     "SSE2",    "EMU128", "SCALAR"};
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::toupper(c); });
  const auto at = std::find(order.begin(), order.end(), name);
  EXPECT_NE(at, order.end()) << name;
  return static_cast<size_t>(at - order.begin());
}

TEST(MachineInfo, SimdTargetIsTheBestTargetTheKernelsDispatchTo) {
  const MachineInfo info = machine_info();
  ASSERT_FALSE(kernels::detail::simd_targets().empty());
  const std::string fallback = kernels::detail::simd_target_name(kernels::detail::simd_targets().back());
  EXPECT_EQ(info.simd_target, kernels::detail::simd_target_name(kernels::detail::simd_targets().front()));
  // Highway's AVX3 needs AVX-512 F, VL, DQ, BW and CD; AVX3_DL those and VNNI, VPCLMULQDQ, VBMI,
  // VBMI2, VAES, VPOPCNTDQ, BITALG and GFNI (hwy/targets.cc); AVX2 needs AVX2, FMA, F16C (and
  // BMI). A run with QKV_TEST_SIMD_TARGET (avx2.machine) dispatches to that target instead.
  const std::set<std::string> f = cpu_flags();
  const auto all = [&](std::initializer_list<const char*> names) {
    return std::all_of(names.begin(), names.end(), [&](const char* n) { return f.count(n) > 0; });
  };
  const bool avx3 = all({"avx512f", "avx512vl", "avx512dq", "avx512bw", "avx512cd"});
  std::string best = fallback;
  if (!test::simd_target_from_env().empty()) {
    best = test::simd_target_from_env();
  } else if (avx3 && all({"avx512_vnni", "vpclmulqdq", "avx512vbmi", "avx512_vbmi2", "vaes", "avx512_vpopcntdq",
                          "avx512_bitalg", "gfni"})) {
    best = "AVX3_DL";
  } else if (avx3) {
    best = "AVX3";
  } else if (f.count("avx2") && f.count("fma") && f.count("f16c") && f.count("bmi2")) {
    best = "AVX2";
  }
  // QKV_MAX_SIMD_TARGET (ctest simd_cap.avx2) caps it: the best compiled target at or below both.
  const char* cap = std::getenv("QKV_MAX_SIMD_TARGET");
  const size_t most = std::max(simd_rank(best), cap != nullptr && *cap != '\0' ? simd_rank(cap) : 0);
  std::string expected;
  for (const std::string& compiled : {std::string("AVX3_DL"), std::string("AVX3"), std::string("AVX2"), fallback}) {
    if (expected.empty() && simd_rank(compiled) >= most) expected = compiled;
  }
  EXPECT_EQ(info.simd_target, expected);
  EXPECT_EQ(info.simd_target_cap, cap == nullptr ? "" : cap);
}

TEST(MachineInfo, OnednnIsaFollowsTheCpuAndOnednnMaxCpuIsa) {
  const MachineInfo info = machine_info();
  ASSERT_FALSE(info.onednn_isa.empty());
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  const std::set<std::string> f = cpu_flags();
  if (cap != nullptr && std::string(cap) == "AVX2") {  // the ctest avx2.machine
    EXPECT_EQ(info.onednn_isa, "avx2 (ONEDNN_MAX_CPU_ISA=AVX2)");
  } else if (cap != nullptr && *cap != '\0') {
    EXPECT_NE(info.onednn_isa.find(std::string(" (ONEDNN_MAX_CPU_ISA=") + cap + ")"), std::string::npos)
        << info.onednn_isa;
  } else if (f.count("avx512f") && f.count("avx512vl") && f.count("avx512dq") && f.count("avx512bw")) {
    EXPECT_EQ(info.onednn_isa.rfind("avx512_core", 0), 0u) << info.onednn_isa;
  } else if (f.count("avx2")) {
    EXPECT_EQ(info.onednn_isa.rfind("avx2", 0), 0u) << info.onednn_isa;
  }
  EXPECT_NE(machine_line(info).find("; oneDNN isa: " + info.onednn_isa), std::string::npos);
}

TEST(MachineInfo, ThreadsFollowSetNumThreads) {
  test::ThreadCountGuard guard;
  set_num_threads(3);
  EXPECT_EQ(machine_info().threads, 3);
  EXPECT_NE(machine_line().find(", 3 threads; "), std::string::npos) << machine_line();
}

TEST(MachineInfo, LineFormat) {
  MachineInfo info;
  info.cpu_model = "AMD EPYC 9R14";
  info.isa_flags = std::vector<std::string>{"avx2", "avx512f", "fma"};
  info.simd_target = "AVX3";
  info.onednn_isa = "avx2 (ONEDNN_MAX_CPU_ISA=AVX2)";
  info.logical_cpus = 2;
  info.threads = 1;
  EXPECT_EQ(machine_line(info),
            "AMD EPYC 9R14, 2 vCPUs, 1 thread; flags: avx2 avx512f fma; Highway: AVX3; "
            "oneDNN isa: avx2 (ONEDNN_MAX_CPU_ISA=AVX2)");
  info.simd_target = "AVX2";
  info.simd_target_cap = "avx2";
  EXPECT_EQ(machine_simd_target(info), "AVX2 (QKV_MAX_SIMD_TARGET=avx2)");
  EXPECT_NE(machine_line(info).find("; Highway: AVX2 (QKV_MAX_SIMD_TARGET=avx2); oneDNN isa: "), std::string::npos)
      << machine_line(info);
  info.isa_flags = std::vector<std::string>{};
  EXPECT_NE(machine_line(info).find("; flags: none; "), std::string::npos);
}

TEST(MachineInfo, MissingCpuinfoSaysUnknown) {
  const MachineInfo info = detail::machine_info_from("/nonexistent/qkv/cpuinfo");
  EXPECT_EQ(info.cpu_model, "unknown");
  EXPECT_FALSE(info.isa_flags.has_value());
  EXPECT_FALSE(info.simd_target.empty());
  EXPECT_FALSE(info.onednn_isa.empty());
  EXPECT_EQ(machine_line(info).rfind("unknown, ", 0), 0u);
  EXPECT_NE(machine_line(info).find("; flags: unknown; "), std::string::npos) << machine_line(info);
}

TEST(MachineInfo, ReadsTheFirstProcessorOfACpuinfoFile) {
  const auto path =
      write_cpuinfo("two", std::string("processor\t: 0\nmodel name\t: Some CPU @ 2.0GHz\n") +
                               "vmx flags\t: ept\nflags\t\t: fpu sse2 fma avx512f amx_tile avx2 f16c\n\n" +
                               "processor\t: 1\nmodel name\t: Other\nflags\t\t: avx512bw\n");
  const MachineInfo info = detail::machine_info_from(path.string());
  EXPECT_EQ(info.cpu_model, "Some CPU @ 2.0GHz");
  EXPECT_EQ(info.isa_flags, (std::vector<std::string>{"amx_tile", "avx2", "avx512f", "f16c", "fma"}));
  const auto none = write_cpuinfo("none", "model name : Old CPU\nflags : fpu sse sse2\n");
  EXPECT_EQ(detail::machine_info_from(none.string()).isa_flags, std::vector<std::string>{});
  std::filesystem::remove(path);
  std::filesystem::remove(none);
}

}  // namespace
}  // namespace qkv
