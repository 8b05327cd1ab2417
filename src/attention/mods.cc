// AttentionMods: the patterns, the checks, and the kernels' plan (attention/mods.h).
#include "attention/mods.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <string>

#include "attention/flash_tiles.h"
#include "qkv/error.h"
#include "qkv/random.h"

namespace qkv {

bool AttentionMods::any_mask() const {
  return window_left || window_right || dilation != 1 || prefix > 0 || !global_tokens.empty() || block_pattern ||
         random_blocks > 0 || document_ids || key_document_ids || static_cast<bool>(mask_mod);
}

bool AttentionMods::any() const {
  return any_mask() || softcap != 0.0 || alibi_slopes || relative_bias || static_cast<bool>(score_mod) ||
         masked_fill.has_value();
}

AttentionMods AttentionMods::causal(Align align) {
  AttentionMods m;
  m.align = align;
  m.window_right = 0;
  return m;
}

AttentionMods AttentionMods::sliding_window(int64_t left, int64_t right, Align align) {
  AttentionMods m;
  m.align = align;
  m.window_left = left;
  m.window_right = right;
  return m;
}

AttentionMods AttentionMods::prefix_lm(int64_t prefix) {
  AttentionMods m = causal();
  m.prefix = prefix;
  return m;
}

AttentionMods AttentionMods::longformer(int64_t left, int64_t right, std::vector<int64_t> global_tokens) {
  AttentionMods m = sliding_window(left, right);
  m.global_tokens = std::move(global_tokens);
  return m;
}

AttentionMods AttentionMods::bigbird(int64_t block, int64_t window_blocks, int64_t random, uint64_t seed,
                                     int64_t length) {
  AttentionMods m;
  m.block_size = block;
  m.window_left = m.window_right = window_blocks;
  for (int64_t t = 0; t < std::min(block, length); ++t) m.global_tokens.push_back(t);               // first block
  for (int64_t t = std::max(block, length - block); t < length; ++t) m.global_tokens.push_back(t);  // last
  m.random_blocks = random;
  m.random_seed = seed;
  return m;
}

std::vector<int64_t> random_key_blocks(uint64_t seed, int64_t qb, int64_t key_blocks, int64_t count) {
  // Floyd's sampling of n distinct values of [0, key_blocks) in O(n^2), on Philox draws with
  // counter (qb, step): no O(key_blocks) work per query block (BigBird at L = 1M has 16384).
  const int64_t n = std::max<int64_t>(0, std::min(count, key_blocks));
  std::vector<int64_t> out;
  for (int64_t s = key_blocks - n; s < key_blocks; ++s) {
    const double u = random::uniform(seed, (static_cast<uint64_t>(qb) << 32) + static_cast<uint64_t>(s));
    const int64_t t = std::min(s, static_cast<int64_t>(u * static_cast<double>(s + 1)));  // in [0, s]
    out.push_back(std::find(out.begin(), out.end(), t) == out.end() ? t : s);
  }
  std::sort(out.begin(), out.end());
  return out;
}

namespace attention {

namespace {

void check_vector(const std::optional<Tensor>& t, const char* name, int64_t n, bool integer, const char* op) {
  if (!t) return;
  if (integer ? !(t->dtype() == DType::i32 || t->dtype() == DType::i64) : !is_floating(t->dtype())) {
    fail<DTypeError>(op, ": mods.", name, " must be ", integer ? "int32 or int64" : "floating point", ", got ",
                     dtype_name(t->dtype()));
  }
  if (t->dim() != 1 || t->size(0) != n) {
    fail<ShapeError>(op, ": mods.", name, " must have shape [", n, "], got ", shape_str(t->shape()));
  }
}

std::vector<double> doubles(const Tensor& t) { return t.contiguous().to_vector<double>(); }

// ModPlan::interval: the window is the only mask term.
bool interval_mask(const AttentionMods& m) {
  return (m.window_left || m.window_right) && m.dilation == 1 && m.prefix == 0 && m.global_tokens.empty() &&
         !m.block_pattern && m.random_blocks == 0 && !m.document_ids && !m.key_document_ids && !m.mask_mod;
}

}  // namespace

void check_mods(const AttentionMods& m, const AttentionOptions& o, int64_t lq, int64_t lk, int64_t heads_q,
                const char* op) {
  if (!m.any()) return;
  if ((m.window_left && *m.window_left < 0) || (m.window_right && *m.window_right < 0) || m.dilation < 1 ||
      m.block_size < 1 || m.prefix < 0 || m.random_blocks < 0 || m.softcap < 0.0 || !std::isfinite(m.softcap)) {
    fail<ValueError>(op,
                     ": mods: window sides, prefix and random_blocks must be >= 0, dilation and block_size >= 1, "
                     "softcap finite and >= 0");
  }
  if (m.block_size > 1 && m.align == AttentionMods::Align::bottom_right) {
    fail<ValueError>(op, ": mods: block_size > 1 needs Align::top_left");
  }
  for (int64_t g : m.global_tokens) {
    if (g < 0 || g >= std::max(lq, lk)) {
      fail<ValueError>(op, ": mods.global_tokens: position ", g, " is outside [0, ", std::max(lq, lk), ")");
    }
  }
  const int64_t qb = block_count(lq, m.block_size), kb = block_count(lk, m.block_size);
  if (m.block_pattern &&
      (m.block_pattern->dtype() != DType::b8 ||
       (m.block_pattern->shape() != Shape{qb, kb} && m.block_pattern->shape() != Shape{heads_q, qb, kb}))) {
    fail<ShapeError>(op, ": mods.block_pattern must be bool [", qb, ", ", kb, "] or [", heads_q, ", ", qb, ", ", kb,
                     "] (per head; blocks of ", m.block_size, "), got ", dtype_name(m.block_pattern->dtype()), " ",
                     shape_str(m.block_pattern->shape()));
  }
  check_vector(m.document_ids, "document_ids", lq, true, op);
  check_vector(m.key_document_ids, "key_document_ids", lk, true, op);
  if (m.key_document_ids && !m.document_ids) fail<ValueError>(op, ": mods.key_document_ids needs document_ids");
  if (m.document_ids && !m.key_document_ids && lq != lk) {
    fail<ValueError>(op, ": mods.document_ids with Lq ", lq, " != Lk ", lk, " needs key_document_ids");
  }
  check_vector(m.alibi_slopes, "alibi_slopes", heads_q, false, op);
  if (m.relative_bias) {
    const Tensor& r = *m.relative_bias;
    const int64_t offsets = std::max<int64_t>(0, lq + lk - 1);  // j - i + Lq - 1; none when Lq = Lk = 0
    if (!is_floating(r.dtype()) || r.dim() != 2 || (r.size(0) != 1 && r.size(0) != heads_q) || r.size(1) != offsets) {
      fail<ShapeError>(op, ": mods.relative_bias must be floating [", heads_q, " or 1, ", offsets,
                       "] (Lq + Lk - 1), got ", dtype_name(r.dtype()), " ", shape_str(r.shape()));
    }
  }
  if (m.masked_fill && (!std::isfinite(*m.masked_fill) || o.attn_mask || o.is_causal)) {
    fail<ValueError>(op,
                     ": mods.masked_fill must be finite and cannot be combined with attn_mask or is_causal "
                     "(express the mask through mods)");
  }
}

ModPlan make_mod_plan(const AttentionMods& m, int64_t lq, int64_t lk, int64_t heads_q) {
  ModPlan p;
  p.mods = &m;
  p.active = m.any();
  p.masking = m.any_mask();
  p.scoring = m.softcap > 0.0 || m.alibi_slopes || m.relative_bias || m.score_mod;
  p.lq = lq, p.lk = lk, p.heads = std::max<int64_t>(heads_q, 1);
  p.offset = m.align == AttentionMods::Align::bottom_right ? lk - lq : 0;
  p.unit = m.block_size;
  constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max() / 4;
  p.window = m.window_left || m.window_right || m.dilation > 1;
  // Wider windows (and dilations) than kUnbounded mean the same and would overflow qb + right + 1.
  p.left = std::min(m.window_left.value_or(kUnbounded), kUnbounded);
  p.right = std::min(m.window_right.value_or(kUnbounded), kUnbounded);
  p.dilation = std::min(m.dilation, kUnbounded);
  p.prefix = m.prefix;
  if (!m.global_tokens.empty()) {
    p.global_q.assign(static_cast<size_t>(lq), 0);
    p.global_k.assign(static_cast<size_t>(lk), 0);
    for (int64_t g : m.global_tokens) {
      if (g < lq) p.global_q[static_cast<size_t>(g)] = 1;
      if (g < lk) p.global_k[static_cast<size_t>(g)] = 1;
    }
    for (int64_t i = 0; i < lq; ++i)
      if (p.global_q[static_cast<size_t>(i)]) p.global_q_sorted.push_back(i);
    for (int64_t j = 0; j < lk; ++j)
      if (p.global_k[static_cast<size_t>(j)]) p.global_k_sorted.push_back(j);
  }
  p.q_blocks = block_count(lq, p.unit), p.k_blocks = block_count(lk, p.unit);
  if (m.block_pattern) {
    const auto values = m.block_pattern->contiguous().to_vector<double>();  // [(Hq,) q_blocks, k_blocks]
    const auto n = static_cast<size_t>(p.q_blocks * p.k_blocks);
    p.pattern.assign(n, 0);
    if (m.block_pattern->dim() == 3) p.head_pattern.assign(values.size(), 0);
    p.every_head.assign(n, 1);
    for (size_t x = 0; x < values.size(); ++x) {
      if (values[x] == 0.0) {
        p.every_head[x % n] = 0;
        continue;
      }
      p.pattern[x % n] = 1;
      if (!p.head_pattern.empty()) p.head_pattern[x] = 1;
    }
  }
  p.random_per_row = std::min(m.random_blocks, p.k_blocks);
  for (int64_t qb = 0; qb < p.q_blocks && p.random_per_row > 0; ++qb) {
    const auto row = random_key_blocks(m.random_seed, qb, p.k_blocks, m.random_blocks);
    p.random.insert(p.random.end(), row.begin(), row.end());
  }
  p.has_blocks = !p.pattern.empty() || p.random_per_row > 0;
  p.interval = interval_mask(m);
  p.or_terms = p.window || p.prefix > 0 || !m.global_tokens.empty() || p.has_blocks;
  if (m.document_ids) {
    const auto q = doubles(*m.document_ids);
    p.q_doc.assign(q.begin(), q.end());
    const auto k = m.key_document_ids ? doubles(*m.key_document_ids) : q;
    p.k_doc.assign(k.begin(), k.end());
  }
  if (m.alibi_slopes) p.alibi = doubles(*m.alibi_slopes);
  if (m.relative_bias) {
    p.relative = doubles(*m.relative_bias);
    p.relative_f.assign(p.relative.begin(), p.relative.end());
    p.relative_heads = m.relative_bias->size(0);
  }
  p.softcap = m.softcap;
  return p;
}

FlashTiles mod_tiles(const FlashTiles& tiles, bool automatic, const AttentionMods& mods, int64_t lq, int64_t lk) {
  if (!automatic || !mods.any_mask()) return tiles;
  // Measured (attention_mods_bench, L = 16384, 2 threads, medians of 3): causal window of 512
  // keys 168 / 161 / 154 / 189 ms at 64x64 / 64x128 / 128x128 / 128x256; BigBird (blocks of
  // 64) 199 / 243 / 346 / 547 ms: tiles of one block are never partial.
  const int64_t u = mods.block_size, t = u == 1 ? 128 : (u >= 64 ? u : 64 / u * u);
  return {std::max<int64_t>(1, std::min(t, lq)), std::max<int64_t>(1, std::min(t, lk))};
}

FlashTiles interval_tiles(const FlashTiles& tiles, bool automatic, const AttentionMods& mods, int64_t lq, int64_t lk,
                          int64_t dk, int64_t dv) {
  if (!automatic || !interval_mask(mods)) return tiles;
  // One key tile per row tile: one Q K^T, one P V and one online-softmax step where the
  // aligned 128 x 128 tiles took five. Br = 64 computes 575 keys per row for a window of 512
  // (89% allowed; Br = 128: 80%). Measured (attention_mods_bench, L = 16384, causal window of
  // 512, 2 threads, AMD EPYC Zen 4, tiles a multiple of 16 keys wide): Br = 128 124-126 ms,
  // 64 115, 32 114-115.
  constexpr int64_t kBr = 64;
  const int64_t br = std::max<int64_t>(1, std::min(kBr, lq));
  // A block longer than both lengths is one block, as one of max(Lq, Lk): br + u - 1 stays in range.
  const int64_t u = std::min(mods.block_size, std::max<int64_t>({lq, lk, 1}));
  const int64_t limit = std::numeric_limits<int64_t>::max() / 8;
  const int64_t left = std::min(mods.window_left.value_or(limit), limit / u);
  const int64_t right = std::min(mods.window_right.value_or(limit), limit / u);
  const int64_t run = std::min(lk, br + (left + right + 1) * u - 1);  // keys of a row tile, at most
  const int64_t budget = l2_cache_bytes() / static_cast<int64_t>(sizeof(float));
  const int64_t most = std::max<int64_t>(64, (budget - br * (dk + dv)) / (dk + dv + br));  // flash_working_set
  // At least one piece: with Lk = 0 the run is empty, and 0 pieces divided by zero (SIGFPE).
  const int64_t pieces = std::max<int64_t>(1, (run + most - 1) / most), bc = (run + pieces - 1) / pieces;
  return {br, std::max<int64_t>(1, std::min(lk, (bc + 15) / 16 * 16))};
}

namespace {

// Whether any of the sorted positions falls in [a, b).
bool any_in(const std::vector<int64_t>& sorted, int64_t a, int64_t b) {
  const auto it = std::lower_bound(sorted.begin(), sorted.end(), a);
  return it != sorted.end() && *it < b;
}

// How many of the sorted (distinct) positions fall in [a, b).
int64_t count_in(const std::vector<int64_t>& sorted, int64_t a, int64_t b) {
  return std::lower_bound(sorted.begin(), sorted.end(), b) - std::lower_bound(sorted.begin(), sorted.end(), a);
}

// The window term over rows [i0, i1) x keys [j0, j1): {any allowed, all allowed}.
std::pair<bool, bool> window_term(const ModPlan& p, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
  const int64_t qb0 = floor_div(i0 + p.offset, p.unit), qb1 = floor_div(i1 - 1 + p.offset, p.unit);
  const int64_t kb0 = j0 / p.unit, kb1 = (j1 - 1) / p.unit;
  const int64_t lo = std::max(kb0 - qb1, -p.left), hi = std::min(kb1 - qb0, p.right);  // deltas met and allowed
  if (lo > hi) return {false, false};
  bool any = true;
  if (p.dilation > 1) {  // a multiple of the dilation in [lo, hi]
    const int64_t first = floor_div(lo + p.dilation - 1, p.dilation) * p.dilation;
    any = first <= hi;
  }
  const bool all = p.dilation == 1 && kb0 - qb1 >= -p.left && kb1 - qb0 <= p.right;
  return {any, all};
}

}  // namespace

void ModPlan::row_allowed(int64_t entry, int64_t i, int64_t j0, int64_t cols, char* out) const {
  const int64_t j1 = j0 + cols;
  auto set = [&](int64_t a, int64_t b) {  // keys [a, b) allowed
    a = std::max(a, j0), b = std::min(b, j1);
    if (a < b) std::fill(out + (a - j0), out + (b - j0), char{1});
  };
  std::fill(out, out + cols, static_cast<char>(or_terms ? 0 : 1));
  if (or_terms) {
    if (!global_q.empty() && global_q[static_cast<size_t>(i)]) set(j0, j1);
    if (window) {  // key blocks [qb - left, qb + right] met by this tile, every dilation-th
      const int64_t qb = floor_div(i + offset, unit);
      const int64_t lo = std::max(j0 / unit, qb - left), hi = std::min((j1 - 1) / unit, qb + right);
      if (dilation == 1) {
        if (lo <= hi) set(lo * unit, (hi + 1) * unit);
      } else {
        for (int64_t kb = lo; kb <= hi; ++kb) {
          if ((kb - qb) % dilation == 0) set(kb * unit, (kb + 1) * unit);
        }
      }
    }
    if (prefix > 0) set(0, prefix);
    if (!global_k_sorted.empty()) {
      for (auto it = std::lower_bound(global_k_sorted.begin(), global_k_sorted.end(), j0);
           it != global_k_sorted.end() && *it < j1; ++it) {
        out[*it - j0] = 1;
      }
    }
    if (has_blocks) {
      const int64_t qb = i / unit;
      for (int64_t kb = j0 / unit; kb <= (j1 - 1) / unit; ++kb) {
        if (block_allowed(qb, kb, entry % heads)) set(kb * unit, (kb + 1) * unit);
      }
    }
  }
  if (!q_doc.empty()) {
    const int64_t d = q_doc[static_cast<size_t>(i)];
    for (int64_t c = 0; c < cols; ++c) out[c] = out[c] && k_doc[static_cast<size_t>(j0 + c)] == d;
  }
  if (mods->mask_mod) {
    for (int64_t c = 0; c < cols; ++c) out[c] = out[c] && mods->mask_mod(entry / heads, entry % heads, i, j0 + c);
  }
}

bool ModPlan::candidate_tiles(int64_t i0, int64_t i1, int64_t bc, std::vector<int64_t>& out) const {
  out.clear();
  if (!or_terms || any_in(global_q_sorted, i0, i1)) return false;
  auto add = [&](int64_t a, int64_t b) {  // the tiles of keys [a, b)
    a = std::max<int64_t>(a, 0), b = std::min(b, lk);
    for (int64_t t = a / bc * bc; t < b; t += bc) out.push_back(t);
  };
  if (window) {
    const int64_t qb0 = floor_div(i0 + offset, unit), qb1 = floor_div(i1 - 1 + offset, unit);
    const int64_t lo = std::max<int64_t>(qb0 - left, 0), hi = std::min(qb1 + right, k_blocks);
    if (lo <= hi) add(lo * unit, (hi + 1) * unit);
  }
  if (prefix > 0) add(0, prefix);
  for (size_t x = 0, y = 0; x < global_k_sorted.size(); x = y) {  // runs of global keys (BigBird: 2 blocks)
    for (y = x + 1; y < global_k_sorted.size() && global_k_sorted[y] == global_k_sorted[y - 1] + 1;) ++y;
    add(global_k_sorted[x], global_k_sorted[y - 1] + 1);
  }
  if (has_blocks) {
    for (int64_t qb = i0 / unit; qb <= (i1 - 1) / unit; ++qb) {
      if (!pattern.empty()) {
        for (int64_t kb = 0; kb < k_blocks; ++kb) {
          if (pattern[static_cast<size_t>(qb * k_blocks + kb)]) add(kb * unit, (kb + 1) * unit);
        }
      }
      for (int64_t x = 0; x < random_per_row; ++x) {
        const int64_t kb = random[static_cast<size_t>(qb * random_per_row + x)];
        add(kb * unit, (kb + 1) * unit);
      }
    }
  }
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return true;
}

TileClass ModPlan::classify(int64_t i0, int64_t i1, int64_t j0, int64_t j1) const {
  if (!masking || i0 >= i1 || j0 >= j1) return TileClass::full;
  bool doc_all = true;
  if (!q_doc.empty()) {
    const auto [qmin, qmax] = std::minmax_element(q_doc.begin() + i0, q_doc.begin() + i1);
    const auto [kmin, kmax] = std::minmax_element(k_doc.begin() + j0, k_doc.begin() + j1);
    if (*qmax < *kmin || *kmax < *qmin) return TileClass::empty;
    doc_all = *qmin == *qmax && *kmin == *kmax && *qmin == *kmin;
  }
  bool any = !or_terms, all = !or_terms;
  if (window) {
    const auto [a, f] = window_term(*this, i0, i1, j0, j1);
    any = any || a, all = all || f;
  }
  if (prefix > 0) any = any || j0 < prefix, all = all || j1 <= prefix;
  if (!global_q.empty()) {  // full when every row or every key of the tile is global
    any = any || any_in(global_q_sorted, i0, i1) || any_in(global_k_sorted, j0, j1);
    all = all || count_in(global_q_sorted, i0, i1) == i1 - i0 || count_in(global_k_sorted, j0, j1) == j1 - j0;
  }
  if (has_blocks && !all) {  // the blocks the tile meets: one allowed in some head; all in every head
    // (or by the window, which is whole blocks when unit > 1: top-left, the same delta over a block)
    auto in_window = [&](int64_t qb, int64_t kb) {
      const int64_t delta = kb - qb;
      return window && unit > 1 && delta >= -left && delta <= right && delta % dilation == 0;
    };
    bool every = true;
    for (int64_t qb = i0 / unit; qb <= (i1 - 1) / unit && (every || !any); ++qb) {
      for (int64_t kb = j0 / unit; kb <= (j1 - 1) / unit && (every || !any); ++kb) {
        any = any || block_allowed(qb, kb);
        every = every && (block_allowed_in_every_head(qb, kb) || in_window(qb, kb));
      }
    }
    all = every;
  }
  if (!any) return TileClass::empty;
  return all && doc_all && !mods->mask_mod ? TileClass::full : TileClass::partial;
}

}  // namespace attention
}  // namespace qkv
