// Tile sizes of the fused CPU attention (attention_cpu.cc), from the cache sizes.
//
// One worker keeps a Q tile [Br, Dk], a K tile [Bc, Dk], a V tile [Bc, Dv], the
// scores/probabilities [Br, Bc] and the output accumulator [Br, Dv] in its L2.
// Br and Bc are powers of two; Bc is the largest whose working set fits the L2,
// capped at kMaxBc and never below kMinBc, and Br = kBr (kWideBr for heads of 512 and
// more, where the L2 leaves Bc at its floor). With causal masking Br = kCausal and
// Bc = 2 Br: attention_cpu.cc takes key tiles backwards from the diagonal, so only
// the tile at the first keys is partial and it is Br wide: the tile GEMMs see
// two shapes (qkv::gemm keeps a per-thread memo of 4 plans), and the masked
// triangle computed per query tile is Br x Br / 2. Long causal problems take
// square tiles of up to 256 instead (kLongCausal below), long non-causal ones
// query tiles of 512 rows (kLongKeys below).
//
// Who decides (qkv/attention.h, FlashTiles): AttentionOptions::tuning.flash_tiles
// when set, else QKV_FLASH_TILES=BRxBC (e.g. "64x256", read once, at the first
// call; a malformed value is ignored), else the choice above.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <numeric>
#include <optional>

#include "qkv/attention.h"

namespace qkv::attention {

// Bytes of L2 of one core (sysconf, else 1 MiB).
inline int64_t l2_cache_bytes() {
  const long bytes = sysconf(_SC_LEVEL2_CACHE_SIZE);
  return bytes > 0 ? static_cast<int64_t>(bytes) : int64_t{1} << 20;
}

// Floats of one worker's tiles: q [br, dk], k [bc, dk], v [bc, dv], s [br, bc], o [br, dv].
inline int64_t flash_working_set(int64_t br, int64_t bc, int64_t dk, int64_t dv) {
  return br * dk + bc * dk + bc * dv + br * bc + br * dv;
}

// P, the key-tile parts each work item is cut into, for the forward's items (query row tiles
// of an entry: attention_cpu_split.h) and the backward's (whole entries: attention_backward_cpu.cc):
// 1 where the items alone keep the workers evenly busy (a multiple of them, or at least 4 items
// a worker), else workers / gcd(items, workers), so that items * P is a multiple of the workers
// (one item on 2 workers: 2 parts; 3 items on 2: 2 parts, 6 units; 8 items on 16: 2 parts);
// at most the key tiles (a part is whole key tiles).
inline int64_t key_tile_parts(int64_t items, int64_t workers, int64_t key_tiles) {
  if (workers <= 1 || items == 0 || items % workers == 0 || items >= 4 * workers || key_tiles < 2) return 1;
  return std::min(workers / std::gcd(items, workers), key_tiles);
}

// "BRxBC" with both positive, else nullopt (also for null).
inline std::optional<FlashTiles> parse_flash_tiles(const char* text) {
  long br = 0, bc = 0;
  char rest = 0;
  if (text == nullptr || std::sscanf(text, "%ldx%ld%c", &br, &bc, &rest) != 2 || br <= 0 || bc <= 0) {
    return std::nullopt;
  }
  return FlashTiles{br, bc};
}

// QKV_FLASH_TILES, read at the first call only: a call's tiles never depend on
// another thread's setenv, and the hot path does no getenv.
inline const std::optional<FlashTiles>& flash_tiles_from_env() {
  static const std::optional<FlashTiles> tiles = parse_flash_tiles(std::getenv("QKV_FLASH_TILES"));
  return tiles;
}

// Causal problems from this length on (the shorter of Lq, Lk) take square tiles of up to
// 256 (as many as fit the L2): the masked triangle is <= 3% of a row's keys there. At
// causal (1, 8, 16384, 128), 2 threads, AMD EPYC Zen 4, three alternating runs each:
// 256 x 256 2792 / 2811 / 2791 ms against 2775 / 2941 / 2912 for 128 x 256 (-4% median).
constexpr int64_t kLongCausal = 8192;

// Non-causal problems from this length on (the shorter of Lq, Lk) take query tiles of 512 rows
// (key tiles as the L2 allows): every query tile streams its entry's whole K and V, and from
// here on a quarter of the passes over them pays. 2 threads, AMD EPYC Zen 4 (1 MiB L2, 32 MiB
// L3 shared with other VMs), `qkv bench attention`, 512 x 512 against 128 x 512, two rounds each:
// float32 (1, 8, 16384, 128) 5372-5431 ms against 5573-5696 (-4%), (1, 8, 16384, 64) 2895-2916 /
// 3004-3027 (-4%), (1, 4, 12288, 64) 831-845 / 873-887 (-5%), (1, 2, 32768, 64) 2947-2964 /
// 3086-3103 (-4%); bfloat16 (1, 8, 16384, 64) 1771-1781 / 1829-1833 (-3%); float64 (1, 4, 16384,
// 64) 3847 / 4217 (-9%); 1 thread (1, 1, 16384, 64) 710 / 739-742 (-4%). Shorter ones keep
// 128 rows: (1, 8, 8192, 64) 742-747 / 722-736 (+2%), (1, 4, 8192, 128) 712-714 / 697-712,
// (4, 8, 1024, 64) 47.1 / 44.2 (+6%).
constexpr int64_t kLongKeys = 12288;

// Tiles narrower than 128 keys or rows make small tile products: at D = 512 the L2 rule gave
// 64 x 64 (Bc 64, Br capped at Bc), 155-172 GFLOP/s at (1, 8, 4096, 512) and (4, 8, 1024, 512)
// against 184-187 for 128 x 128 and 185-198 for 256 x 128 (2 threads; 1 thread, (1, 2, 2048,
// 512): 83 / 90 / 99; causal (4, 8, 1024, 512) 164 / 168 for 128 x 128, 156 for 256 x 256).
// Heads of kWideHead and more take 256 rows (their Bc is at the floor; more rows per key tile
// halve the passes over K and V, 2 KB a row there). D = 256 keeps 128 rows (128 x 256 205
// against 199 for 256 x 256 at (4, 8, 1024, 256), though 199 / 204 at (1, 8, 4096, 256)).
constexpr int64_t kMinBc = 128, kWideHead = 512;

// The cache-sized choice described at the top; `shortest` = min(Lq, Lk) (0: unknown).
inline FlashTiles auto_flash_tiles(int64_t dk, int64_t dv, bool causal, int64_t shortest = 0) {
  constexpr int64_t kBr = 128, kMaxBc = 512, kCausal = 128, kLongTile = 256, kWideBr = 256, kLongBr = 512;
  const int64_t budget = l2_cache_bytes() / static_cast<int64_t>(sizeof(float));  // [floats]
  if (causal && shortest >= kLongCausal) {
    FlashTiles t{kLongTile, kLongTile};
    while (t.br > kCausal && flash_working_set(t.br, t.bc, dk, dv) > budget) t.br = t.bc /= 2;
    return t;
  }
  FlashTiles t{0, kMaxBc};
  while (t.bc > kMinBc && flash_working_set(kBr, t.bc, dk, dv) > budget) t.bc /= 2;
  if (causal) return {kCausal, std::min(t.bc, 2 * kCausal)};
  t.br = shortest >= kLongKeys ? kLongBr : std::max(dk, dv) >= kWideHead ? kWideBr : kBr;
  return t;
}

// The tiles of one call: `requested` (the options' tiles, both > 0 or both 0 =
// automatic; checked by make_problem), else `env`, else auto_flash_tiles, cut to
// the sequence lengths: one tile covers a short sequence (fewer, larger GEMMs;
// Lq = 1 is decode), and the [Br, Bc] scratch never exceeds [Lq, Lk].
inline FlashTiles choose_flash_tiles(const FlashTiles& requested, const std::optional<FlashTiles>& env, int64_t lq,
                                     int64_t lk, int64_t dk, int64_t dv, bool causal) {
  // value_or, not `env ? *env : ...`: GCC 12 at -O2 with ASan flagged the latter's payload read
  // as maybe-uninitialized (a false positive that broke `make asan` under -Werror).
  FlashTiles t = requested;
  if (t.is_auto()) t = env.value_or(auto_flash_tiles(dk, dv, causal, std::min(lq, lk)));
  t.br = std::max<int64_t>(1, std::min(t.br, lq));
  t.bc = std::max<int64_t>(1, std::min(t.bc, lk));
  return t;
}

}  // namespace qkv::attention
