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
#include "attention/decode_rows.h"
#include "attention/decode_targets.h"
#include "common/expect.h"
#include "common/simd_targets.h"
#include "common/thread_guard.h"
#include "qkv/kv_cache.h"
#include "softmax/softmax_cpu.h"

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

// Long caches take long work items (decode_cpu.cc's int8_chunk_max: up to 8192 keys where the
// kernels read each key and value row once: 1 or 4 query rows a cache head): sequences of 9000
// and 5001 keys (a whole 8192-key chunk, its rest, shorter chunks), G = 4 and 1, on 1 and 2
// threads, within 2e-6 plus the value rounding's bound of the float64 reference, as the short
// caches above.
TEST(DecodeInt8, LongCachesTakeLongChunks) {
  KVCache cache({2, 4, 128, 9000, 128, DType::i8});
  cache.append(Tensor::randn({2, 4, 6000, 128}, 21), Tensor::randn({2, 4, 6000, 128}, 22), {6000, 5000});
  cache.append(Tensor::randn({2, 4, 3000, 128}, 23), Tensor::randn({2, 4, 3000, 128}, 24), {3000, 1});
  for (int64_t hq : {16, 4}) {
    const Tensor q = Tensor::randn({2, hq, 1, 128}, 25);
    const std::vector<double> ref = decode_attention_reference(q, cache).output.to_vector<double>();
    const std::vector<double> rounding = test::int8_rounding_bound(cache, q);
    for (int threads : {1, 2}) {
      const test::ThreadCountGuard guard;
      set_num_threads(threads);
      const std::vector<double> out = decode_attention(q, cache).output.to_vector<double>();
      double worst = -1.0;  // the largest excess over 2e-6 plus the bound: <= 0 expected
      for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(out[i] - ref[i]) - 2e-6 - rounding[i]);
      EXPECT_LE(worst, 0.0) << "Hq " << hq << ", " << threads << " threads";
    }
  }
}

// int8_values as decode_rows.h states it, in float64 (rows [rows, n] of p, values [n, dv] with
// scales s [n, dv / 16]): with `rounded` each block of kInt8ValueKeys keys adds tau sum_j w v
// with w = round((p inv) s) (an odd last key p s v), else sum_j p s v; `size` gets sum_j p s |v|.
std::vector<double> int8_values_arithmetic(const std::vector<float>& p, int64_t rows, const std::vector<int8_t>& v,
                                           const std::vector<bfloat16>& s, int64_t n, int64_t dv, bool rounded,
                                           std::vector<double>& size) {
  const int64_t groups = dv / KVCache::kInt8Group;
  std::vector<double> out(static_cast<size_t>(rows * dv), 0.0);
  size.assign(out.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j0 = 0; j0 < n; j0 += attention::kInt8ValueKeys) {
      const int64_t j1 = std::min(n, j0 + attention::kInt8ValueKeys), paired = rounded ? j0 + (j1 - j0) / 2 * 2 : j0;
      float pmax = 0.0f, smax = 0.0f;
      for (int64_t j = j0; j < j1; ++j) {
        pmax = std::max(pmax, p[r * n + j]);
        for (int64_t g = 0; g < groups; ++g) smax = std::max(smax, static_cast<float>(s[j * groups + g]));
      }
      const float big = pmax * smax, tau = big / 32767.0f, inv = big > 0.0f ? 32767.0f / big : 0.0f;
      std::vector<double> sum(static_cast<size_t>(dv), 0.0);  // of w v
      for (int64_t j = j0; j < j1; ++j) {
        const float pw = p[r * n + j] * inv;
        for (int64_t c = 0; c < dv; ++c) {
          const double sc = static_cast<float>(s[j * groups + c / KVCache::kInt8Group]), x = v[j * dv + c];
          if (j < paired) {
            sum[c] += std::nearbyint(pw * sc) * x;
          } else {
            out[r * dv + c] += static_cast<double>(p[r * n + j]) * sc * x;
          }
          size[r * dv + c] += p[r * n + j] * sc * std::fabs(x);
        }
      }
      for (int64_t c = 0; c < dv; ++c) out[r * dv + c] += tau * sum[c];
    }
  }
  return out;
}

// int8_values (attention/decode_rows.h) on every SIMD target against int8_values_arithmetic:
// AVX-512 and AVX2 round the weights (dv a multiple of 64), the scalar target does not. The
// int32 sums are exact, so kernel and loop differ by float32 rounding only: the conversions and
// scalings of 3 blocks (under 1e-6 of sum p s |v|), or with float products the sum over n keys
// ((n + 2) 2^-24 of it). The weights' rounding itself moves outputs by more than 5e-6 of that
// (7e-6 to 9e-6 here, checked: the test tells the two arithmetics apart). 6 rows (4 together, 2 alone), 301 keys
// (2 whole blocks and 45 keys: an odd last key), dv = 128 (8 groups: 8-lane weights), 64 and
// 192 (4 and 12: 4-lane weights); zero probabilities (masked keys) and a row of them.
TEST(DecodeInt8, ValuesFollowTheirRoundedArithmetic) {
  const int64_t rows = 6, n = 301;
  for (int64_t dv : {128, 64, 192}) {
    SCOPED_TRACE("dv " + std::to_string(dv));
    const int64_t groups = dv / KVCache::kInt8Group;
    std::vector<float> p = Tensor::randn({rows, n}, 21).to_vector<float>();
    for (int64_t i = 0; i < rows * n; ++i) p[i] = i % 7 == 3 || i / n == 4 ? 0.0f : std::exp(-std::fabs(p[i]));
    std::vector<int8_t> v;
    for (float x : Tensor::randn({n, dv}, 22).to_vector<float>())
      v.push_back(static_cast<int8_t>(std::clamp(std::nearbyint(40.0f * x), -127.0f, 127.0f)));
    std::vector<bfloat16> s;
    for (float x : Tensor::randn({n, groups}, 23).to_vector<float>())
      s.push_back(bfloat16(0.01f + 0.005f * std::fabs(x)));
    std::vector<double> size;
    const std::vector<double> exact = int8_values_arithmetic(p, rows, v, s, n, dv, false, size);
    const std::vector<double> rounded = int8_values_arithmetic(p, rows, v, s, n, dv, true, size);
    double apart = 0.0;  // the rounding's largest move, relative to size
    for (size_t i = 0; i < size.size(); ++i)
      apart = std::max(apart, std::fabs(rounded[i] - exact[i]) / (size[i] + 1e-30));
    EXPECT_GT(apart, 5e-6);
    test::for_each_target([&] {
      const std::string name = kernels::detail::simd_target_name(kernels::detail::simd_targets().front());
      const bool pairs = name == "AVX3_DL" || name == "AVX3" || name == "AVX2";
      std::vector<float> o(static_cast<size_t>(rows * dv), 0.0f);
      attention::int8_values(p.data(), n, rows, v.data(), s.data(), n, dv, nullptr, o.data());
      const std::vector<double>& want = pairs ? rounded : exact;
      const double tol = pairs ? 1e-6 : (n + 2) * std::ldexp(1.0, -24);
      double worst = 0.0;
      for (size_t i = 0; i < o.size(); ++i) worst = std::max(worst, std::fabs(o[i] - want[i]) - tol * size[i]);
      EXPECT_LE(worst, 1e-12);
    });
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
