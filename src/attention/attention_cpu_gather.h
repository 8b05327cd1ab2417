// The fused CPU forward's worker scratch, its online-softmax step over score segments, and
// the gathered key tiles (gather_keys, run_group: BigBird's blocks as one step; runs of
// adjacent tiles read in place, lone tiles copied side by side). Internal to
// attention_cpu.cc, which includes it once.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention/attention_cpu_tiles.h"
#include "attention/flash_tiles.h"
#include "attention/problem.h"
#include "kernels/cpu/aligned_vector.h"
#include "qkv/gemm.h"
#include "qkv/softmax.h"

namespace qkv::attention::tiles {

// A worker's buffers, reused across its items; cache-line aligned as tensors are
// (kernels/cpu/aligned_vector.h): std::vector's large buffers start 16 bytes into a line here.
template <class K>
struct Scratch {
  using T = typename K::T;
  using G = typename K::G;
  kernels::AlignedVector<T> s;   // [Br, Bc] scores, then probabilities
  kernels::AlignedVector<T> m;   // [Br] running row max
  kernels::AlignedVector<T> l;   // [Br] running row sum of exp(s - m)
  kernels::AlignedVector<G> pg;  // [Br, Bc] P rounded for P V (kRoundP)
  kernels::AlignedVector<G> qg;  // [Br, Dk] the item's Q rows widened (kWiden) or chunk-major (Flash::chunk)
  kernels::AlignedVector<G> kg;  // [Bc, Dk] a K tile widened (kWiden) or chunk-major (Flash::chunk)
  kernels::AlignedVector<G> vg;  // [Bc, Dv] a V tile widened (kWiden)
  kernels::AlignedVector<G> kx;  // [gather, Dk] the K rows of gathered tiles (gather_keys), Bc a slot; or their panels
  kernels::AlignedVector<G> vx;  // [gather, Dv] their V rows
  int8::QuantizedQuery q8;       // the item's Q rows on int8 (qk_quantization; empty otherwise)
  // [gather / Bc] the K and V rows each slot of kx and vx holds (null: none; place_gathered).
  // Both: a k broadcast over the batch (zero stride) meets different v rows.
  std::vector<std::pair<const G*, const G*>> held;
  kernels::AlignedVector<T> o;  // [Br, Dv] the item's output rows, where they are stored once (run_all: streamed)
  // [Lk, Dk] and [Lk, Dv]: the K and V rows at `widened` (k, v of an entry) widened whole (widen_head).
  kernels::AlignedVector<G> kw, vw;
  std::pair<const void*, const void*> widened{nullptr, nullptr};
  // s and pg hold [Br, max(Bc, gather)] (gathered tiles are up to `gather` keys wide).
  Scratch(const FlashTiles& t, int64_t dk, int64_t dv, bool int8, int64_t gather, bool panels, bool own_output,
          bool chunked)
      : s(size(t.br * std::max(t.bc, gather))),
        m(size(t.br)),
        l(size(t.br)),
        pg(size(K::kRoundP ? t.br * std::max(t.bc, gather) : 0)),
        qg(size(K::kWiden || chunked ? t.br * dk : 0)),
        kg(size(K::kWiden || chunked ? t.bc * dk : 0)),
        vg(size(K::kWiden ? t.bc * dv : 0)),
        kx(size(panels ? gemm_panels_size(dk, gather) : gather * dk)),
        vx(size(gather * dv)),
        q8(int8 ? t.br : 0, int8 ? t.bc : 0, int8 ? dk : 0),
        held(size(gather / t.bc)),
        o(size(own_output ? t.br * dv : 0)) {}
  static size_t size(int64_t n) { return static_cast<size_t>(n); }
};

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
  using G = typename K::G;
  const Mat<G> v = r.vw ? Mat<G>{r.vw + j0 * p.dv, p.dv}
                        : gemm_operand(r.v + j0 * p.v.stride(-2), cols, p.dv, p.v.stride(-2), sc.vg);
  value_product(f, r, v, cols, s, lds, sc);
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

// Copies the key tiles `pick` into slots [0, pick.size()) of sc.kx / sc.vx (Bc rows a slot),
// pick[x] into slot x but a tile narrower than Bc (the last keys) into the last slot, swapped
// with the tile there (so that the slots' rows are one dense run); at[x] = the first row of
// pick[x]. The slots are a function of `pick` alone, so an item's columns and its P V
// summation order do not depend on which worker runs it or what that worker ran before;
// a slot that still holds the same rows (sc.held: BigBird's global blocks, read by every row
// tile of a head) is not copied again.
template <class K>
void place_gathered(const Flash<K>& f, const Rows<K>& r, const std::vector<Tile>& pick, std::vector<int64_t>& at,
                    Scratch<K>& sc) {
  using G = typename K::G;
  const Problem& p = *f.p;
  const int64_t bc = f.tiles.bc, ks = p.k.stride(-2), vs = p.v.stride(-2);
  const size_t c = pick.size();
  at.assign(c, 0);
  const int64_t panel = r.kp ? gemm_panels_size(p.dk, 64) : 0;  // floats of 64 packed keys
  using Held = std::pair<const G*, const G*>;
  size_t narrow = c;  // the tile narrower than Bc, if any
  for (size_t x = 0; x < c; ++x) {
    if (pick[x].second < bc) narrow = x;
  }
  for (size_t x = 0; x < c; ++x) {
    const size_t slot = x == narrow ? c - 1 : (narrow < c && x == c - 1 ? narrow : x);
    const auto [j0, cols] = pick[x];
    at[x] = static_cast<int64_t>(slot) * bc;
    const Held held = x == narrow ? Held{} : Held{r.k + j0 * ks, r.v + j0 * vs};
    if (x != narrow && sc.held[slot] == held) continue;  // already there
    if (r.kp) {  // the tile's whole panels (the forward packs all of K: Rows::kp_from is 0)
      std::copy_n(r.kp + j0 / 64 * panel, (cols + 63) / 64 * panel,
                  sc.kx.data() + static_cast<int64_t>(slot) * bc / 64 * panel);
    } else {
      copy_rows(r.k + j0 * ks, cols, p.dk, ks, sc.kx.data() + static_cast<int64_t>(slot) * bc * p.dk);
    }
    copy_rows(r.v + j0 * vs, cols, p.dv, vs, sc.vx.data() + static_cast<int64_t>(slot) * bc * p.dv);
    sc.held[slot] = held;
  }
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

}  // namespace qkv::attention::tiles
