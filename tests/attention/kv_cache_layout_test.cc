// KVCache layouts and fused rotary (qkv/kv_cache.h): a sliding-window ring against a full cache
// decoded with the same window mask, rotary in the cache against apply_rotary + decode, and a
// paged cache against the contiguous one (bit for bit), each on ragged batches; state round trips.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "attention/attention_test_configs.h"
#include "common/expect.h"
#include "common/simd_targets.h"
#include "qkv/kv_cache.h"
#include "qkv/rotary.h"

namespace qkv {
namespace {

using test::max_abs_diff;  // NaN-aware, shapes checked (attention_test_configs.h)

// Appends the same `steps` ragged random blocks (up to `t` positions each) to every cache.
void feed(const std::vector<KVCache*>& caches, int64_t steps, int64_t t, uint64_t seed) {
  const KVCacheConfig& c = caches[0]->config();
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<int64_t> counts;
    for (int64_t b = 0; b < c.batch; ++b) counts.push_back((static_cast<int64_t>(seed) + 7 * s + 3 * b) % (t + 1));
    const Tensor k = Tensor::randn({c.batch, c.kv_heads, t, c.head_dim}, seed + 2 * s);
    const Tensor v = Tensor::randn({c.batch, c.kv_heads, t, c.value_dim}, seed + 2 * s + 1);
    for (KVCache* cache : caches) cache->append(k, v, counts);
  }
}

KVCacheConfig config(int64_t b, int64_t capacity, DType dtype, int64_t window = 0) {
  KVCacheConfig c{b, 2, 16, capacity, 8, dtype};
  c.window = window;
  return c;
}

TEST(KVCacheWindow, RingEqualsAFullCacheWithTheWindowMask) {
  struct Case {
    int64_t window, capacity, lq, chunk;
    DType dtype;
  };
  const std::vector<Case> cases = {{16, 16, 1, 0, DType::f32}, {20, 37, 3, 0, DType::f32},  {9, 12, 2, 4, DType::f32},
                                   {33, 40, 1, 0, DType::f32}, {20, 24, 1, 0, DType::bf16}, {16, 20, 1, 0, DType::i8}};
  for (const Case& cs : cases) {
    const DType dt = cs.dtype;
    SCOPED_TRACE("window " + std::to_string(cs.window) + " capacity " + std::to_string(cs.capacity));
    KVCache ring(config(3, cs.capacity, dt, cs.window)), full(config(3, 400, dt));
    const void* storage = ring.keys().raw_data();
    feed({&ring, &full}, 30, 11, 5);
    EXPECT_EQ(ring.lengths(), full.lengths());
    EXPECT_GT(*std::max_element(ring.lengths().begin(), ring.lengths().end()), 3 * cs.capacity);  // wrapped
    EXPECT_EQ(ring.keys().raw_data(), storage);                                                   // never reallocated
    const Tensor q = Tensor::randn({3, 4, cs.lq, 16}, 9);
    for (int64_t w : {int64_t{0}, cs.window / 2}) {
      DecodeOptions o, masked;
      o.window = w, o.chunk = masked.chunk = cs.chunk;
      masked.window = w > 0 ? w : cs.window;
      const Tensor got = decode_attention(q, ring, o).output, ref = decode_attention_reference(q, ring, o).output;
      EXPECT_LE(max_abs_diff(got, ref), 2e-6) << w;
      EXPECT_LE(max_abs_diff(got, decode_attention(q, full, masked).output), 2e-6) << w;
      EXPECT_LE(max_abs_diff(ref, decode_attention_reference(q, full, masked).output), 1e-12) << w;
    }
    const Tensor narrow = decode_attention(q, ring, DecodeOptions{std::nullopt, true, 3}).output;
    EXPECT_GT(max_abs_diff(narrow, decode_attention(q, ring).output), 1e-3);  // the window matters
  }
}

TEST(KVCacheWindow, LongAppendsStateAndErrors) {
  KVCache ring(config(2, 10, DType::f32, 8)), full(config(2, 100, DType::f32));
  const Tensor k = Tensor::randn({2, 2, 25, 16}, 1), v = Tensor::randn({2, 2, 25, 8}, 2);
  ring.append(k, v, {25, 4});  // more than the ring holds at once: its last 10 positions
  full.append(k, v, {25, 4});
  EXPECT_EQ(ring.first_kept(0), 15);
  EXPECT_EQ(max_abs_diff(ring.sequence_keys(0), full.sequence_keys(0).slice(1, 15, 25)), 0.0);
  const Tensor q = Tensor::randn({2, 2, 1, 16}, 3);
  const Tensor want = decode_attention(q, full, DecodeOptions{std::nullopt, true, 8}).output;
  EXPECT_LE(max_abs_diff(decode_attention(q, ring).output, want), 2e-6);

  KVCache back = KVCache::from_state(ring.state());
  EXPECT_EQ(back.config().window, 8);
  EXPECT_EQ(back.lengths(), ring.lengths());
  EXPECT_EQ(max_abs_diff(decode_attention(q, back).output, decode_attention(q, ring).output), 0.0);
  feed({&back, &ring}, 3, 7, 4);
  EXPECT_EQ(max_abs_diff(decode_attention(q, back).output, decode_attention(q, ring).output), 0.0);

  EXPECT_THROW_WITH(KVCache(config(1, 4, DType::f32, 8)), ValueError, "capacity >= window");
  EXPECT_THROW_WITH(decode_attention(q, ring, DecodeOptions{std::nullopt, true, 9}), ValueError,
                    "decode_attention: window 9 is wider than the cache's window 8");
  EXPECT_THROW_WITH(decode_attention(Tensor::zeros({2, 2, 4, 16}), ring), ValueError,
                    "decode_attention: 4 queries with a window of 8 need a cache capacity of at least 11");
  EXPECT_THROW_WITH(ring.set_length(0, 5), ValueError, "were evicted");
}

// Speculative decoding rolls back rejected tokens: a ring's set_length going back keeps the
// positions it still has, decodes as a full cache would, refuses queries whose keys are gone.
TEST(KVCacheWindow, GoingBackKeepsWhatIsStored) {
  KVCache ring(config(1, 20, DType::f32, 16)), full(config(1, 100, DType::f32));
  const Tensor k = Tensor::randn({1, 2, 50, 16}, 5), v = Tensor::randn({1, 2, 50, 8}, 6);
  ring.append(k, v);
  full.append(k, v);
  ring.set_length(0, 46);
  full.set_length(0, 46);
  EXPECT_EQ(ring.first_kept(0), 30);
  const DecodeOptions w16{std::nullopt, true, 16};
  const Tensor q = Tensor::randn({1, 4, 1, 16}, 7);
  EXPECT_LE(max_abs_diff(decode_attention(q, ring).output, decode_attention(q, full, w16).output), 2e-6);
  EXPECT_THROW_WITH(decode_attention(Tensor::randn({1, 4, 3, 16}, 8), ring), ValueError,
                    "decode_attention: sequence 0's queries need keys from position 28, the cache keeps them from 30");
  const KVCache back = KVCache::from_state(ring.state());
  EXPECT_EQ(back.first_kept(0), 30);
  EXPECT_EQ(max_abs_diff(decode_attention(q, back).output, decode_attention(q, ring).output), 0.0);
  ring.append(k.slice(2, 0, 7), v.slice(2, 0, 7));
  full.append(k.slice(2, 0, 7), v.slice(2, 0, 7));
  EXPECT_EQ(ring.first_kept(0), 33);
  const Tensor q3 = Tensor::randn({1, 4, 3, 16}, 9);
  EXPECT_LE(max_abs_diff(decode_attention(q3, ring).output, decode_attention(q3, full, w16).output), 2e-6);
}

// Rotary in the cache: keys rotated on append at their absolute positions, q in the kernel;
// equal to apply_rotary by hand on a plain cache, and to the float64 reference.
TEST(KVCacheRotary, FusedEqualsApplyRotaryThenDecode) {
  for (RotaryLayout layout : {RotaryLayout::neox, RotaryLayout::gptj}) {
    for (int64_t rd : {0, 8}) {
      for (int64_t window : {0, 12}) {
        SCOPED_TRACE(std::to_string(static_cast<int>(layout)) + " " + std::to_string(rd) + " " +
                     std::to_string(window));
        KVCacheConfig rc = config(3, window > 0 ? 16 : 200, DType::f32, window);
        rc.rotary = CacheRotary{500000.0, layout, rd};
        KVCache fused(rc), plain(config(3, 200, DType::f32));
        RotaryOptions ro;
        ro.base = 500000.0, ro.layout = layout, ro.rotary_dim = rd;
        for (int64_t s = 0; s < 12; ++s) {
          const std::vector<int64_t> counts = {s % 5, 3, (2 * s) % 6};
          const Tensor k = Tensor::randn({3, 2, 5, 16}, 20 + s), v = Tensor::randn({3, 2, 5, 8}, 40 + s);
          std::vector<int64_t> pos;  // [B, T]: each sequence's next positions
          for (int64_t b = 0; b < 3; ++b) {
            for (int64_t t = 0; t < 5; ++t) pos.push_back(plain.length(b) + t);
          }
          ro.positions = Tensor::from_vector(pos, {3, 5});
          fused.append(k, v, counts);
          plain.append(apply_rotary(k, ro), v, counts);
        }
        const int64_t lq = 2;
        const Tensor q = Tensor::randn({3, 4, lq, 16}, 60);
        std::vector<int64_t> qpos;
        for (int64_t b = 0; b < 3; ++b) {
          for (int64_t t = 0; t < lq; ++t) qpos.push_back(plain.length(b) - lq + t);
        }
        ro.positions = Tensor::from_vector(qpos, {3, lq});
        const DecodeOptions o{std::nullopt, true, window};
        const Tensor got = decode_attention(q, fused).output;
        EXPECT_LE(max_abs_diff(got, decode_attention(apply_rotary(q, ro), plain, o).output), 1e-6);
        EXPECT_LE(max_abs_diff(got, decode_attention_reference(q, fused).output), 2e-6);
        EXPECT_GT(max_abs_diff(got, decode_attention(q, plain, o).output), 1e-3);  // q was rotated
        const KVCache back = KVCache::from_state(fused.state());
        EXPECT_EQ(max_abs_diff(decode_attention(q, back).output, got), 0.0);
      }
    }
  }
  KVCacheConfig bad = config(1, 4, DType::f32);
  bad.rotary = CacheRotary{10000.0, RotaryLayout::neox, 5};
  EXPECT_THROW_WITH(KVCache{bad}, ValueError, "KVCache: rotary_dim must be even and <= head_dim = 16 (got 5)");
}

// A paged cache (pages taken from the pool as sequences grow, the sequences' pages interleaved)
// decodes to the contiguous cache's bits: same work items, rows gathered where a chunk spans pages.
TEST(KVCachePaged, EqualsTheContiguousCacheBitForBit) {
  for (DType dt : {DType::f32, DType::bf16, DType::i8}) {
    for (int64_t page : {1, 7, 16, 64, 256, 1000}) {
      if (dt != DType::f32 && page != 7 && page != 256) continue;
      SCOPED_TRACE(std::string(dtype_name(dt)) + " page " + std::to_string(page));
      KVCacheConfig pc = config(3, 1200, dt);
      pc.page_size = page;
      KVCache paged(pc), flat(config(3, 1200, dt));
      feed({&paged, &flat}, 12, 90, 11);
      EXPECT_EQ(paged.lengths(), flat.lengths());
      int64_t used = 0;
      for (int64_t b = 0; b < 3; ++b) {
        EXPECT_EQ(static_cast<int64_t>(paged.block_table(b).size()), (paged.length(b) + page - 1) / page);
        used += static_cast<int64_t>(paged.block_table(b).size());
        EXPECT_EQ(max_abs_diff(paged.sequence_keys(b), flat.sequence_keys(b)), 0.0);
      }
      EXPECT_EQ(paged.free_pages(), paged.config().pages - used);
      DecodeOptions medium;  // bf16: the native bf16 GEMMs on gathered bf16 rows
      medium.matmul_precision = MatmulPrecision::medium;
      for (int64_t lq : {1, 3}) {
        const Tensor q = Tensor::randn({3, 4, lq, 16}, 12 + lq);
        for (const DecodeOptions& o :
             {DecodeOptions{}, DecodeOptions{std::nullopt, true, 50}, DecodeOptions{0.2, false},
              DecodeOptions{std::nullopt, true, 0, 0.0, 7}, medium}) {
          EXPECT_EQ(max_abs_diff(decode_attention(q, paged, o).output, decode_attention(q, flat, o).output), 0.0);
        }
        if (page == 7) {
          EXPECT_EQ(
              max_abs_diff(decode_attention_reference(q, paged).output, decode_attention_reference(q, flat).output),
              0.0);
        }
      }
      const KVCache back = KVCache::from_state(paged.state());
      EXPECT_EQ(back.config().page_size, page);
      const Tensor q = Tensor::randn({3, 4, 1, 16}, 19);
      EXPECT_EQ(max_abs_diff(decode_attention(q, back).output, decode_attention(q, flat).output), 0.0);
    }
  }
}

// The same at a real head size (D = Dv = 128: the 16-bit and int8 kernels' vector passes and the
// int8 pair blocks, which Dv = 8 above leaves to the lane-by-lane loops on AVX-512) and 4 query
// heads a cache head (the 4-row score loops), on every SIMD target: pages that split the int8
// value blocks (7, 16) and items that do not start on one (chunk 300). Run by run, the value
// accumulators restarted at each page, the int8 blocks at each page and the last 1-3 keys of a
// run took another reduction: 1e-7 to 6e-4 apart.
TEST(KVCachePaged, EqualsTheContiguousCacheBitForBitAtHeadSize128) {
  test::for_each_target([] {
    for (DType dt : {DType::bf16, DType::f16, DType::i8}) {
      for (int64_t page : {7, 16, 256}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " page " + std::to_string(page));
        KVCacheConfig fc{3, 2, 128, 700, 128, dt}, pc = fc;
        pc.page_size = page;
        KVCache paged(pc), flat(fc);
        feed({&paged, &flat}, 8, 90, 5);
        for (int64_t hq : {2, 8}) {
          const Tensor q = Tensor::randn({3, hq, 1, 128}, 40 + hq);
          for (int64_t chunk : {0, 300}) {
            DecodeOptions o;
            o.chunk = chunk;
            EXPECT_EQ(max_abs_diff(decode_attention(q, paged, o).output, decode_attention(q, flat, o).output), 0.0)
                << hq << " query heads, chunk " << chunk;
          }
        }
      }
    }
  });
}

TEST(KVCachePaged, PoolExhaustionAndReturningPages) {
  KVCacheConfig c = config(2, 16, DType::f32);
  c.page_size = 4, c.pages = 5;
  KVCache cache(c);
  const Tensor k = Tensor::randn({2, 2, 12, 16}, 1), v = Tensor::randn({2, 2, 12, 8}, 2);
  cache.append(k, v, {12, 0});  // 3 pages
  EXPECT_EQ(cache.free_pages(), 2);
  EXPECT_THROW_WITH(cache.append(k, v, {0, 12}), ValueError,
                    "KVCache.append: the page pool is exhausted: this append needs 3 more pages of 4 positions, 2 of "
                    "5 are free");
  EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{12, 0}));
  cache.set_length(0, 4);  // two pages back to the pool
  EXPECT_EQ(cache.free_pages(), 4);
  cache.append(k, v, {0, 12});
  EXPECT_EQ(cache.free_pages(), 1);
  KVCache flat(config(2, 16, DType::f32));
  flat.append(k, v, {4, 12});
  const Tensor q = Tensor::randn({2, 2, 1, 16}, 3);
  EXPECT_EQ(max_abs_diff(decode_attention(q, cache).output, decode_attention(q, flat).output), 0.0);
  EXPECT_THROW_WITH(cache.append(k, v, {0, 5}), ValueError, "past the capacity 16");
  cache.reset();
  EXPECT_EQ(cache.free_pages(), 5);
}

// A sequence with no keys yet beside others: its rows are 0 (qkv/kv_cache.h: rows with no key give
// 0), the others' softmax over their keys, written out in double from the appended k and v. A
// paged sequence of length 0 has no page: its empty work item read block_table(b)[0] (a crash).
TEST(KVCachePaged, EmptySequencesDecodeToZeroRows) {
  for (DType dt : {DType::f32, DType::bf16, DType::i8}) {
    for (int64_t page : {0, 4}) {
      for (int64_t window : {0, 8}) {
        SCOPED_TRACE(std::string(dtype_name(dt)) + " page " + std::to_string(page) + " window " +
                     std::to_string(window));
        KVCacheConfig c = config(3, 12, dt, window);
        c.page_size = page;
        KVCache cache(c);
        const Tensor k = Tensor::randn({3, 2, 5, 16}, 1), v = Tensor::randn({3, 2, 5, 8}, 2);  // [B, Hk, T, D]
        cache.append(k, v, {0, 5, 0});
        for (int64_t lq : {1, 2}) {
          const Tensor q = Tensor::randn({3, 4, lq, 16}, 3);  // [B, Hq, Lq, D]
          const std::vector<float> out = decode_attention(q, cache).output.to_vector<float>();
          const std::vector<float> qv = q.to_vector<float>(), kv = k.to_vector<float>(), vv = v.to_vector<float>();
          double worst = 0.0;
          for (int64_t h = 0; h < 4; ++h) {
            for (int64_t t = 0; t < lq; ++t) {
              EXPECT_EQ(out[((0 * 4 + h) * lq + t) * 8], 0.0f);
              EXPECT_EQ(out[((2 * 4 + h) * lq + t) * 8 + 7], 0.0f);
              const int64_t keys = 5 - lq + t + 1;  // sequence 1, causal: keys 0 .. position
              std::vector<double> p(static_cast<size_t>(keys));
              double sum = 0.0;
              for (int64_t j = 0; j < keys; ++j) {
                double dot = 0.0;
                for (int64_t x = 0; x < 16; ++x) {
                  dot += qv[((4 + h) * lq + t) * 16 + x] * static_cast<double>(kv[((2 + h / 2) * 5 + j) * 16 + x]);
                }
                sum += (p[j] = std::exp(dot / 4.0));
              }
              for (int64_t x = 0; x < 8; ++x) {
                double want = 0.0;
                for (int64_t j = 0; j < keys; ++j) want += p[j] / sum * vv[((2 + h / 2) * 5 + j) * 8 + x];
                worst = std::max(worst, std::abs(want - out[((4 + h) * lq + t) * 8 + x]));
              }
            }
          }
          EXPECT_LT(worst, dt == DType::f32 ? 1e-5 : dt == DType::bf16 ? 2e-2 : 5e-2);
        }
      }
    }
  }
  // No sequences at all: an empty result (the automatic chunk divided by B Hk = 0: SIGFPE).
  for (int64_t page : {0, 4}) {
    KVCacheConfig none = config(0, 12, DType::f32);
    none.page_size = page;
    const KVCache empty(none);
    EXPECT_EQ(decode_attention(Tensor::randn({0, 4, 1, 16}, 4), empty).output.shape(), (Shape{0, 4, 1, 8}));
  }
}

// Bad sequence indices, an odd head_dim under full rotary and int8 offsets of the wrong shape are
// clear errors: they were std::vector range errors, an error only at the first append (from
// apply_rotary), and a [B, Hk, 1] spread broadcast over every channel.
TEST(KVCacheErrors, SequenceIndicesRotaryAndInt8StateShapes) {
  KVCacheConfig pc = config(2, 8, DType::f32);
  pc.page_size = 4;
  const KVCache paged(pc);
  EXPECT_THROW_WITH(paged.block_table(2), IndexError, "KVCache.block_table: sequence 2 is outside [0, 2)");
  EXPECT_THROW_WITH(paged.first_kept(-1), IndexError, "KVCache.first_kept: sequence -1 is outside [0, 2)");
  EXPECT_THROW_WITH(paged.length(2), IndexError, "KVCache.length: sequence 2 is outside [0, 2)");
  EXPECT_THROW_WITH(paged.sequence_keys(9), IndexError, "KVCache.sequence_keys: sequence 9 is outside [0, 2)");
  EXPECT_THROW_WITH(paged.sequence_values(-3), IndexError, "KVCache.sequence_values: sequence -3 is outside [0, 2)");
  KVCacheConfig odd{1, 1, 7, 8};
  odd.rotary = CacheRotary{};
  EXPECT_THROW_WITH(KVCache{odd}, ValueError,
                    "KVCache: rotary_dim must be even and <= head_dim = 7 (got 0: all of head_dim)");
  odd.rotary->rotary_dim = 4;  // a partial rotary_dim may leave an odd head_dim
  EXPECT_EQ(KVCache{odd}.config().head_dim, 7);
  KVCache int8(config(2, 8, DType::i8));
  int8.append(Tensor::randn({2, 2, 3, 16}, 1), Tensor::randn({2, 2, 3, 8}, 2));
  std::map<std::string, Tensor> state = int8.state();
  state["key_spreads"] = Tensor::ones({2, 2, 1});
  EXPECT_THROW_WITH(KVCache::from_state(state), ShapeError,
                    "KVCache.from_state: 'key_spreads' must be [2, 2, 16] for keys [2, 2, 3, 16], got [2, 2, 1]");
}

// A window over pages: the pages a sequence's window leaves go back to the pool (block table -1),
// and it decodes to the ring's bits, through a rollback and a state round trip.
TEST(KVCachePaged, WindowedPagesEqualTheRing) {
  for (int64_t page : {1, 7, 32}) {
    SCOPED_TRACE("page " + std::to_string(page));
    KVCacheConfig pc = config(3, 20, DType::f32, 16);
    pc.page_size = page;
    KVCache paged(pc), ring(config(3, 20, DType::f32, 16));
    feed({&paged, &ring}, 25, 9, 5);
    const Tensor q = Tensor::randn({3, 4, 2, 16}, 9);
    EXPECT_EQ(max_abs_diff(decode_attention(q, paged).output, decode_attention(q, ring).output), 0.0);
    int64_t held = 0;
    for (int64_t b = 0; b < 3; ++b) {
      const auto& blocks = paged.block_table(b);
      const auto live = std::count_if(blocks.begin(), blocks.end(), [](int64_t p) { return p >= 0; });
      EXPECT_LE(live, (20 + page - 1) / page + 1);  // the window's pages only
      held += live;
    }
    EXPECT_EQ(paged.free_pages(), paged.config().pages - held);
    paged.set_length(1, paged.length(1) - 2);  // a rollback
    ring.set_length(1, ring.length(1) - 2);
    const KVCache back = KVCache::from_state(paged.state());
    const Tensor q1 = Tensor::randn({3, 4, 1, 16}, 10);
    EXPECT_EQ(max_abs_diff(decode_attention(q1, back).output, decode_attention(q1, ring).output), 0.0);
    feed({&paged, &ring}, 5, 9, 6);
    EXPECT_EQ(max_abs_diff(decode_attention(q1, paged).output, decode_attention(q1, ring).output), 0.0);
  }
}

// A ring's lengths count absolute positions without a limit: near 2^63 - 1 an append's length,
// its chunks' ends and its runs' ends overflowed (UB: lengths wrapped negative, rows written before
// the storage), the reference looped over every position from 0; rotary positions past 2^53 turned
// at neighbouring positions. Now: ValueErrors naming the sequence and the positions, and a ring at
// length 2^63 - 1 decodes as the float64 reference does.
TEST(KVCacheWindow, LengthsNearTheInt64LimitAreCheckedNotWrapped) {
  constexpr int64_t kMost = std::numeric_limits<int64_t>::max();
  KVCache ring(config(1, 6, DType::f32, 4));
  feed({&ring}, 2, 3, 1);
  ring.set_length(0, kMost - 1);
  const Tensor k = Tensor::randn({1, 2, 2, 16}, 2), v = Tensor::randn({1, 2, 2, 8}, 3);
  EXPECT_THROW_WITH(ring.append(k, v), ValueError,
                    "KVCache.append: sequence 0's length 9223372036854775806 + 2 new positions passes 2^63 - 1");
  EXPECT_EQ(ring.length(0), kMost - 1);  // nothing written
  ring.append(k, v, {1});
  EXPECT_EQ(ring.length(0), kMost);
  const Tensor q = Tensor::randn({1, 4, 2, 16}, 4);
  EXPECT_LE(max_abs_diff(decode_attention(q, ring).output, decode_attention_reference(q, ring).output), 1e-5);

  KVCacheConfig rc = config(1, 6, DType::f32, 4);
  rc.rotary = CacheRotary{};
  KVCache rotary(rc);
  rotary.set_length(0, kMaxRotaryPosition - 1);
  const Tensor k3 = Tensor::randn({1, 2, 3, 16}, 5), v3 = Tensor::randn({1, 2, 3, 8}, 6);
  EXPECT_THROW_WITH(rotary.append(k3, v3), ValueError,
                    "KVCache.append: sequence 0's rotary positions 9007199254740991 .. 9007199254740993 pass 2^53 = "
                    "9007199254740992");
  rotary.append(k3, v3, {2});  // positions up to 2^53: the rows past counts do not count
  EXPECT_EQ(rotary.length(0), kMaxRotaryPosition + 1);
  const Tensor q1 = Tensor::randn({1, 2, 1, 16}, 7);
  // not against the reference: its angles p / base^(2i/rd) and the kernel's p base^(-2i/rd) may be
  // an ulp apart, ~1 rad at 2^53 (qkv/rotary.h); rotary_test.cc compares them at 2^29
  for (float x : decode_attention(q1, rotary).output.to_vector<float>()) EXPECT_TRUE(std::isfinite(x));
  rotary.set_length(0, kMaxRotaryPosition + 2);
  EXPECT_THROW_WITH(decode_attention(q1, rotary), ValueError,
                    "decode_attention: sequence 0's queries reach position 9007199254740993, past the rotary limit");
}

// A sequence that stores no row of an append (counts[b] = 0) has no position to check: its
// length past the rotary limit did not make another sequence's append fail (the unstored rows
// were rotated at its length, and apply_rotary refused 2^53 + 5).
TEST(KVCacheWindow, ASequenceStoringNothingIsNotCheckedForRotaryPositions) {
  KVCacheConfig rc = config(2, 6, DType::f32, 4);
  rc.rotary = CacheRotary{};
  KVCache rotary(rc);
  rotary.set_length(0, kMaxRotaryPosition + 5);
  const Tensor k = Tensor::randn({2, 2, 1, 16}, 8), v = Tensor::randn({2, 2, 1, 8}, 9);
  rotary.append(k, v, {0, 1});
  EXPECT_EQ(rotary.length(0), kMaxRotaryPosition + 5);
  EXPECT_EQ(rotary.length(1), 1);
  EXPECT_THROW_WITH(rotary.append(k, v, {1, 1}), ValueError, "KVCache.append: sequence 0's rotary positions");
}

// A window wider than any sequence on a cache without one is no window: pos - window overflowed for
// the queries before a short sequence's first key (pos < 0), and the reference dropped every key.
TEST(KVCacheWindow, AWindowNearTheInt64LimitIsNoWindow) {
  KVCache cache(config(2, 8, DType::f32));
  cache.append(Tensor::randn({2, 2, 3, 16}, 1), Tensor::randn({2, 2, 3, 8}, 2), {1, 3});
  const Tensor q = Tensor::randn({2, 4, 3, 16}, 3);
  for (bool causal : {true, false}) {
    DecodeOptions none, wide;
    none.causal = wide.causal = causal;
    wide.window = std::numeric_limits<int64_t>::max();
    const Tensor want = decode_attention_reference(q, cache, none).output;
    EXPECT_EQ(max_abs_diff(decode_attention_reference(q, cache, wide).output, want), 0.0) << causal;
    EXPECT_LE(max_abs_diff(decode_attention(q, cache, wide).output, want), 1e-6) << causal;
  }
}

// `pages` without a page_size was ignored (a contiguous cache); a paged cache's default pool
// counted ceil(capacity / page_size) as (capacity + page_size - 1) / page_size, which overflowed
// for a capacity near 2^63 (UB; the pool came out negative).
TEST(KVCacheErrors, PagesWithoutAPageSizeAndCapacitiesNearTheInt64Limit) {
  KVCacheConfig c = config(2, 8, DType::f32);
  c.pages = 5;
  EXPECT_THROW_WITH(KVCache{c}, ValueError, "KVCache: pages = 5 needs page_size > 0 (a paged cache); got page_size 0");
  c.pages = 0, c.batch = 1, c.capacity = std::numeric_limits<int64_t>::max(), c.page_size = int64_t{1} << 61;
  EXPECT_THROW_WITH(KVCache{c}, Error, "[4, 2, 2305843009213693952, 16]");
  c.window = 4, c.page_size = 1;
  EXPECT_THROW_WITH(KVCache{c}, ValueError, "KVCache: batch 1 x capacity 9223372036854775807 is too large");
}

// A cache past the allocation limit is an OutOfMemoryError naming KVCache, what it would hold
// and the bytes, before any allocation: 2^40 sequences of capacity 0 hold no key, and their
// lengths and block tables ended in a bare std::bad_alloc ("qkv: out of memory" in Python).
TEST(KVCacheErrors, ACacheTooLargeNamesKVCacheAndTheBytes) {
  EXPECT_THROW_WITH(
      KVCache(KVCacheConfig{int64_t{1} << 40, 1, 8, 0}), OutOfMemoryError,
      "KVCache: per-sequence state of 1099511627776 sequences (48 bytes each) needs 52776558133248 bytes");
  EXPECT_THROW_WITH(KVCache(KVCacheConfig{1, 1, 8, int64_t{1} << 40}), OutOfMemoryError,
                    "KVCache: keys [1, 1, 1099511627776, 8] float32 needs 35184372088832 bytes");
  EXPECT_THROW_WITH(KVCache(KVCacheConfig{1, 1, 8, 1, int64_t{1} << 60, DType::bf16}), OutOfMemoryError,
                    "KVCache: values [1, 1, 1, 1152921504606846976] bfloat16 needs 2305843009213693952 bytes");
  KVCacheConfig paged{1, 1, 8, 16};
  paged.page_size = 4, paged.pages = int64_t{1} << 61;
  EXPECT_THROW_WITH(KVCache{paged}, OutOfMemoryError, "KVCache: keys [2305843009213693952, 1, 4, 8] float32 needs 2^");
  EXPECT_EQ(KVCache(KVCacheConfig{1 << 16, 1, 8, 0}).lengths().size(), size_t{1} << 16);  // small enough: fine
}

// One cache from several threads (qkv/kv_cache.h, "Threads"): a writer resets a paged cache and
// appends one of two key sets 16 positions at a time; two readers decode, save the state and
// read a sequence meanwhile. Each decode must be that of some state the writer went through:
// within 2e-6 of the float64 reference over a second cache filled the same way on this thread.
TEST(KVCacheThreads, EachDecodeSeesOneStateOfACacheOthersWrite) {
  constexpr int64_t n = 1024, step = 16;
  KVCacheConfig c{1, 2, 64, n, 64, DType::f32};
  c.page_size = 4, c.pages = n / 4;
  const Tensor q = Tensor::randn({1, 4, 1, 64}, 3);
  const Tensor keys[2] = {Tensor::randn({1, 2, n, 64}, 4), Tensor::randn({1, 2, n, 64}, 5)};
  const Tensor values[2] = {Tensor::randn({1, 2, n, 64}, 6), Tensor::randn({1, 2, n, 64}, 7)};
  DecodeOptions o;
  o.chunk = 8;
  std::vector<std::vector<double>> states;  // every state's: empty, then set s after L positions
  {
    KVCache alone(c);
    states.push_back(decode_attention_reference(q, alone).output.to_vector<double>());
    for (int set = 0; set < 2; ++set) {
      alone.reset();
      for (int64_t t = 0; t < n; t += step) {
        alone.append(keys[set].slice(2, t, t + step), values[set].slice(2, t, t + step));
        states.push_back(decode_attention_reference(q, alone).output.to_vector<double>());
      }
    }
  }
  KVCache shared(c);
  std::atomic<bool> stop{false};
  std::atomic<int64_t> decodes{0}, mixed{0};
  auto reader = [&] {
    while (!stop.load()) {
      const std::vector<double> out = decode_attention(q, shared, o).output.to_vector<double>();
      const bool some = std::any_of(states.begin(), states.end(), [&](const std::vector<double>& want) {
        for (size_t i = 0; i < out.size(); ++i)
          if (!(std::fabs(out[i] - want[i]) <= 2e-6)) return false;
        return true;
      });
      if (!some) ++mixed;
      ++decodes;
      const auto state = shared.state();  // one state: its keys are its length's
      EXPECT_EQ(state.at("keys").size(2), state.at("lengths").to_vector<int64_t>()[0]);
      EXPECT_LE(shared.sequence_keys(0).size(1), n);
    }
  };
  std::thread r1(reader), r2(reader);
  for (int round = 0; round < 30 || decodes.load() < 100; ++round) {  // the readers make progress: no starving lock
    shared.reset();
    for (int64_t t = 0; t < n; t += step) {
      shared.append(keys[round % 2].slice(2, t, t + step), values[round % 2].slice(2, t, t + step));
      if (t % 256 == 0) shared.set_length(0, t + step);  // another writer
    }
  }
  stop = true;
  r1.join(), r2.join();
  EXPECT_EQ(mixed.load(), 0) << "of " << decodes.load() << " decodes";
  EXPECT_GT(decodes.load(), 0);
}

// A window's evicted pages leave the block table: it had an entry -1 for every page a sequence ever
// passed (262143 of them after set_length(0, 2^20) with pages of 4; std::bad_alloc, or the machine's
// memory, at 2^40), and it stays ~capacity / page_size + 1 long, decoding as the ring does.
TEST(KVCachePaged, EvictedPagesLeaveTheBlockTable) {
  KVCacheConfig pc = config(2, 8, DType::f32, 6);
  pc.page_size = 4;
  KVCache paged(pc), ring(config(2, 8, DType::f32, 6));
  feed({&paged, &ring}, 3, 5, 1);
  for (KVCache* c : {&paged, &ring}) c->set_length(0, int64_t{1} << 20);
  feed({&paged, &ring}, 40, 5, 2);
  for (int64_t b = 0; b < 2; ++b) {
    const auto& blocks = paged.block_table(b);
    EXPECT_LE(static_cast<int64_t>(blocks.size()), 3) << b;
    EXPECT_GE(*std::min_element(blocks.begin(), blocks.end()), 0) << b;
    EXPECT_EQ(paged.first_block(b), paged.first_kept(b) / 4) << b;
  }
  const Tensor q = Tensor::randn({2, 4, 2, 16}, 3);
  EXPECT_EQ(max_abs_diff(decode_attention(q, paged).output, decode_attention(q, ring).output), 0.0);
  EXPECT_LE(max_abs_diff(decode_attention(q, paged).output, decode_attention_reference(q, ring).output), 2e-6);
  paged.set_length(1, int64_t{1} << 40);  // 2^38 entries before
  EXPECT_LE(static_cast<int64_t>(paged.block_table(1).size()), 3);
  EXPECT_EQ(paged.first_block(1), ((int64_t{1} << 40) - 8) / 4);
  const KVCache back = KVCache::from_state(paged.state());
  EXPECT_EQ(back.first_block(1), paged.first_block(1));
  EXPECT_EQ(max_abs_diff(decode_attention(q, back).output, decode_attention(q, paged).output), 0.0);
  paged.reset();
  EXPECT_EQ(paged.first_block(1), 0);
  EXPECT_EQ(paged.free_pages(), paged.config().pages);
}

}  // namespace
}  // namespace qkv
