// KVCache::from_state (qkv/kv_cache.h) against states a cache cannot have written: each is a
// clear error naming the field, its value and the cache's geometry, never a cache whose stored keys
// sit at other positions than the file's. Oracles: the cache that wrote the state, and
// decode_attention_reference (float64) over it.
#include <gtest/gtest.h>

#include <limits>
#include <map>
#include <string>
#include <vector>

#include "attention/attention_test_configs.h"
#include "common/expect.h"
#include "qkv/kv_cache.h"

namespace qkv {
namespace {

using test::max_abs_diff;  // NaN-aware, shapes checked (attention_test_configs.h)

KVCacheConfig config(int64_t batch, int64_t capacity, int64_t window = 0, int64_t page_size = 0, int64_t pages = 0) {
  KVCacheConfig c{batch, 2, 8, capacity, 8, DType::f32};
  c.window = window, c.page_size = page_size, c.pages = pages;
  return c;
}

void fill(KVCache& cache, const std::vector<int64_t>& counts, uint64_t seed) {
  const KVCacheConfig& c = cache.config();
  int64_t t = 0;
  for (int64_t n : counts) t = std::max(t, n);
  cache.append(Tensor::randn({c.batch, c.kv_heads, t, c.head_dim}, seed),
               Tensor::randn({c.batch, c.kv_heads, t, c.value_dim}, seed + 1), counts);
}

Tensor positions(const std::vector<int64_t>& v) { return Tensor::from_vector(v, {static_cast<int64_t>(v.size())}); }

// A cache without a window stores every position from 0: a "first_kept" there loaded the file's
// keys at positions first_kept.. while decode read positions 0.. (zeros), and first_kept() said so.
TEST(KVCacheState, FirstKeptOnACacheWithoutAWindowIsAnError) {
  KVCache cache(config(2, 10));
  fill(cache, {6, 3}, 1);
  std::map<std::string, Tensor> s = cache.state();
  s["first_kept"] = positions({2, 0});
  EXPECT_THROW_WITH(KVCache::from_state(s), ValueError,
                    "KVCache.from_state: first_kept[0] = 2 for a cache without a window (window 0, capacity 10, "
                    "lengths[0] = 6), which stores every position from 0");
  s["first_kept"] = positions({0, 0});  // what it is: accepted, the same cache
  const KVCache back = KVCache::from_state(s);
  const Tensor q = Tensor::randn({2, 4, 1, 8}, 3);
  EXPECT_EQ(back.first_kept(0), 0);
  EXPECT_LE(max_abs_diff(decode_attention(q, back).output, decode_attention_reference(q, cache).output), 1e-6);
}

// A ring of `capacity` slots keeps positions max(0, n - capacity) .. n - 1 at most, and at least the
// window before n: a first_kept below was raised to n - capacity (the keys shifted by the
// difference), one above accepted (a cache no append or set_length makes), a list of another
// length read as far as it went.
TEST(KVCacheState, FirstKeptOutsideWhatTheRingKeepsIsAnError) {
  KVCache ring(config(2, 6, 4));
  fill(ring, {5, 5}, 1);
  fill(ring, {5, 1}, 3);  // lengths 10 and 6: first kept 4 and 0
  ASSERT_EQ(ring.first_kept(0), 4);
  ASSERT_EQ(ring.first_kept(1), 0);
  std::map<std::string, Tensor> s = ring.state();
  s["first_kept"] = positions({3, 0});
  EXPECT_THROW_WITH(KVCache::from_state(s), ValueError,
                    "KVCache.from_state: first_kept[0] = 3 is outside [4, 6] for lengths[0] = 10, window 4 and "
                    "capacity 6");
  s["first_kept"] = positions({7, 0});
  EXPECT_THROW_WITH(KVCache::from_state(s), ValueError, "first_kept[0] = 7 is outside [4, 6]");
  s["first_kept"] = positions({4, 3});
  EXPECT_THROW_WITH(KVCache::from_state(s), ValueError, "first_kept[1] = 3 is outside [0, 2] for lengths[1] = 6");
  s["first_kept"] = positions({4});
  EXPECT_THROW_WITH(KVCache::from_state(s), ShapeError,
                    "KVCache.from_state: 'first_kept' must hold one position per sequence (2), got 1");
  s["first_kept"] = positions({4, 0, 0});
  EXPECT_THROW_WITH(KVCache::from_state(s), ShapeError, "one position per sequence (2), got 3");
  s["lengths"] = positions({-1, 6});
  EXPECT_THROW_WITH(KVCache::from_state(s), ValueError, "KVCache.from_state: lengths[0] = -1 must be >= 0 (window 4)");
  s = ring.state();
  const KVCache back = KVCache::from_state(s);
  const Tensor q = Tensor::randn({2, 2, 1, 8}, 5);
  EXPECT_EQ(back.first_kept(0), 4);
  EXPECT_LE(max_abs_diff(decode_attention(q, back).output, decode_attention_reference(q, ring).output), 1e-6);
}

// A windowed paged cache that went back (first_kept = n - window > n - capacity) loads into a pool
// just large enough for it: from_state took pages for [n - capacity, n) before evicting, and a
// later sequence found the pool exhausted ("KVCache.set_length: the page pool is exhausted").
TEST(KVCacheState, PagedWindowAfterARollbackLoadsIntoATightPool) {
  KVCache paged(config(2, 8, 4, 4, 3));
  for (int64_t step = 0; step < 6; ++step) fill(paged, {0, 4}, 10 + 2 * static_cast<uint64_t>(step));  // 24
  paged.set_length(1, 20);  // keeps [16, 20): one page
  fill(paged, {8, 0}, 30);  // [0, 8): two pages
  ASSERT_EQ(paged.first_kept(1), 16);
  ASSERT_EQ(paged.free_pages(), 0);
  const KVCache back = KVCache::from_state(paged.state());
  EXPECT_EQ(back.free_pages(), 0);
  EXPECT_EQ(back.first_kept(1), 16);
  const Tensor q = Tensor::randn({2, 4, 1, 8}, 7);
  EXPECT_LE(max_abs_diff(decode_attention(q, back).output, decode_attention_reference(q, paged).output), 1e-6);
  std::map<std::string, Tensor> s = paged.state();
  s["pages"] = positions({2});
  EXPECT_THROW_WITH(KVCache::from_state(s), ValueError,
                    "KVCache.from_state: the sequences need 3 pages of 4 positions, 'pages' is 2");
}

// A 'rotary' layout other than 0 (neox) or 1 (gptj) loaded as gptj; int8 offsets or spreads a cache
// cannot take (it takes them over finite keys, spreads > 0) decoded every key of the head to NaN.
TEST(KVCacheState, RotaryLayoutsAndInt8SpreadsACacheCannotHaveAreErrors) {
  KVCacheConfig rc = config(1, 8);
  rc.rotary = CacheRotary{};
  KVCache rotary(rc);
  fill(rotary, {3}, 1);
  std::map<std::string, Tensor> s = rotary.state();
  s["rotary"] = Tensor::from_vector<double>({10000.0, 2.0, 0.0}, {3});
  EXPECT_THROW_WITH(KVCache::from_state(s), ValueError,
                    "KVCache.from_state: 'rotary' layout must be 0 (neox) or 1 (gptj), got 2");
  s["rotary"] = Tensor::from_vector<double>({10000.0, 1.0, 0.0}, {3});
  EXPECT_EQ(KVCache::from_state(s).config().rotary->layout, RotaryLayout::gptj);

  KVCacheConfig ic = config(1, 8);
  ic.dtype = DType::i8;
  KVCache int8(ic);
  fill(int8, {3}, 2);
  for (float bad : {0.0f, -1.0f, std::numeric_limits<float>::quiet_NaN()}) {
    SCOPED_TRACE(bad);
    s = int8.state();
    Tensor spreads = s["key_spreads"].clone();
    spreads.data<float>()[3] = bad;
    s["key_spreads"] = spreads;
    EXPECT_THROW_WITH(KVCache::from_state(s), ValueError,
                      "KVCache.from_state: 'key_offsets' must be finite and 'key_spreads' finite and > 0, got");
  }
  s = int8.state();
  Tensor offsets = s["key_offsets"].clone();
  offsets.data<float>()[0] = std::numeric_limits<float>::infinity();
  s["key_offsets"] = offsets;
  EXPECT_THROW_WITH(KVCache::from_state(s), ValueError, "at flat index 0 of [1, 2, 8]");
}

// Entries of a dtype or rank no cache writes: integer int8 scales were converted as they were (an
// int8 scale 1 for 0.0079: every key and value of the file ~127x too large), a [1, 3] rotary entry
// read as its 3 values; and errors of the cache's own checks while loading named "KVCache:".
TEST(KVCacheState, EntriesOfAnotherDtypeOrRankAndTheCachesChecksNameFromState) {
  KVCache int8({2, 2, 32, 8, 32, DType::i8});
  fill(int8, {3, 2}, 5);
  const std::map<std::string, Tensor> good = int8.state();
  for (const char* name : {"key_scales", "value_scales", "key_offsets", "key_spreads"}) {
    std::map<std::string, Tensor> s = good;
    s[name] = good.at(name).to(DType::i8);
    EXPECT_THROW_WITH(KVCache::from_state(s), DTypeError,
                      "KVCache.from_state: '" + std::string(name) + "' must be floating point, got int8 [2, 2, ");
  }
  KVCacheConfig rc = config(1, 8);
  rc.rotary = CacheRotary{};
  KVCache rotary(rc);
  fill(rotary, {3}, 6);
  std::map<std::string, Tensor> s = rotary.state();
  s["rotary"] = rotary.state().at("rotary").reshape({1, 3});
  EXPECT_THROW_WITH(KVCache::from_state(s), ShapeError,
                    "KVCache.from_state: 'rotary' must be 1-D [base, layout, rotary_dim], got [1, 3]");
  s["rotary"] = Tensor::from_vector<int64_t>({10000, 0, 8}, {3});
  EXPECT_THROW_WITH(KVCache::from_state(s), DTypeError,
                    "KVCache.from_state: 'rotary' must be floating point, got int64");
  s["rotary"] = Tensor::from_vector<double>({10000.0, 0.0, 3.0}, {3});
  EXPECT_THROW_WITH(KVCache::from_state(s), ValueError, "KVCache.from_state: rotary_dim must be even and <= head_dim");
  s["rotary"] = rotary.state().at("rotary");
  EXPECT_EQ(max_abs_diff(KVCache::from_state(s).keys(), rotary.keys()), 0.0);  // the good state still loads
  s["window"] = Tensor::from_vector<int64_t>({20}, {1});
  EXPECT_THROW_WITH(
      KVCache::from_state(s), ValueError,
      "KVCache.from_state: window, page_size and pages must be >= 0 and capacity >= window; got window 20");
  s.erase("window");
  s["keys"] = rotary.state().at("keys").to(DType::f64), s["values"] = rotary.state().at("values").to(DType::f64);
  EXPECT_THROW_WITH(KVCache::from_state(s), DTypeError,
                    "KVCache.from_state: dtype must be float32, bfloat16, float16 or int8, got float64");
}

}  // namespace
}  // namespace qkv
