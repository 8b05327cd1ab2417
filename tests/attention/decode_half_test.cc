// f32 / bf16 / f16 KV caches (qkv/kv_cache.h): the Highway kernels that read the rows in place
// (16-bit ones widened in registers; attention/decode_rows-inl.h) on every SIMD target, against the
// float64 reference on the widened cache (keys_f32 / values_f32), contiguous, paged and
// windowed, with GQA groups in blocks of 4 and a remainder.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "attention/attention_test_configs.h"
#include "attention/decode_targets.h"
#include "common/expect.h"
#include "common/simd_targets.h"
#include "qkv/kv_cache.h"

namespace qkv {
namespace {

using test::max_abs_diff;

struct Case {
  int64_t d, dv, hq, lq, page, window, capacity;
};

std::string name(const Case& c, DType dt) {
  return std::string(dtype_name(dt)) + " D " + std::to_string(c.d) + " Dv " + std::to_string(c.dv) + " Hq " +
         std::to_string(c.hq) + " Lq " + std::to_string(c.lq) + " page " + std::to_string(c.page) + " window " +
         std::to_string(c.window);
}

// Every target (AVX3, AVX2, the scalar fallback) against the reference and against each other.
// Head sizes with whole vectors (128), lane tails (40 keys, 24 values; 8: below a vector),
// Hq / Hk = 4 (one block of 4 rows), 3 with Lq = 2 (6 rows: a block and two single rows), 1,
// 7-position pages, and a 50-key window in a ring of 64 slots (wrapped, runs up to the wrap).
TEST(DecodeHalf, EveryTargetMatchesTheReference) {
  const std::vector<Case> cases = {{128, 128, 8, 1, 0, 0, 600}, {40, 24, 6, 2, 0, 0, 600}, {40, 24, 6, 2, 7, 0, 600},
                                   {16, 8, 4, 1, 0, 0, 600},    {40, 40, 2, 1, 0, 0, 600}, {40, 24, 6, 2, 0, 50, 64}};
  for (DType dt : {DType::f32, DType::bf16, DType::f16}) {  // float32 rows as they are (FloatRows)
    for (const Case& cs : cases) {
      SCOPED_TRACE(name(cs, dt));
      KVCacheConfig c{2, 2, cs.d, cs.capacity, cs.dv, dt};
      c.page_size = cs.page, c.window = cs.window;
      test::expect_every_target_matches_the_reference(c, cs.hq, cs.lq);
    }
  }
}

// f16 values below f16's normal range (subnormals, widened exactly on every target: F16C on
// AVX2 / AVX-512, bit arithmetic elsewhere) and near its largest: output within float32 rounding
// of the reference on each target.
TEST(DecodeHalf, F16SubnormalsAndLargeValuesWidenExactly) {
  const int64_t d = 40, n = 70;
  std::vector<float> v = Tensor::randn({1, 1, n, d}, 8).to_vector<float>();
  for (size_t i = 0; i < v.size(); ++i) v[i] *= i % 2 ? 1e-6f : 2e4f;  // 2^-24 .. 6e-5 and up to ~6e4
  KVCache cache({1, 1, d, n, d, DType::f16});
  cache.append(Tensor::randn({1, 1, n, d}, 7), Tensor::from_vector(v, {1, 1, n, d}));
  const auto widened = cache.values_f32().to_vector<float>();
  int64_t subnormal = 0;
  for (float x : widened) subnormal += x != 0.0f && std::fabs(x) < 6.1e-5f;
  EXPECT_GT(subnormal, n * d / 4);
  const Tensor q = Tensor::randn({1, 2, 1, d}, 9);
  const Tensor ref = decode_attention_reference(q, cache).output;
  test::for_each_target([&] { EXPECT_LE(max_abs_diff(decode_attention(q, cache).output, ref), 2e4 * 4e-7); });
}

}  // namespace
}  // namespace qkv
