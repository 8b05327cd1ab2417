// The FLOP count every attention benchmark reports (bench/attention_bench.cc,
// `qkv bench`, `qkv demo`'s speed line), so their GFLOP/s agree.
#pragma once

#include <cstdint>

namespace qkv {

// One attention forward of q [B, H, Lq, D] over k, v [B, H, Lk, D]: the two products
// q @ k^T and p @ v, 2 flops per multiply-add, = 4 * B * H * D * pairs with pairs = Lq * Lk;
// causal (top-left aligned: row i sees keys j <= i) counts only the unmasked pairs,
// sum_i min(i + 1, Lk) (L(L+1)/2 where Lq = Lk = L), so causal GFLOP/s are those of useful
// work. Softmax is not counted.
inline double attention_flops(int64_t b, int64_t h, int64_t lq, int64_t lk, int64_t d, bool causal) {
  const double q = static_cast<double>(lq), k = static_cast<double>(lk);
  double pairs = q * k;
  if (causal) pairs = lq <= lk ? q * (q + 1) / 2.0 : k * (k + 1) / 2.0 + (q - k) * k;
  return 4.0 * static_cast<double>(b) * static_cast<double>(h) * static_cast<double>(d) * pairs;
}

// The same with Lq = Lk = l.
inline double attention_flops(int64_t b, int64_t h, int64_t l, int64_t d, bool causal) {
  return attention_flops(b, h, l, l, d, causal);
}

}  // namespace qkv
