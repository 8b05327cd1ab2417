// Shared by the decode kernel tests (decode_int8_test.cc, decode_half_test.cc): a cache of the
// given layout filled by two ragged appends, decoded on every Highway SIMD target against the
// float64 reference on the cache's widened / dequantized values.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "attention/attention_test_configs.h"
#include "common/simd_targets.h"
#include "qkv/kv_cache.h"

namespace qkv::test {

// Two appends ([2, 2, 300 / 290, D] keys, lengths {300, 45} then {290, 1}: B = 2, Hk = 2) into a
// cache of config c, q [2, hq, lq, D]; on every target the step with 128-key chunks (several per
// sequence: the merge too) and with automatic chunks within 2e-6 of the reference, and the
// targets within 2e-6 of each other.
inline void expect_every_target_matches_the_reference(const KVCacheConfig& c, int64_t hq, int64_t lq) {
  KVCache cache(c);
  const int64_t d = c.head_dim, dv = c.value_dim > 0 ? c.value_dim : c.head_dim;
  cache.append(Tensor::randn({2, 2, 300, d}, 1), Tensor::randn({2, 2, 300, dv}, 2), {300, 45});
  cache.append(Tensor::randn({2, 2, 290, d}, 3), Tensor::randn({2, 2, 290, dv}, 4), {290, 1});
  const Tensor q = Tensor::randn({2, hq, lq, d}, 5);
  const Tensor ref = decode_attention_reference(q, cache).output;
  std::vector<Tensor> outs;
  for_each_target([&] {
    DecodeOptions o;
    o.chunk = 128;
    outs.push_back(decode_attention(q, cache, o).output);
    EXPECT_LE(max_abs_diff(outs.back(), ref), 2e-6);
    EXPECT_LE(max_abs_diff(decode_attention(q, cache).output, ref), 2e-6);  // automatic chunks
  });
  ASSERT_GE(outs.size(), 1u);
  for (const Tensor& out : outs) EXPECT_LE(max_abs_diff(out, outs.front()), 2e-6);
}

}  // namespace qkv::test
