// The FLOP count every attention benchmark reports (bench/attention_bench.cc,
// `qkv bench`, `qkv demo`'s speed line), so their GFLOP/s agree.
#pragma once

#include <cstdint>

namespace qkv {

// One attention forward of q, k, v [B, H, L, D]: the two products q @ k^T and
// p @ v, 2 flops per multiply-add, = 4 * B * H * D * pairs with pairs = L * L;
// causal counts only the unmasked pairs, L(L+1)/2, so causal GFLOP/s are those
// of useful work. Softmax is not counted.
inline double attention_flops(int64_t b, int64_t h, int64_t l, int64_t d, bool causal) {
  const double pairs = causal ? static_cast<double>(l) * static_cast<double>(l + 1) / 2.0
                              : static_cast<double>(l) * static_cast<double>(l);
  return 4.0 * static_cast<double>(b) * static_cast<double>(h) * static_cast<double>(d) * pairs;
}

}  // namespace qkv
