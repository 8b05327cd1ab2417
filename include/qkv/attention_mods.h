// Score and mask modifiers of scaled_dot_product_attention (AttentionOptions::mods): the
// idea of PyTorch's FlexAttention on the CPU. The fused kernel classifies every (query tile,
// key tile) pair as empty, full or partial from the modifiers, skips empty pairs (forward
// and backward: work in proportion to the non-empty tiles) and evaluates the element mask
// only in partial ones. The float64 reference applies the same definitions element by
// element.
//
// Which keys query i of batch entry (b, h) may see (i < Lq, j < Lk):
//   allowed(b, h, i, j) = D(i, j) && F(b, h, i, j) && (W(i, j) || P(j) || G(i, j) || R(i, j))
// where the OR group holds the terms that are set (none set: true) and
//   d(i)    = i (Align::top_left) or i + Lk - Lq (Align::bottom_right), the diagonal key;
//   W(i, j) = the window: with u = block_size, delta = floor(j / u) - floor(d(i) / u),
//             -window_left <= delta <= window_right and delta % dilation == 0 (set when a
//             window side is given or dilation > 1; a missing side is unbounded).
//             window_right = 0: causal; (left w-1, right 0): a causal sliding window of w
//             keys; dilation s with no window: Sparse Transformer's strided pattern's
//             "every s-th key" half (its local half is a window: two mods OR'ed need the
//             functor or a block pattern).
//   P(j)    = j < prefix (prefix-LM with window_right = 0).
//   G(i, j) = i or j in global_tokens (Longformer's global attention).
//   R(i, j) = block_pattern[(h,) floor(i / u), floor(j / u)] (one pattern for every head, or
//             one per head as FlexAttention's BlockMask and BigBird's per-head random blocks),
//             or one of the random_blocks key blocks drawn for query block floor(i / u)
//             (BigBird; seeded, see below).
//   D(i, j) = document_ids[i] == key_document_ids[j] (document / ragged masking; the key
//             ids default to the query ids when Lq == Lk).
//   F       = mask_mod (C++ only), any predicate of the flat batch index b (over the
//             dims before the heads), the head h, i and j.
// A key that is not allowed gets score -inf (weight 0, as a bool attn_mask False), or
// `masked_fill` when that is set (seed 002's and Keras' masked_fill(mask == 0, -1e9):
// a row with no allowed key gets uniform weights over all Lk keys; in a row with some,
// the masked keys' exp(fill - max) is taken as 0, exact in float32 when the row's
// largest allowed score exceeds fill by more than 17 + log(Lk)).
//
// Scores, in this order: s = scale q.k; softcap c > 0: s = c tanh(s / c) (Gemma 2's logit
// soft-capping); s += alibi_slopes[h] * (j - d(i)) (ALiBi, as FlexAttention's example);
// s += relative_bias[h or 0, j - i + Lq - 1] (T5-style relative position bias, [H or 1,
// Lq + Lk - 1]); s = score_mod(s, b, h, i, j) (C++ only); then attn_mask and is_causal
// as without mods (is_causal stays PyTorch's top-left causal, AND-ed with all of this),
// then the mask above.
//
// The backward (scaled_dot_product_attention_backward) supports every modifier but
// score_mod and masked_fill (ValueError); biases and slopes are constants (no gradient).
// mask_mod and score_mod are called from several worker threads at once, each element once or
// more (partial tiles, the weights pass, the backward): they must be thread-safe and pure.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

struct AttentionMods {
  enum class Align { top_left, bottom_right };
  Align align = Align::top_left;
  std::optional<int64_t> window_left;   // >= 0; in blocks of block_size
  std::optional<int64_t> window_right;  // >= 0; 0 = causal
  int64_t dilation = 1;                 // >= 1
  int64_t block_size = 1;               // >= 1: the unit of the window, block_pattern, random_blocks
  int64_t prefix = 0;                   // >= 0
  std::vector<int64_t> global_tokens;   // positions in [0, max(Lq, Lk))
  std::optional<Tensor> block_pattern;  // bool [(Hq,) ceil(Lq / u), ceil(Lk / u)]: extra allowed blocks
  int64_t random_blocks = 0;            // key blocks per query block, drawn from random_seed
  uint64_t random_seed = 0;
  std::optional<Tensor> document_ids;      // integer [Lq]
  std::optional<Tensor> key_document_ids;  // integer [Lk]
  std::function<bool(int64_t b, int64_t h, int64_t i, int64_t j)> mask_mod;

  double softcap = 0.0;                 // 0: off
  std::optional<Tensor> alibi_slopes;   // floating [Hq]
  std::optional<Tensor> relative_bias;  // floating [Hq or 1, Lq + Lk - 1]
  std::function<double(double score, int64_t b, int64_t h, int64_t i, int64_t j)> score_mod;
  std::optional<double> masked_fill;  // finite value for disallowed keys (see above)

  // Whether any modifier is set (the kernel's fast path is untouched otherwise).
  bool any() const;
  bool any_mask() const;  // a term of allowed() is set

  // The common patterns.
  static AttentionMods causal(Align align = Align::top_left);
  // Keys within `left` before and `right` after the diagonal (tokens).
  static AttentionMods sliding_window(int64_t left, int64_t right, Align align = Align::top_left);
  // Causal, plus the first `prefix` keys for every query.
  static AttentionMods prefix_lm(int64_t prefix);
  // Longformer: a window of `left`/`right` tokens plus global tokens.
  static AttentionMods longformer(int64_t left, int64_t right, std::vector<int64_t> global_tokens);
  // BigBird: blocks of `block`, `window_blocks` blocks on each side, the first and last
  // block global, `random` random key blocks per query block from `seed`.
  static AttentionMods bigbird(int64_t block, int64_t window_blocks, int64_t random, uint64_t seed, int64_t length);
};

// The key blocks BigBird-style random attention adds to query block qb: `count` distinct
// blocks of [0, key_blocks), drawn from (seed, qb) with Philox (the same on every machine
// and thread count). Sorted. count > key_blocks: all of them.
std::vector<int64_t> random_key_blocks(uint64_t seed, int64_t qb, int64_t key_blocks, int64_t count);

}  // namespace qkv
