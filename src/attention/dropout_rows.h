// Attention dropout on float32 rows of weights, the Philox draws vectorized (Highway):
// the numbers of random::dropout_keep (qkv/random.h) bit for bit, so the fused forward,
// its backward, the float64 reference and the GPU kernels drop the same weights.
// Internal to the attention kernels (attention_cpu_tiles.h dropout_tile).
#pragma once

#include <cstdint>

namespace qkv::attention {

// row[c] = random::dropout_keep(seed, index + c, p) ? row[c] * scale : 0 for c < n, and the
// same for row2 where it is not null (the backward drops P and dP with one draw).
// p in [0, 1] (the checked dropout_p).
void dropout_row(float* row, int64_t n, uint64_t seed, uint64_t index, double p, float scale, float* row2 = nullptr);

}  // namespace qkv::attention
