// The ISA oneDNN's kernels run at, for machine_info (qkv/machine.h): beside gemm_onednn.cc,
// as only the GEMM wrapper's files call oneDNN.
#include <oneapi/dnnl/dnnl.hpp>

#include <cstdio>
#include <string>

#include "kernels/cpu/gemm_internal.h"

namespace qkv::detail {

std::string gemm_onednn_isa() {
  // The effective ISA is the CPU's best, lowered by ONEDNN_MAX_CPU_ISA (read once by
  // oneDNN); qkv never calls dnnl::set_max_cpu_isa, so asking does not pin anything.
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::all: return "all";
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
  }
  // A value a newer oneDNN added: its number, as oneDNN's dnnl_types.h lists it.
  char number[32];
  std::snprintf(number, sizeof number, "cpu_isa 0x%x", static_cast<unsigned>(dnnl::get_effective_cpu_isa()));
  return number;
}

}  // namespace qkv::detail
