// 16-bit floating-point storage types. Conversions round to nearest even, as
// numpy (float16) and PyTorch (bfloat16) do; Highway's BF16FromF32 truncates,
// which is why these are ours.
#pragma once

#include <cstdint>
#include <cstring>

namespace qkv {

namespace detail {
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
}  // namespace detail

// IEEE 754 binary16.
struct float16 {
  uint16_t bits = 0;

  float16() = default;
  explicit float16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return to_float(bits); }

  static float16 from_bits(uint16_t b) {
    float16 h;
    h.bits = b;
    return h;
  }

  static uint16_t from_float(float f) {
    uint32_t x = detail::float_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    x &= 0x7fffffffu;
    if (x >= 0x7f800000u) {  // inf or nan
      return static_cast<uint16_t>(sign | 0x7c00u | (x > 0x7f800000u ? 0x200u : 0u));
    }
    if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
    if (x < 0x38800000u) {                                               // subnormal half or zero
      // Add 0.5 (as float) so the FPU's round-to-nearest-even does the rounding.
      const float magic = detail::bits_float(0x3f000000u);  // 0.5
      const float v = detail::bits_float(x) + magic;
      return static_cast<uint16_t>(sign | (detail::float_bits(v) - 0x3f000000u));
    }
    const uint32_t mant_odd = (x >> 13) & 1u;
    x += 0xc8000fffu + mant_odd;  // rebias exponent (-112 << 23) and round
    return static_cast<uint16_t>(sign | (x >> 13));
  }

  static float to_float(uint16_t h) {
    const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    const uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
      const float v = static_cast<float>(mant) * 5.9604644775390625e-8f;  // 2^-24
      return sign ? -v : v;
    }
    if (exp == 31) return detail::bits_float(sign | 0x7f800000u | (mant << 13));
    return detail::bits_float(sign | ((exp + 112) << 23) | (mant << 13));
  }
};

// bfloat16: the upper half of an IEEE binary32.
struct bfloat16 {
  uint16_t bits = 0;

  bfloat16() = default;
  explicit bfloat16(float f) : bits(from_float(f)) {}
  explicit operator float() const { return detail::bits_float(static_cast<uint32_t>(bits) << 16); }

  static bfloat16 from_bits(uint16_t b) {
    bfloat16 h;
    h.bits = b;
    return h;
  }

  static uint16_t from_float(float f) {
    const uint32_t x = detail::float_bits(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
    const uint32_t rounding = 0x7fffu + ((x >> 16) & 1u);
    return static_cast<uint16_t>((x + rounding) >> 16);
  }
};

}  // namespace qkv
