// Counter-based random numbers (Philox4x32-10, as cuRAND, JAX and PyTorch use).
// A value depends only on (seed, counter), so kernels that tile or thread
// differently draw exactly the same numbers for the same element.
#pragma once

#include <array>
#include <cstdint>

namespace qkv::random {

// Four 32-bit words for one (seed, counter) pair.
inline std::array<uint32_t, 4> philox4x32(uint64_t seed, uint64_t counter) {
  uint32_t c0 = static_cast<uint32_t>(counter), c1 = static_cast<uint32_t>(counter >> 32);
  uint32_t c2 = 0, c3 = 0;
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kMul0) * c0;
    const uint64_t p1 = static_cast<uint64_t>(kMul1) * c2;
    const uint32_t n0 = static_cast<uint32_t>(p1 >> 32) ^ c1 ^ k0;
    const uint32_t n2 = static_cast<uint32_t>(p0 >> 32) ^ c3 ^ k1;
    c1 = static_cast<uint32_t>(p1);
    c3 = static_cast<uint32_t>(p0);
    c0 = n0;
    c2 = n2;
    k0 += kWeyl0;
    k1 += kWeyl1;
  }
  return {c0, c1, c2, c3};
}

// Uniform in [0, 1) with 53 random bits.
inline double uniform(uint64_t seed, uint64_t counter) {
  const auto r = philox4x32(seed, counter);
  const uint64_t bits = (static_cast<uint64_t>(r[0]) << 21) ^ (static_cast<uint64_t>(r[1]) >> 11);
  return static_cast<double>(bits & ((uint64_t{1} << 53) - 1)) * 0x1.0p-53;
}

// Standard normal (Box-Muller on two words of the same block).
double normal(uint64_t seed, uint64_t counter);

// Dropout keeps an element with probability 1 - p. Element `index` of the
// flattened [..., Lq, Lk] weight tensor uses counter `index`; every attention
// kernel must use this function so that their masks agree.
inline bool dropout_keep(uint64_t seed, uint64_t index, double p) { return uniform(seed, index) >= p; }

}  // namespace qkv::random
