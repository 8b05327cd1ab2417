// int8 KV caches (qkv/kv_cache.h): scales per position and group of 16 channels (KVCache::kInt8Group), the Highway
// kernels that read the int8 rows in place (attention/decode_rows-inl.h) on every SIMD target
// against the float64 reference on the dequantized cache, and states of the older
// per-position format.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
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

// Every SIMD target (AVX3, AVX2, the scalar fallback) against the reference, on head sizes with
// whole vectors and groups (128), a short last group and a lane tail (40 keys, 24 values), with
// G Lq rows in blocks of 4 and a remainder (Hq / Hk = 3, Lq = 2), contiguous and paged. D a
// multiple of 64 takes the integer score loops (128: AVX-512's own, 192: the generic one; with
// 6 rows and pages of 7 keys, their one-row and key remainders) and the shift-split value passes.
TEST(DecodeInt8, EveryTargetMatchesTheReference) {
  struct Case {
    int64_t d, dv, hq, lq, page;
  };
  for (const Case& cs : {Case{128, 128, 8, 1, 0}, Case{40, 24, 6, 2, 0}, Case{40, 24, 6, 2, 7}, Case{16, 8, 4, 1, 0},
                         Case{128, 128, 6, 2, 7}, Case{192, 64, 4, 1, 0}}) {
    SCOPED_TRACE("D " + std::to_string(cs.d) + " Dv " + std::to_string(cs.dv) + " page " + std::to_string(cs.page));
    KVCacheConfig c{2, 2, cs.d, 600, cs.dv, DType::i8};
    c.page_size = cs.page;
    test::expect_every_target_matches_the_reference(c, cs.hq, cs.lq);
  }
}

// One scale per 16 channels: a group of large keys (x 100) leaves the other groups' steps
// small, and every key / value dequantizes to within half a step of what was appended.
TEST(DecodeInt8, GroupScalesKeepSmallGroupsPrecise) {
  const int64_t d = 40, n = 50, g = KVCache::kInt8Group;
  ASSERT_EQ(g, 16);
  std::vector<float> k = Tensor::randn({1, 1, n, d}, 7).to_vector<float>();
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t c = 16; c < 32; ++c) k[j * d + c] *= 100.0f;  // group 1
  }
  const Tensor kt = Tensor::from_vector(k, {1, 1, n, d}), vt = Tensor::randn({1, 1, n, 40}, 8);
  KVCache cache({1, 1, d, n, 40, DType::i8});
  cache.append(kt, vt);
  EXPECT_EQ(cache.key_scales().shape(), (Shape{1, 1, n, 3}));  // 16 + 16 + 8 channels
  EXPECT_EQ(cache.value_scales().shape(), (Shape{1, 1, n, 3}));
  const auto ks = cache.key_scales().to_vector<float>(), vs = cache.value_scales().to_vector<float>();
  const auto spread = cache.key_spreads().to_vector<float>();
  const auto kd = cache.keys_f32().to_vector<float>(), vd = cache.values_f32().to_vector<float>();
  const auto v = vt.to_vector<float>();
  for (int64_t j = 0; j < n; ++j) {
    EXPECT_GT(ks[j * 3 + 1], 0.0f);
    for (int64_t c = 0; c < d; ++c) {
      const float step = ks[j * 3 + c / g] * spread[c];
      EXPECT_LE(std::fabs(kd[j * d + c] - k[j * d + c]), 0.5f * step * 1.001f + 1e-5f) << j << " " << c;
    }
    for (int64_t c = 0; c < 40; ++c) {
      EXPECT_LE(std::fabs(vd[j * 40 + c] - v[j * 40 + c]), 0.5f * vs[j * 3 + c / g] * 1.001f + 1e-6f);
    }
  }
  // after the spreads even the channels out, every group's largest |z| maps to 127: steps alike
  for (int64_t j = 0; j < n; ++j) EXPECT_LT(ks[j * 3 + 1], 3.0f * std::max(ks[j * 3], ks[j * 3 + 2]));
}

// A state saved before group scales ([B, Hk, n] key_scales / value_scales, one per position)
// loads with that scale in every group; a scale tensor of another shape is a clear error.
TEST(DecodeInt8, PerPositionStatesStillLoad) {
  KVCache cache({2, 2, 40, 30, 24, DType::i8});
  cache.append(Tensor::randn({2, 2, 20, 40}, 11), Tensor::randn({2, 2, 20, 24}, 12), {20, 9});
  std::map<std::string, Tensor> old = cache.state();
  old["key_scales"] = old.at("key_scales").select(3, 0).contiguous();  // [B, Hk, n]: group 0's scale
  old["value_scales"] = old.at("value_scales").select(3, 0).contiguous();
  const KVCache back = KVCache::from_state(old);
  EXPECT_EQ(back.lengths(), cache.lengths());
  EXPECT_EQ(back.key_scales().shape(), cache.key_scales().shape());
  const auto ks = back.key_scales().view({-1, 3}), vs = back.value_scales().view({-1, 2});  // 40 and 24 channels
  for (int64_t b = 0; b < 2; ++b) {
    const auto old_k = old.at("key_scales").select(0, b).select(0, 1).to_vector<float>();  // head 1: [n]
    const auto old_v = old.at("value_scales").select(0, b).select(0, 1).to_vector<float>();
    for (int64_t j = 0; j < back.length(b); ++j) {
      const int64_t r = back.row(b, 1, j);
      EXPECT_EQ(ks.select(0, r).to_vector<float>(), std::vector<float>(3, old_k[static_cast<size_t>(j)]));
      EXPECT_EQ(vs.select(0, r).to_vector<float>(), std::vector<float>(2, old_v[static_cast<size_t>(j)]));
    }
  }
  const Tensor q = Tensor::randn({2, 4, 1, 40}, 13);
  EXPECT_LE(max_abs_diff(decode_attention(q, back).output, decode_attention_reference(q, back).output), 2e-6);
  std::map<std::string, Tensor> bad = cache.state();
  bad["key_scales"] = Tensor::zeros({2, 2, 20, 5});
  EXPECT_THROW_WITH(KVCache::from_state(bad), ShapeError,
                    "KVCache.from_state: 'key_scales' must be [B, Hk, n, 3] (or [B, Hk, n]), got [2, 2, 20, 5]");
}

}  // namespace
}  // namespace qkv
