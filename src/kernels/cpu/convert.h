// Row conversions between float and the 16-bit float types, SIMD through Highway with
// run-time dispatch (convert_cpu.cc, convert-inl.h). Used where a 16-bit operand is
// widened per tile (the gemm wrapper on CPUs without a native bf16/f16 matmul, the
// fused attention's per-tile path) and where probabilities are rounded for a bf16 P V.
// Both directions round as qkv::bfloat16 / qkv::float16 do (widening is exact;
// narrowing is round to nearest even, NaN stays NaN), on every target.
#pragma once

#include <cstdint>

#include "qkv/half.h"

namespace qkv::kernels {

void widen(const bfloat16* src, int64_t n, float* dst);
void widen(const float16* src, int64_t n, float* dst);
void narrow(const float* src, int64_t n, bfloat16* dst);
// float16 is scalar (float16's constructor): no kernel rounds P to f16 on the CPUs
// seen so far, since oneDNN 2.6 has no f16 matmul (docs/kernels.md).
void narrow(const float* src, int64_t n, float16* dst);

// `rows` rows of `n` elements, `ld_src` / `ld_dst` elements apart.
template <class From, class To>
void convert_rows(const From* src, int64_t rows, int64_t n, int64_t ld_src, To* dst, int64_t ld_dst) {
  for (int64_t r = 0; r < rows; ++r) {
    if constexpr (sizeof(From) < sizeof(To)) {
      widen(src + r * ld_src, n, dst + r * ld_dst);
    } else {
      narrow(src + r * ld_src, n, dst + r * ld_dst);
    }
  }
}

}  // namespace qkv::kernels
