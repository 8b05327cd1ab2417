// Fused CPU attention forward: FlashAttention-2's schedule (Dao 2023, Alg. 1).
//
// A work item is Br query rows of one batch entry (batch dims and heads are one
// flat batch). For each K/V tile of Bc rows the item computes
//   S = scale * Q K^T + bias          [Br, Bc]  (qkv::gemm, then mask / causal)
//   m_new = max(m, rowmax(S)); P = exp(S - m_new); l = l * exp(m - m_new) + rowsum(P)
//   O = O * exp(m - m_new) + P V      [Br, Dv]  (qkv::gemm with beta = 1)
// and finally O /= l and lse = m + log(l). The [Lq, Lk] scores never exist:
// a worker holds one S tile. Causal masking stops each query tile at the
// diagonal (tiles above it are never computed) and masks inside the diagonal
// tile only; key tiles are taken from the diagonal backwards, so that the
// masked triangle is at most Br x Br per query tile whatever Bc is. Masks and GQA k/v are read in place through their
// (zero) strides. Dropout multiplies P after the row sum is taken (the sum is of the undropped probabilities, as
// softmax-then-dropout), drawing random::dropout_keep for the element's flat index into [..., Hq, Lq, Lk], as the
// reference does.
//
// Under mask modifiers (qkv/attention_mods.h) the key tiles follow the mask: a window alone
// leaves each row tile one run of keys (ModPlan::interval), walked as one tile and masked by
// each row's ends; other masks list the tiles that may hold an allowed key
// (ModPlan::candidate_tiles), up to 512 keys of them one online-softmax step where they are
// small (gather_keys, run_group: BigBird's blocks of 64; runs of adjacent tiles read in place,
// lone tiles copied side by side). Empty tiles are skipped, full ones unmasked. Float Q K^T
// tiles read K packed once per call in gemm panels (attention_cpu_panels.h) where it pays.
//
// Weights (return_weights) come from a second pass over the same item, right
// after the first: scores are recomputed tile by tile into the item's rows of
// the weights tensor, then each row gets a plain softmax and the dropout.
//
// Element types: the kernel computes in T (float, or double for f64 inputs) and reads
// q, k, v in their own dtype S. For bf16/f16 inputs the tile GEMMs take the 16-bit
// operands as they are where qkv::gemm has a native kernel for them (gemm_has_native:
// AVX512-BF16, AMX), with float32 accumulation; the probabilities P are rounded to S for
// P V (as FlashAttention does), while the row sums l use P before rounding. Elsewhere
// (AVX2; f16 on oneDNN 2.6) the tiles are widened to float in the worker's scratch: Q
// rows once per work item, K and V tiles each time they are used. K and V are never
// converted as whole tensors.
//
// int8 Q K^T (options.qk_quantization, float32 inputs): K is smoothed and quantized once per
// call, each item's Q rows once per item, and score_tile runs the int8 product instead of
// the G one (attention_int8.h); P V stays on G (float, or bf16 with "medium").
//
// Work items are handed out dynamically (an atomic counter) to get_num_threads()
// workers; an item's arithmetic does not depend on which worker runs it, so the
// results do not depend on the thread count (except that a call with a single
// item lets oneDNN thread the tile GEMMs themselves).
#include "attention/attention_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>
#include <optional>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention/attention_cpu_panels.h"
#include "attention/attention_cpu_tiles.h"
#include "attention/flash_tiles.h"
#include "attention/problem.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "qkv/random.h"
#include "qkv/softmax.h"
#include "tensor/buffer_pool.h"

namespace qkv::attention {

namespace {

using tiles::as_kernel_input;
using tiles::as_kernel_mask;
using tiles::dropout_tile;
using tiles::empty_tile;
using tiles::Flash;
using tiles::gemm_operand;
using tiles::kNegInf;
using tiles::make_flash;
using tiles::Mat;
using tiles::Rows;
using tiles::score_tile;
using tiles::Types;

// A worker's buffers, reused across its items.
template <class K>
struct Scratch {
  using T = typename K::T;
  using G = typename K::G;
  std::vector<T> s;         // [Br, Bc] scores, then probabilities
  std::vector<T> m;         // [Br] running row max
  std::vector<T> l;         // [Br] running row sum of exp(s - m)
  std::vector<G> pg;        // [Br, Bc] P rounded for P V (kRoundP)
  std::vector<G> qg;        // [Br, Dk] the item's Q rows widened (kWiden)
  std::vector<G> kg;        // [Bc, Dk] a K tile widened (kWiden)
  std::vector<G> vg;        // [Bc, Dv] a V tile widened (kWiden)
  std::vector<G> kx;        // [gather, Dk] the K rows of gathered tiles (gather_keys), Bc a slot; or their panels
  std::vector<G> vx;        // [gather, Dv] their V rows
  int8::QuantizedQuery q8;  // the item's Q rows on int8 (qk_quantization; empty otherwise)
  // [gather / Bc] the K and V rows each slot of kx and vx holds (null: none; place_gathered).
  // Both: a k broadcast over the batch (zero stride) meets different v rows.
  std::vector<std::pair<const G*, const G*>> held;
  // s and pg hold [Br, max(Bc, gather)] (gathered tiles are up to `gather` keys wide).
  Scratch(const FlashTiles& t, int64_t dk, int64_t dv, bool int8, int64_t gather, bool panels)
      : s(size(t.br * std::max(t.bc, gather))),
        m(size(t.br)),
        l(size(t.br)),
        pg(size(K::kRoundP ? t.br * std::max(t.bc, gather) : 0)),
        qg(size(K::kWiden ? t.br * dk : 0)),
        kg(size(K::kWiden ? t.bc * dk : 0)),
        vg(size(K::kWiden ? t.bc * dv : 0)),
        kx(size(panels ? gemm_panels_size(dk, gather) : gather * dk)),
        vx(size(gather * dv)),
        q8(int8 ? t.br : 0, int8 ? t.bc : 0, int8 ? dk : 0),
        held(size(gather / t.bc)) {}
  static size_t size(int64_t n) { return static_cast<size_t>(n); }
};

template <class K>
Rows<K> rows_of(const Flash<K>& f, int64_t item) {
  const Problem& p = *f.p;
  const int64_t tiles_q = (p.lq + f.tiles.br - 1) / f.tiles.br;
  Rows<K> r;
  r.b = item / tiles_q;
  int64_t t = item % tiles_q;
  if (f.causal) t = tiles_q - 1 - t;  // longest rows first: better dynamic balance
  r.i0 = t * f.tiles.br;
  r.rows = std::min(f.tiles.br, p.lq - r.i0);
  r.kv_end = f.causal ? std::min(p.lk, r.i0 + r.rows) : p.lk;
  r.q = f.q + batch_offset(p.q, p.batch, r.b, 1) + r.i0 * p.q.stride(-2);
  r.k = f.k + batch_offset(p.k, p.batch, r.b, p.gqa_group);
  r.v = f.v + batch_offset(p.v, p.batch, r.b, p.gqa_group);
  r.mask_base = p.mask ? batch_offset(*p.mask, p.batch, r.b, 1) : 0;
  r.o = f.out + (r.b * p.lq + r.i0) * p.dv;
  return r;
}

// Scores of some keys of a tile's rows: [rows, cols], row stride lds.
template <class T>
struct Segment {
  T* s = nullptr;
  int64_t lds = 0, cols = 0;
};

// Online softmax over one step's keys, held in `count` segments (the columns of one score
// tile, or run_group's products): the scores become exp(s - m_new), the running m and l
// [rows] are updated and o [rows, Dv] is rescaled.
template <class T>
void softmax_segments(const Segment<T>* seg, size_t count, int64_t rows, T* m, T* l, T* o, int64_t dv) {
  for (int64_t x = 0; x < rows; ++x) {
    T mx = kNegInf<T>;
    for (size_t c = 0; c < count; ++c) {
      const T v = kernels::max_value(seg[c].s + x * seg[c].lds, seg[c].cols);
      if (!std::isnan(mx) && (v > mx || std::isnan(v))) mx = v;  // a NaN stays
    }
    const T m_new = (mx > m[x] || std::isnan(mx)) ? mx : m[x];
    if (m_new == kNegInf<T>) {  // every key so far masked: nothing to add
      for (size_t c = 0; c < count; ++c) std::fill_n(seg[c].s + x * seg[c].lds, seg[c].cols, T(0));
      continue;
    }
    // exp(-inf) = 0 on the first keys that count; NaN stays NaN.
    const T alpha = m_new == m[x] ? T(1) : std::exp(m[x] - m_new);
    T sum = 0;
    for (size_t c = 0; c < count; ++c) {
      sum += kernels::exp_shift_sum_fast(seg[c].s + x * seg[c].lds, seg[c].cols, m_new);
    }
    if (alpha != T(1)) {
      l[x] *= alpha;
      kernels::scale(o + x * dv, dv, alpha);
    }
    l[x] += sum;
    m[x] = m_new;
  }
}

// Online softmax over one tile s [rows, cols] (softmax_segments).
template <class T>
void softmax_tile(T* s, int64_t lds, int64_t rows, int64_t cols, T* m, T* l, T* o, int64_t dv) {
  const Segment<T> one{s, lds, cols};
  softmax_segments(&one, 1, rows, m, l, o, dv);
}

// o [rows, Dv] += p [rows, cols] v [cols, Dv].
template <class K, class T = typename K::T, class G = typename K::G>
void value_product(const Flash<K>& f, const Rows<K>& r, Mat<G> v, int64_t cols, const T* s, int64_t lds,
                   Scratch<K>& sc) {
  const Problem& p = *f.p;
  const Mat<G> pm = gemm_operand(s, r.rows, cols, lds, sc.pg);  // [rows, cols]
  GemmShape g;
  g.m = r.rows;
  g.n = p.dv;
  g.k = cols;
  g.lda = pm.ld;
  g.ldb = v.ld;
  g.ldc = p.dv;
  gemm(g, T(1), pm.data, v.data, T(1), r.o);
}

// o [rows, Dv] += p [rows, cols] V[j0:j0+cols].
template <class K, class T = typename K::T>
void value_tile(const Flash<K>& f, const Rows<K>& r, int64_t j0, int64_t cols, const T* s, int64_t lds,
                Scratch<K>& sc) {
  const Problem& p = *f.p;
  value_product(f, r, gemm_operand(r.v + j0 * p.v.stride(-2), cols, p.dv, p.v.stride(-2), sc.vg), cols, s, lds, sc);
}

// Keys per gathered tile, or 0. Where the mask's candidate key tiles are small (BigBird's
// blocks of 64: the window's three, the global and the random ones), up to kGatherKeys keys
// of them run as one online-softmax step (run_group): full attention measured 142 GFLOP/s
// on 64x64 tiles and 164 on 64x448 (attention_mods_bench, L = 4096, 2 threads, AMD EPYC
// Zen 4). Not with widened 16-bit tiles or int8 Q K^T (their per-tile buffers).
template <class K>
int64_t gather_keys(const Flash<K>& f) {
  constexpr int64_t kGatherKeys = 512;
  const bool small = f.mods.masking && !f.mods.interval && 2 * f.tiles.bc <= kGatherKeys;
  return small && !K::kWiden && f.k8 == nullptr ? kGatherKeys / f.tiles.bc * f.tiles.bc : 0;
}

// dst [rows, n] (dense) = rows of n elements, ld apart, from src.
template <class G>
void copy_rows(const G* src, int64_t rows, int64_t n, int64_t ld, G* dst) {
  if (ld == n) {
    std::copy_n(src, rows * n, dst);  // the tile's rows are one run (contiguous K and V)
    return;
  }
  for (int64_t x = 0; x < rows; ++x) std::copy_n(src + x * ld, n, dst + x * n);
}

using Tile = std::pair<int64_t, int64_t>;  // a key tile: (j0, cols)

// Copies the key tiles `pick` into slots [0, pick.size()) of sc.kx / sc.vx (Bc rows a slot)
// but for those a slot among them already holds (sc.held: the worker's earlier groups; each
// row tile of a head reads BigBird's global blocks, copied once per head and worker);
// at[x] = the first row of pick[x]. A tile narrower than Bc (the last keys) takes the last
// slot, so that the slots' rows are one dense run.
template <class K>
void place_gathered(const Flash<K>& f, const Rows<K>& r, const std::vector<Tile>& pick, std::vector<int64_t>& at,
                    Scratch<K>& sc) {
  using G = typename K::G;
  const Problem& p = *f.p;
  const int64_t bc = f.tiles.bc, ks = p.k.stride(-2), vs = p.v.stride(-2);
  const size_t c = pick.size();
  thread_local std::vector<char> taken;  // [c] the slots given
  taken.assign(c, 0);
  at.assign(c, -1);
  const int64_t panel = r.kp ? gemm_panels_size(p.dk, 64) : 0;  // floats of 64 packed keys
  using Held = std::pair<const G*, const G*>;
  auto rows_of_tile = [&](size_t x) { return Held{r.k + pick[x].first * ks, r.v + pick[x].first * vs}; };
  auto put = [&](size_t x, size_t slot, Held held) {
    const auto [j0, cols] = pick[x];
    if (r.kp) {  // the tile's whole panels (the forward packs all of K: Rows::kp_from is 0)
      std::copy_n(r.kp + j0 / 64 * panel, (cols + 63) / 64 * panel,
                  sc.kx.data() + static_cast<int64_t>(slot) * bc / 64 * panel);
    } else {
      copy_rows(r.k + j0 * ks, cols, p.dk, ks, sc.kx.data() + static_cast<int64_t>(slot) * bc * p.dk);
    }
    copy_rows(r.v + j0 * vs, cols, p.dv, vs, sc.vx.data() + static_cast<int64_t>(slot) * bc * p.dv);
    sc.held[slot] = held;
    at[x] = static_cast<int64_t>(slot), taken[slot] = 1;
  };
  for (size_t x = 0; x < c; ++x) {
    if (pick[x].second < bc) put(x, c - 1, Held{});
  }
  for (size_t x = 0; x < c; ++x) {  // already there
    const Held key = rows_of_tile(x);
    for (size_t slot = 0; slot < c && at[x] < 0; ++slot) {
      if (!taken[slot] && sc.held[slot] == key) at[x] = static_cast<int64_t>(slot), taken[slot] = 1;
    }
  }
  size_t slot = 0;
  for (size_t x = 0; x < c; ++x) {
    if (at[x] >= 0) continue;
    while (taken[slot]) ++slot;
    put(x, slot, rows_of_tile(x));
  }
  for (int64_t& a : at) a *= bc;
}

// One product of a group of key tiles: keys read from k and v; its scores are the group's
// columns [col, col + cols), held densely at s + rows * col.
template <class G>
struct Piece {
  Mat<G> k, v;
  int64_t col = 0, cols = 0;
  const G* kp = nullptr;  // the keys' panels (Rows::kp) or null
};

// A group of key tiles (descending) as one online-softmax step: runs of adjacent tiles are
// read in place, lone tiles gathered (place_gathered); one Q K^T and one P V per run and
// one for the gathered tiles, each into a dense score block: oneDNN 2.6 runs a product whose
// C (Q K^T) or A (P V) rows are further apart than their length on its gemm:jit kernels
// instead of brgemm (as 64 x 448 tiles with a row stride of 512 did). Each tile's modifiers
// apply to its own columns.
template <class K>
void run_group(const Flash<K>& f, const Rows<K>& r, Mat<typename K::G> q, const std::vector<Tile>& group,
               Scratch<K>& sc) {
  using T = typename K::T;
  using G = typename K::G;
  const Problem& p = *f.p;
  const int64_t ks = p.k.stride(-2), vs = p.v.stride(-2);
  thread_local std::vector<Piece<G>> pieces;
  thread_local std::vector<Segment<T>> segs;
  thread_local std::vector<Tile> pick;
  thread_local std::vector<int64_t> at, of, pick_at, pick_of;  // group[x]: its first column, its piece
  pieces.clear(), pick.clear(), pick_of.clear();
  at.assign(group.size(), 0), of.assign(group.size(), 0);
  int64_t n = 0;  // columns so far
  for (size_t x = 0, y = 0; x < group.size(); x = y) {
    for (y = x + 1; y < group.size() && group[y].first + group[y].second == group[y - 1].first;) ++y;
    if (y - x == 1 && group.size() > 1) {  // a lone tile
      pick.push_back(group[x]), pick_of.push_back(static_cast<int64_t>(x));
      continue;
    }
    const int64_t first = group[y - 1].first, cols = group[x].first + group[x].second - first;
    for (size_t z = x; z < y; ++z) at[z] = group[z].first - first, of[z] = static_cast<int64_t>(pieces.size());
    const G* kp = r.kp ? r.kp + first / 64 * gemm_panels_size(p.dk, 64) : nullptr;
    pieces.push_back({{r.k + first * ks, ks}, {r.v + first * vs, vs}, n, cols, kp});
    n += cols;
  }
  segs.clear();
  auto product = [&](const Piece<G>& c) {
    segs.push_back({sc.s.data() + r.rows * c.col, c.cols, c.cols});  // [rows, cols]
    tiles::product(f, r, q, c.k, c.cols, segs.back().s, c.cols, c.kp);
  };
  for (const Piece<G>& c : pieces) product(c);
  if (!pick.empty()) {
    place_gathered(f, r, pick, pick_at, sc);
    int64_t cols = 0;
    for (size_t x = 0; x < pick.size(); ++x) {
      const auto z = static_cast<size_t>(pick_of[x]);
      at[z] = pick_at[x], of[z] = static_cast<int64_t>(pieces.size());
      cols += pick[x].second;
    }
    pieces.push_back({{sc.kx.data(), p.dk}, {sc.vx.data(), p.dv}, n, cols, r.kp ? sc.kx.data() : nullptr});
    product(pieces.back());
    n += cols;
  }
  for (size_t x = 0; x < group.size(); ++x) {
    const Segment<T>& g = segs[static_cast<size_t>(of[x])];
    tiles::modify_tile(f, r, group[x].first, group[x].second, g.s + at[x], g.lds, kNegInf<T>, static_cast<T*>(nullptr));
  }
  softmax_segments(segs.data(), segs.size(), r.rows, sc.m.data(), sc.l.data(), r.o, p.dv);
  for (size_t x = 0; x < group.size() && f.dropout_p > 0.0; ++x) {
    const Segment<T>& g = segs[static_cast<size_t>(of[x])];
    dropout_tile(f, r, group[x].first, group[x].second, g.s + at[x], g.lds);
  }
  for (size_t c = 0; c < pieces.size(); ++c)
    value_product(f, r, pieces[c].v, pieces[c].cols, segs[c].s, segs[c].lds, sc);
}

// Rows r against the mask's candidate key tiles (`starts`, ascending), walked backwards as
// run_rows does, in groups of up to `width` keys (gather_keys), each group one step (run_group).
template <class K>
void gathered_tiles(const Flash<K>& f, const Rows<K>& r, Mat<typename K::G> q, const std::vector<int64_t>& starts,
                    int64_t width, Scratch<K>& sc) {
  thread_local std::vector<Tile> group;
  int64_t n = 0;  // keys in the group
  group.clear();
  for (auto it = starts.rbegin(); it != starts.rend(); ++it) {
    if (*it >= r.kv_end) continue;
    const int64_t cols = std::min(f.tiles.bc, r.kv_end - *it);
    if (empty_tile(f, r, *it, cols)) continue;  // no key of the tile is allowed
    if (n + cols > width) {
      run_group(f, r, q, group, sc);
      group.clear(), n = 0;
    }
    group.emplace_back(*it, cols);
    n += cols;
  }
  if (!group.empty()) run_group(f, r, q, group, sc);
}

// o [Dv] = the mean of the entry's V rows: uniform weights over every key (a row that
// masked_fill left without an allowed key; qkv/attention_mods.h).
template <class K, class T = typename K::T>
void uniform_row(const Flash<K>& f, const Rows<K>& r, T* o) {
  const Problem& p = *f.p;
  std::fill(o, o + p.dv, T(0));
  std::vector<T> row(static_cast<size_t>(p.dv));
  for (int64_t j = 0; j < p.lk; ++j) {
    const auto* vj = r.v + j * p.v.stride(-2);  // [Dv]
    if constexpr (std::is_same_v<typename K::S, T>) {
      std::copy(vj, vj + p.dv, row.begin());
    } else {
      kernels::widen(vj, p.dv, row.data());
    }
    for (int64_t c = 0; c < p.dv; ++c) o[c] += row[static_cast<size_t>(c)];
  }
  kernels::scale(o, p.dv, T(1) / static_cast<T>(p.lk));
}

// o /= l, and lse = m + log(l). Fully masked rows (l == 0) keep o, the sum of
// 0 * v (0, or NaN where v has a NaN or inf, as PyTorch), and get lse -inf.
template <class K, class T = typename K::T>
void finish_rows(const Flash<K>& f, const Rows<K>& r, const T* m, const T* l) {
  const Problem& p = *f.p;
  const std::optional<double>& fill = f.mods.mods->masked_fill;
  for (int64_t x = 0; x < r.rows; ++x) {
    T* o = r.o + x * p.dv;  // [Dv]
    if (l[x] != T(0)) kernels::scale(o, p.dv, T(1) / l[x]);
    if (l[x] == T(0) && fill && p.lk > 0) {  // masked_fill: no allowed key, every score `fill`
      uniform_row(f, r, o);
      if (f.lse) f.lse[r.b * p.lq + r.i0 + x] = static_cast<T>(*fill + std::log(static_cast<double>(p.lk)));
      continue;
    }
    if (f.lse) {
      const T lse = l[x] == T(0) ? kNegInf<T> : static_cast<T>(m[x] + std::log(static_cast<double>(l[x])));
      f.lse[r.b * p.lq + r.i0 + x] = lse;
    }
  }
}

// Second pass: the item's rows of the weights [rows, Lk], recomputed tile by
// tile, then a plain softmax per row and the dropout.
template <class K, class G = typename K::G>
void weight_rows(const Flash<K>& f, const Rows<K>& r, Mat<G> q, Scratch<K>& sc, int8::QuantizedQuery* q8) {
  using T = typename K::T;
  const Problem& p = *f.p;
  T* w = f.weights + (r.b * p.lq + r.i0) * p.lk;  // [rows, Lk]
  const std::optional<double>& fill = f.mods.mods->masked_fill;
  const T masked = fill ? static_cast<T>(*fill) : kNegInf<T>;  // masked_fill: its softmax, exactly
  for (int64_t j0 = 0; j0 < r.kv_end; j0 += f.tiles.bc) {
    score_tile(f, r, q, j0, std::min(f.tiles.bc, r.kv_end - j0), w + j0, p.lk, sc.kg, masked, static_cast<T*>(nullptr),
               q8);
  }
  kernels::softmax_rows(w, r.rows, r.kv_end, p.lk);  // fully masked rows give zeros
  // Keys after the row's own causal end are not in the row: weight 0, even in a NaN row.
  for (int64_t x = 0; x < r.rows; ++x) {
    const int64_t end = f.causal ? std::min(p.lk, r.i0 + x + 1) : p.lk;
    std::fill(w + x * p.lk + end, w + (x + 1) * p.lk, T(0));
  }
  if (f.dropout_p > 0.0) dropout_tile(f, r, 0, r.kv_end, w, p.lk);
}

template <class K>
void run_rows(const Flash<K>& f, const Rows<K>& r, Scratch<K>& sc) {
  using T = typename K::T;
  const Problem& p = *f.p;
  const int64_t lds = f.tiles.bc;
  const auto q = gemm_operand(r.q, r.rows, p.dk, p.q.stride(-2), sc.qg);  // [rows, Dk], once per item
  int8::QuantizedQuery* q8 = nullptr;  // the same rows on int8, once per item (qk_quantization)
  if constexpr (std::is_same_v<typename K::S, float>) {
    if (f.k8) {
      int8::quantize_query(r.q, r.rows, p.q.stride(-2), *f.k8, r.b, sc.q8);
      q8 = &sc.q8;
    }
  }
  std::fill(sc.m.begin(), sc.m.begin() + r.rows, kNegInf<T>);
  std::fill(sc.l.begin(), sc.l.begin() + r.rows, T(0));
  std::fill(r.o, r.o + r.rows * p.dv, T(0));
  auto tile = [&](int64_t j0, int64_t cols) {
    if (empty_tile(f, r, j0, cols)) return;  // no key of the tile is allowed: nothing to add
    score_tile(f, r, q, j0, cols, sc.s.data(), lds, sc.kg, kNegInf<T>, static_cast<T*>(nullptr), q8);
    softmax_tile(sc.s.data(), lds, r.rows, cols, sc.m.data(), sc.l.data(), r.o, p.dv);
    if (f.dropout_p > 0.0) dropout_tile(f, r, j0, cols, sc.s.data(), lds);
    value_tile(f, r, j0, cols, sc.s.data(), lds, sc);
  };
  // Under mask modifiers: the tiles the mask may leave keys in (aligned at multiples of Bc).
  thread_local std::vector<int64_t> candidates;
  if (f.mods.interval) {  // the rows' keys are one run [lo, hi): its tiles, backwards from hi
    const int64_t lo = f.mods.key_lo(r.i0), hi = std::min(f.mods.key_hi(r.i0 + r.rows - 1), r.kv_end);
    for (int64_t end = hi; end > lo; end -= f.tiles.bc) {
      // Widths a multiple of 16, reaching back before the run (keys every row masks): oneDNN
      // ran a window of 512's 575-key tiles 10% slower than 576 (127 vs 115 ms, L = 16384).
      const int64_t cols = std::min(f.tiles.bc, (end - std::max(lo, end - f.tiles.bc) + 15) / 16 * 16);
      const int64_t j0 = std::max<int64_t>(0, end - cols);
      tile(j0, end - j0);
    }
  } else if (const int64_t width = gather_keys(f); width > 0) {
    if (!f.mods.candidate_tiles(r.i0, r.i0 + r.rows, f.tiles.bc, candidates)) {  // every tile (a global query)
      candidates.clear();
      for (int64_t j0 = 0; j0 < r.kv_end; j0 += f.tiles.bc) candidates.push_back(j0);
    }
    if constexpr (!K::kWiden) gathered_tiles(f, r, q, candidates, width, sc);  // K and V as the GEMM reads them
  } else if (f.mods.masking && f.mods.candidate_tiles(r.i0, r.i0 + r.rows, f.tiles.bc, candidates)) {
    for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
      if (*it < r.kv_end) tile(*it, std::min(f.tiles.bc, r.kv_end - *it));
    }
  } else {
    // Key tiles end at kv_end and go backwards: only the tile at the first keys may be
    // partial (with causal masking, a multiple of Br wide), and the masked part of the
    // diagonal stays within the last Br columns. Under mask modifiers, or on packed keys
    // (Rows::kp: whole panels) without causal masking, they start at multiples of Bc instead.
    const bool aligned = (f.mods.masking || (r.kp && !f.causal)) && r.kv_end > 0;
    const int64_t first_end = aligned ? (r.kv_end - 1) / f.tiles.bc * f.tiles.bc + f.tiles.bc : r.kv_end;
    for (int64_t hi = first_end; hi > 0; hi -= f.tiles.bc) {
      const int64_t j0 = std::max<int64_t>(0, hi - f.tiles.bc);
      tile(j0, std::min(hi, r.kv_end) - j0);
    }
  }
  finish_rows(f, r, sc.m.data(), sc.l.data());
  if (f.weights) weight_rows(f, r, q, sc, q8);
}

// The order in which items are handed out (empty: as numbered). Row tiles holding a global
// query (every key: BigBird's first and last blocks, 37x an interior row tile's work at
// L = 16384) go first: the last item of a call was one, and one worker ran it alone.
template <class K>
std::vector<int64_t> item_order(const Flash<K>& f, int64_t items) {
  const std::vector<int64_t>& global = f.mods.global_q_sorted;
  std::vector<int64_t> order;
  if (f.causal || global.empty()) return order;
  const int64_t br = f.tiles.br, tiles_q = (f.p->lq + br - 1) / br;
  order.resize(static_cast<size_t>(items));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_partition(order.begin(), order.end(), [&](int64_t item) {
    const int64_t i0 = item % tiles_q * br;
    const auto it = std::lower_bound(global.begin(), global.end(), i0);
    return it != global.end() && *it < i0 + br;
  });
  return order;
}

// Every item, on get_num_threads() workers taking items from a shared counter.
template <class K>
void run_all(const Flash<K>& f, const tiles::KeyPanels* panels) {
  const Problem& p = *f.p;
  const int64_t items = p.batch_size * ((p.lq + f.tiles.br - 1) / f.tiles.br);
  if (items == 0) return;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::min<int64_t>(get_num_threads(), items);
  const std::vector<int64_t> order = item_order(f, items);
  parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    Scratch<K> sc(f.tiles, p.dk, p.dv, f.k8 != nullptr, gather_keys(f), panels != nullptr);
    for (int64_t item = next++; item < items && !interrupt_requested(); item = next++) {
      Rows<K> r = rows_of(f, order.empty() ? item : order[static_cast<size_t>(item)]);
      if constexpr (std::is_same_v<typename K::G, float>) r.kp = panels ? panels->of(r.k - f.k) : nullptr;
      run_rows(f, r, sc);
    }
  });
}

// The call over a problem whose q, k, v are S and floating mask T (flash_attention_cpu).
template <class K>
AttentionResult run_flash(const Problem& p, const AttentionOptions& options) {
  using T = typename K::T;
  const DType dt = dtype_of<T>::value;  // of the output accumulator, lse and weights
  // Pooled, huge-page advised (tensor/buffer_pool.h): a fresh 32 MB output (L = 16384, H = 8,
  // D = 64) page-faulted 8192 times per call, 6% of a sliding window's time there.
  Tensor out = kernels::empty_pooled(with_tail(p.batch, {p.lq, p.dv}), dt);  // [batch..., Lq, Dv]
  std::optional<Tensor> lse, weights;
  if (options.return_logsumexp) lse = Tensor::empty(with_tail(p.batch, {p.lq}), dt);  // [batch..., Lq]
  if (options.return_weights)
    weights = kernels::empty_pooled(with_tail(p.batch, {p.lq, p.lk}), dt);  // [batch..., Lq, Lk]

  const bool automatic = options.tuning.flash_tiles.is_auto() && !flash_tiles_from_env();
  const FlashTiles mod = mod_tiles(
      choose_flash_tiles(options.tuning.flash_tiles, flash_tiles_from_env(), p.lq, p.lk, p.dk, p.dv, options.is_causal),
      automatic, options.mods, p.lq, p.lk);
  const FlashTiles tiles = interval_tiles(mod, automatic, options.mods, p.lq, p.lk, p.dk, p.dv);
  Flash<K> f = make_flash<K>(p, options, tiles);
  f.out = out.data<T>();
  f.lse = lse ? lse->data<T>() : nullptr;
  f.weights = weights ? weights->data<T>() : nullptr;
  std::optional<int8::QuantizedKeys> k8;  // K smoothed and quantized once per call (attention_int8.h)
  if constexpr (std::is_same_v<typename K::S, float>) {
    if (options.qk_quantization != QKQuantization::none) {
      k8 = int8::quantize_keys(p, options.qk_quantization == QKQuantization::int8);
      f.k8 = &*k8;
    }
  }
  const std::optional<tiles::KeyPanels> panels = tiles::pack_keys(f, gather_keys(f) > 0);
  run_all(f, panels ? &*panels : nullptr);

  AttentionResult result;
  result.output = out.to(p.out_dtype);
  if (weights) result.weights = weights->to(p.out_dtype);
  result.logsumexp = lse;
  return result;
}

}  // namespace

AttentionResult flash_attention_cpu(const Problem& checked, const AttentionOptions& options) {
  if (!checked.device.is_cpu()) fail_no_kernel(checked.op, checked.device);  // reads host memory
  // The same geometry over q, k, v in their dtype with rows the tile GEMMs can read, and
  // a floating mask in the compute type (converted at the user's shape, never per head).
  const DType in = checked.out_dtype;
  const DType compute = in == DType::f64 ? DType::f64 : DType::f32;
  const Problem p = with_operands(checked, as_kernel_input(checked.q_in), as_kernel_input(checked.k_in),
                                  as_kernel_input(checked.v_in), as_kernel_mask(checked.mask_in, compute));
  switch (in) {
    case DType::f64: return run_flash<Types<double, double, double>>(p, options);
    case DType::bf16:
      if (gemm_has_native(DType::bf16)) return run_flash<Types<float, bfloat16, bfloat16>>(p, options);
      return run_flash<Types<float, bfloat16, float>>(p, options);
    case DType::f16:
      if (gemm_has_native(DType::f16)) return run_flash<Types<float, float16, float16>>(p, options);
      return run_flash<Types<float, float16, float>>(p, options);
    default:  // f32; "medium" precision: bf16 tiles where they are native (qkv/attention.h)
      if (options.matmul_precision == MatmulPrecision::medium && gemm_has_native(DType::bf16)) {
        return run_flash<Types<float, float, bfloat16>>(p, options);
      }
      return run_flash<Types<float, float, float>>(p, options);
  }
}

}  // namespace qkv::attention
