// The kernel behind measure_fma_peak (qkv/machine.h), for its test: fma_peak-inl.h's chains on
// the target the dispatch picks.
#pragma once

#include <cstdint>

namespace qkv::detail {

inline constexpr int kFmaChains = 12;

// kFmaChains chains a_c <- a_c * x + y from a_c = c, `steps` float32 multiply-adds each in
// every lane of one vector; ends[c] = a_c afterwards. Returns the lanes of one vector (what one
// step of a chain counts as multiply-adds).
int64_t fma_chains(int64_t steps, float x, float y, float* ends);

}  // namespace qkv::detail
