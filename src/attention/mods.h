// AttentionMods (qkv/attention_mods.h) prepared for the fused kernels: checked once per
// call (check_mods, from make_problem), then turned into a ModPlan whose element test
// and tile classification the forward and backward tiles use (attention_cpu_tiles.h).
// The float64 reference does not use this file: it applies the definitions on its own.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "qkv/attention.h"

namespace qkv::attention {

class Problem;

// ShapeError / ValueError / DTypeError naming `op` for modifiers that do not fit the call.
void check_mods(const AttentionMods& mods, const AttentionOptions& options, int64_t lq, int64_t lk, int64_t heads_q,
                const char* op);

enum class TileClass { empty, partial, full };

// floor(a / b) for b > 0.
inline int64_t floor_div(int64_t a, int64_t b) { return a >= 0 ? a / b : -((-a + b - 1) / b); }

// Blocks of u positions over n >= 0 positions, ceil(n / u) without n + u - 1 (which overflows
// for block_size near 2^63: any block_size >= n is one block).
inline int64_t block_count(int64_t n, int64_t u) { return n == 0 ? 0 : (n - 1) / u + 1; }

struct ModPlan {
  const AttentionMods* mods = nullptr;
  bool active = false, masking = false, scoring = false;
  int64_t lq = 0, lk = 0, heads = 1;
  int64_t offset = 0;  // d(i) - i
  int64_t unit = 1;
  bool window = false;
  int64_t left = 0, right = 0, dilation = 1;  // left/right: INT64 bounds when unbounded
  int64_t prefix = 0;
  bool or_terms = false;                 // any term of the OR group is set
  std::vector<char> global_q, global_k;  // [Lq], [Lk]
  std::vector<int64_t> global_k_sorted, global_q_sorted;
  int64_t q_blocks = 0, k_blocks = 0;
  std::vector<char> pattern;       // [q_blocks, k_blocks] when block_pattern is given: any head's
  std::vector<char> head_pattern;  // [Hq, q_blocks, k_blocks] when block_pattern is per head
  std::vector<char> every_head;    // [q_blocks, k_blocks]: allowed in every head's pattern
  std::vector<int64_t> random;     // [q_blocks, random_per_row]: each query block's random key blocks, sorted
  int64_t random_per_row = 0;
  bool has_blocks = false;
  // Whether the block term allows key block kb to query block qb in head h, or (h < 0) in
  // some head: tiles are classified per rows, for every head at once (conservative).
  bool block_allowed(int64_t qb, int64_t kb, int64_t h = -1) const {
    const auto at = static_cast<size_t>(qb * k_blocks + kb);
    if (!pattern.empty()) {
      const bool any_head = h < 0 || head_pattern.empty();
      if (any_head ? pattern[at] : head_pattern[static_cast<size_t>(h) * pattern.size() + at]) return true;
    }
    return random_block(qb, kb);
  }
  bool block_allowed_in_every_head(int64_t qb, int64_t kb) const {
    return (!every_head.empty() && every_head[static_cast<size_t>(qb * k_blocks + kb)]) || random_block(qb, kb);
  }
  bool random_block(int64_t qb, int64_t kb) const {
    const auto row = random.begin() + qb * random_per_row;
    return random_per_row > 0 && std::binary_search(row, row + random_per_row, kb);
  }
  // The window is the only term (dilation 1; no prefix, globals, blocks, documents or
  // mask_mod): query i's allowed keys are one run [key_lo(i), key_hi(i)), both ends
  // non-decreasing in i. The forward then walks exactly the run of a row tile, and partial
  // tiles are masked by the rows' ends, with no per-element test.
  bool interval = false;
  int64_t key_lo(int64_t i) const {  // key blocks from qb - left
    const int64_t kb = floor_div(i + offset, unit) - left;
    return kb <= 0 ? 0 : std::min(kb * unit, lk);
  }
  int64_t key_hi(int64_t i) const {  // to qb + right
    const int64_t kb = floor_div(i + offset, unit) + right + 1;
    return kb >= k_blocks ? lk : std::max<int64_t>(kb * unit, 0);
  }
  std::vector<int64_t> q_doc, k_doc;  // [Lq], [Lk] when set
  std::vector<double> alibi;          // [Hq] when set
  std::vector<double> relative;       // [Hb, Lq + Lk - 1] when set
  std::vector<float> relative_f;      // the same as float: the float32 tiles add its rows on Highway
  int64_t relative_heads = 0;
  double softcap = 0.0;

  // The score after the score modifiers (softcap, ALiBi, relative bias, score_mod).
  double score(double s, int64_t entry, int64_t i, int64_t j) const {
    const int64_t h = entry % heads;
    if (softcap > 0.0) s = softcap * std::tanh(s / softcap);
    if (!alibi.empty()) s += alibi[static_cast<size_t>(h)] * static_cast<double>(j - (i + offset));
    if (!relative.empty()) {
      const int64_t hb = relative_heads == 1 ? 0 : h;
      s += relative[static_cast<size_t>(hb * (lq + lk - 1) + j - i + lq - 1)];
    }
    if (mods->score_mod) s = mods->score_mod(s, entry / heads, h, i, j);
    return s;
  }

  // out[c] = whether key j0 + c is allowed for query i of flat batch entry `entry` (heads
  // included; qkv/attention_mods.h's allowed(b, h, i, j)), for c < cols, by ranges (the window, prefix, global
  // and block terms set whole runs; documents and mask_mod go element by element).
  void row_allowed(int64_t entry, int64_t i, int64_t j0, int64_t cols, char* out) const;

  // The key tiles (starts: multiples of bc below lk) that may hold an allowed key for rows
  // [i0, i1), from the OR terms (documents and mask_mod only remove keys); false when every
  // tile must be looked at (no OR term, a global query in the rows). The forward walks these
  // instead of all Lk / bc tiles: at L = 1M that classification alone was quadratic.
  bool candidate_tiles(int64_t i0, int64_t i1, int64_t bc, std::vector<int64_t>& out) const;

  // Rows [i0, i1) x keys [j0, j1) of entry `entry`: no allowed key, all allowed, or mixed
  // (conservative: `partial` whenever it cannot tell).
  TileClass classify(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const;
};

// Automatic tiles under mask modifiers: square, 128 for token masks (a causal call's size: the
// mask leaves few keys per row, so big key tiles would be mostly partial), one block (or a
// multiple of a block under 64) with block_size > 1, so that BigBird-style blocks fall into
// whole tiles (empty or full). `tiles` is
// returned as it is when the caller or QKV_FLASH_TILES chose it, or without mask modifiers.
FlashTiles mod_tiles(const FlashTiles& tiles, bool automatic, const AttentionMods& mods, int64_t lq, int64_t lk);
// The forward's automatic tiles when the window is the only mask term (ModPlan::interval):
// a row tile's run of keys (Br + the window's width - 1) in as few key tiles as the L2 holds
// (flash_tiles.h's working set), Bc rounded up to 16; `tiles` as it is otherwise.
FlashTiles interval_tiles(const FlashTiles& tiles, bool automatic, const AttentionMods& mods, int64_t lq, int64_t lk,
                          int64_t dk, int64_t dv);

ModPlan make_mod_plan(const AttentionMods& mods, int64_t lq, int64_t lk, int64_t heads_q);

}  // namespace qkv::attention
