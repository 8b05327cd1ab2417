// Symmetric int8 quantization of float rows (no zero points, so that an int8 x int8 ->
// int32 qkv::gemm needs no compensation and the scales factor out of the dot product):
// the int8 nn::Linear (nn/linear_quantized.cc) and the fused attention's int8 Q K^T
// (attention/attention_int8.cc).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace qkv::kernels {

// The scale of values whose largest magnitude is amax: amax / qmax (127; 63 for the 7-bit
// weights of CPUs without VNNI, qkv/gemm.h gemm_int8_full_range), or 1 when amax is 0 or
// not finite (then every value quantizes to 0, or saturates: garbage in, as for torch).
inline float symmetric_scale(float amax, float qmax = 127.0f) {
  return amax > 0.0f && std::isfinite(amax) ? amax / qmax : 1.0f;
}

// q[i] = round(x[i] / scale) clipped to [-qmax, qmax], half to even (torch's quantize_per_channel).
inline void quantize_with(const float* x, int64_t n, float scale, int8_t* q, float qmax = 127.0f) {
  const float inv = 1.0f / scale;
  // Round half to even by the 1.5 * 2^23 trick (exact for |r| <= 2^22, in the default
  // rounding mode): unlike std::nearbyint it vectorizes. Measured with
  // bench/peers/quant_peers.py, (8, 512, 768, 12), 2 threads: the int8 layer took 83.1 ms
  // with nearbyint, 75.9 ms with this.
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  // The clamp written as two selects takes a NaN to qmax (std::clamp kept it, and the int8
  // cast of a NaN is undefined behaviour): callers that meet a NaN or an inf give the row or
  // group a NaN scale (linear_quantized.cc, kv_cache_int8.cc), so its q is never read as a value.
  for (int64_t i = 0; i < n; ++i) {
    float v = x[i] * inv;
    v = v < qmax ? v : qmax;
    v = v > -qmax ? v : -qmax;
    q[i] = static_cast<int8_t>((v + kMagic) - kMagic);
  }
}

// The largest |x[i]|, +inf or NaN when x has an Inf or a NaN. On the bits: |x| is x
// without its sign bit, and non-negative floats (NaN above +inf) order as their bits do, so
// the loop is an integer max reduction, which GCC vectorizes (a float max with NaN rules it
// does not: 6.5% of an int8 attention call went to the scalar version).
inline float max_abs(const float* x, int64_t n) {
  uint32_t m = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t b = 0;
    std::memcpy(&b, x + i, sizeof b);
    m = std::max(m, b & 0x7fffffffu);
  }
  float amax = 0.0f;
  std::memcpy(&amax, &m, sizeof amax);
  return amax;
}

}  // namespace qkv::kernels
