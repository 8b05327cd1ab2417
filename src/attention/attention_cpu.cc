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
// small (attention_cpu_gather.h: BigBird's blocks of 64; runs of adjacent tiles read in place,
// lone tiles copied side by side). Empty tiles are skipped, full ones unmasked. Float Q K^T
// tiles read K packed once per call in gemm panels (attention_cpu_panels.h) where it pays.
// Float32 Q K^T over Dk > 128 sums Dk chunks of 64, one product each (tiles::score_chunk:
// the accuracy of torch's blocked sums; not on the gathered tiles).
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
// Work items are handed out dynamically (ItemQueue: atomic counters; whole entries first
// where a worker widens an entry's 16-bit K and V) to get_num_threads() workers; an item's
// arithmetic does not depend on which worker runs it, so the results do not depend on the
// thread count (except that a call with a single item lets oneDNN thread the tile GEMMs
// themselves). Outputs larger than the workers' L2 are stored once per item, streamed, and
// 16-bit outputs are rounded into place item by item (run_all). Where the items are too few
// for the workers (fewer than 4 a worker and not a multiple of them: one head of a prefill
// chunk over a long cache), each item's key tiles are cut into parts run by any worker and
// merged by logsumexp (run_split, attention_cpu_split.h); the rounding then depends on the
// number of parts, which follows the thread count.
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

#include "attention/attention_cpu_gather.h"
#include "attention/attention_cpu_panels.h"
#include "attention/attention_cpu_split.h"
#include "attention/attention_cpu_tiles.h"
#include "attention/flash_tiles.h"
#include "attention/problem.h"
#include "kernels/cpu/copy_transpose.h"
#include "kernels/cpu/parallel_internal.h"
#include "qkv/error.h"
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
using tiles::gather_keys;
using tiles::gathered_tiles;
using tiles::gemm_operand;
using tiles::kNegInf;
using tiles::make_flash;
using tiles::Mat;
using tiles::Rows;
using tiles::score_tile;
using tiles::Scratch;
using tiles::softmax_tile;
using tiles::Types;
using tiles::value_tile;

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
  r.o = f.out ? f.out + (r.b * p.lq + r.i0) * p.dv : nullptr;  // null: rows rounded into a 16-bit output (run_all)
  return r;
}

// o [Dv] = the mean of the entry's V rows: uniform weights over every key (row x of the item,
// which masked_fill left without an allowed key; qkv/attention_mods.h), each dropped or scaled
// by the dropout as any weight (dropout_tile's draw); the undropped mean was O(1) off the
// reference and the returned weights with dropout_p > 0.
template <class K, class T = typename K::T>
void uniform_row(const Flash<K>& f, const Rows<K>& r, int64_t x, T* o) {
  const Problem& p = *f.p;
  std::fill(o, o + p.dv, T(0));
  std::vector<T> row(static_cast<size_t>(p.dv));
  const uint64_t index = tiles::dropout_index(f, r, x, 0);  // of key 0
  for (int64_t j = 0; j < p.lk; ++j) {
    const auto* vj = r.v + j * p.v.stride(-2);  // [Dv]
    if constexpr (std::is_same_v<typename K::S, T>) {
      std::copy(vj, vj + p.dv, row.begin());
    } else {
      kernels::widen(vj, p.dv, row.data());
    }
    // A dropped key still adds 0 * v_j (NaN where v_j is), as the reference does.
    const T w = f.dropout_p == 0.0                                                            ? T(1)
                : random::dropout_keep(f.seed, index + static_cast<uint64_t>(j), f.dropout_p) ? f.keep_scale
                                                                                              : T(0);
    for (int64_t c = 0; c < p.dv; ++c) o[c] += w * row[static_cast<size_t>(c)];
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
      uniform_row(f, r, x, o);
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

// The item's Q rows as the tile GEMMs read them, and on int8 where the call quantizes Q K^T
// (once per item, or per key part: run_part); m, l and the output rows r.o zeroed.
template <class K>
struct RowStart {
  Mat<typename K::G> q;
  int8::QuantizedQuery* q8 = nullptr;
};

template <class K>
RowStart<K> start_rows(const Flash<K>& f, const Rows<K>& r, Scratch<K>& sc) {
  using T = typename K::T;
  const Problem& p = *f.p;
  RowStart<K> st{tiles::query_operand(f, r.q, r.rows, p.q.stride(-2), sc.qg), nullptr};  // [rows, Dk]
  if constexpr (std::is_same_v<typename K::S, float>) {
    if (f.k8) {
      int8::quantize_query(r.q, r.rows, p.q.stride(-2), *f.k8, r.b, sc.q8);
      st.q8 = &sc.q8;
    }
  }
  std::fill(sc.m.begin(), sc.m.begin() + r.rows, kNegInf<T>);
  std::fill(sc.l.begin(), sc.l.begin() + r.rows, T(0));
  std::fill(r.o, r.o + r.rows * p.dv, T(0));
  return st;
}

// One online-softmax step of rows r over keys [j0, j0 + cols) (none where no key of them is allowed).
template <class K>
void key_tile(const Flash<K>& f, const Rows<K>& r, const RowStart<K>& st, Scratch<K>& sc, int64_t j0, int64_t cols) {
  using T = typename K::T;
  if (empty_tile(f, r, j0, cols)) return;  // no key of the tile is allowed: nothing to add
  const int64_t lds = f.tiles.bc;
  score_tile(f, r, st.q, j0, cols, sc.s.data(), lds, sc.kg, kNegInf<T>, static_cast<T*>(nullptr), st.q8);
  softmax_tile(sc.s.data(), lds, r.rows, cols, sc.m.data(), sc.l.data(), r.o, f.p->dv);
  if (f.dropout_p > 0.0) dropout_tile(f, r, j0, cols, sc.s.data(), lds);
  value_tile(f, r, j0, cols, sc.s.data(), lds, sc);
}

// The key walk that key parts cut: tile t of walk_tiles ends at hi - t Bc, backwards from the
// range's end. Plain (no mask modifier listing the tiles): [0, kv_end), so that only the tile at
// the first keys may be partial (with causal masking, a multiple of Br wide) and the masked part
// of the diagonal stays within the last Br columns; under mask modifiers, or on packed keys
// (Rows::kp: whole panels) without causal masking, the tiles start at multiples of Bc instead.
// A window alone (ModPlan::interval): the rows' one run of keys [lo, hi).
template <class K>
std::pair<int64_t, int64_t> walk_range(const Flash<K>& f, const Rows<K>& r) {
  if (f.mods.interval) return {f.mods.key_lo(r.i0), std::min(f.mods.key_hi(r.i0 + r.rows - 1), r.kv_end)};
  const bool aligned = (f.mods.masking || (r.kp && !f.causal)) && r.kv_end > 0;
  return {0, aligned ? (r.kv_end - 1) / f.tiles.bc * f.tiles.bc + f.tiles.bc : r.kv_end};
}

template <class K>
int64_t walk_tiles(const Flash<K>& f, const Rows<K>& r) {
  const auto [lo, hi] = walk_range(f, r);
  return hi > lo ? (hi - lo + f.tiles.bc - 1) / f.tiles.bc : 0;
}

// Tiles [t0, t1) of the walk.
template <class K>
void walk(const Flash<K>& f, const Rows<K>& r, const RowStart<K>& st, Scratch<K>& sc, int64_t t0, int64_t t1) {
  const auto [lo, end] = walk_range(f, r);
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t hi = end - t * f.tiles.bc;
    if (f.mods.interval) {
      // Widths a multiple of 16, reaching back before the run (keys every row masks): oneDNN
      // ran a window of 512's 575-key tiles 10% slower than 576 (127 vs 115 ms, L = 16384).
      const int64_t cols = std::min(f.tiles.bc, (hi - std::max(lo, hi - f.tiles.bc) + 15) / 16 * 16);
      const int64_t j0 = std::max<int64_t>(0, hi - cols);
      key_tile(f, r, st, sc, j0, hi - j0);
    } else {
      const int64_t j0 = std::max<int64_t>(0, hi - f.tiles.bc);
      key_tile(f, r, st, sc, j0, std::min(hi, r.kv_end) - j0);
    }
  }
}

template <class K>
void run_rows(const Flash<K>& f, const Rows<K>& r, Scratch<K>& sc) {
  const RowStart<K> st = start_rows(f, r, sc);
  auto tile = [&](int64_t j0, int64_t cols) { key_tile(f, r, st, sc, j0, cols); };
  // Under mask modifiers: the tiles the mask may leave keys in (aligned at multiples of Bc).
  thread_local std::vector<int64_t> candidates;
  if (f.mods.interval) {  // the rows' keys are one run [lo, hi): its tiles, backwards from hi
    walk(f, r, st, sc, 0, walk_tiles(f, r));
  } else if (const int64_t width = gather_keys(f); width > 0) {
    if (!f.mods.candidate_tiles(r.i0, r.i0 + r.rows, f.tiles.bc, candidates)) {  // every tile (a global query)
      candidates.clear();
      for (int64_t j0 = 0; j0 < r.kv_end; j0 += f.tiles.bc) candidates.push_back(j0);
    }
    if constexpr (!K::kWiden) gathered_tiles(f, r, st.q, candidates, width, sc);  // K and V as the GEMM reads them
  } else if (f.mods.masking && f.mods.candidate_tiles(r.i0, r.i0 + r.rows, f.tiles.bc, candidates)) {
    for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
      if (*it < r.kv_end) tile(*it, std::min(f.tiles.bc, r.kv_end - *it));
    }
  } else {
    walk(f, r, st, sc, 0, walk_tiles(f, r));
  }
  finish_rows(f, r, sc.m.data(), sc.l.data());
  if (f.weights) weight_rows(f, r, st.q, sc, st.q8);
}

// The order in which items are handed out (empty: as numbered). In each batch entry, row
// tiles holding a global query (every key: BigBird's first and last blocks, 37x an interior
// row tile's work at L = 16384) go first: the call's last item was one, run by one worker
// alone, when they came last. Per entry rather than all of them first: the global rows
// read all of the entry's K panels and V rows, and its interior row tiles then find them
// in the L3 (BigBird, L = 4096, 2 threads, paired rounds: 27.3-27.4 ms against 27.8-27.9
// with every entry's global rows first).
template <class K>
std::vector<int64_t> item_order(const Flash<K>& f, int64_t items) {
  const std::vector<int64_t>& global = f.mods.global_q_sorted;
  std::vector<int64_t> order;
  if (f.causal || global.empty()) return order;
  const int64_t br = f.tiles.br, tiles_q = (f.p->lq + br - 1) / br;
  order.resize(static_cast<size_t>(items));
  std::iota(order.begin(), order.end(), int64_t{0});
  for (auto first = order.begin(); first != order.end(); first += tiles_q) {  // items of one entry
    std::stable_partition(first, first + tiles_q, [&](int64_t item) {
      const int64_t i0 = item % tiles_q * br;
      const auto it = std::lower_bound(global.begin(), global.end(), i0);
      return it != global.end() && *it < i0 + br;
    });
  }
  return order;
}

// 16-bit K and V without a native GEMM (K::kWiden: bf16 on AVX2, f16 without AVX512-FP16) are
// widened to float once per worker and entry where they fit AttentionTuning::widen_head_bytes
// (automatic: kWidenHeadBytes), not once per query tile and key tile: the per-tile widening
// was 5% of a bf16 call's samples at (4, 8, 1024, 64) under ONEDNN_MAX_CPU_ISA=AVX2; 2-4%
// faster (docs/performance-precision.md). Larger heads keep per-tile widening, so that no call converts
// K and V whole.
constexpr int64_t kWidenHeadBytes = int64_t{8} << 20;

// Whether widen_head widens the entries' whole K and V (else per tile).
template <class K>
bool widens_heads(const Problem& p, int64_t budget) {
  if constexpr (!K::kWiden) return false;
  return p.lk * (p.dk + p.dv) * static_cast<int64_t>(sizeof(typename K::G)) <= budget;
}

template <class K>
void widen_head(const Flash<K>& f, Rows<K>& r, Scratch<K>& sc, int64_t budget) {
  const Problem& p = *f.p;
  if (!widens_heads<K>(p, budget)) return;
  if (sc.widened != std::pair<const void*, const void*>{r.k, r.v}) {
    sc.kw.resize(static_cast<size_t>(p.lk * p.dk)), sc.vw.resize(static_cast<size_t>(p.lk * p.dv));
    kernels::convert_rows(r.k, p.lk, p.dk, p.k.stride(-2), sc.kw.data(), p.dk);
    kernels::convert_rows(r.v, p.lk, p.dv, p.v.stride(-2), sc.vw.data(), p.dv);
    sc.widened = {r.k, r.v};
  }
  r.kw = sc.kw.data(), r.vw = sc.vw.data();
}

// Hands out a call's items (entry-major: tiles_q row tiles of each batch entry) to the
// workers. Shared: one counter, items in turn. By entry: a worker claims a whole entry and
// takes its row tiles one after the other, so that what it prepares once per entry (16-bit K
// and V widened, widen_head) serves every tile of it, where items in turn had both workers
// widen every head (bf16 at (1, 8, 512, 64) under ONEDNN_MAX_CPU_ISA=AVX2: docs/performance-precision.md);
// once no entry is unclaimed it takes the tiles others have not reached, so that the call
// ends as balanced as with the shared counter.
class ItemQueue {
 public:
  ItemQueue(int64_t entries, int64_t tiles_q, bool by_entry)
      : entries_(entries), tiles_q_(tiles_q), by_entry_(by_entry), tile_(by_entry ? entries : 0) {}

  // The next item for a worker whose current entry is `mine` (-1 at first), or -1 at the end.
  int64_t next(int64_t& mine) {
    if (!by_entry_) {
      const int64_t item = item_++;
      return item < entries_ * tiles_q_ ? item : -1;
    }
    for (;;) {
      if (mine >= 0) {
        const int64_t t = tile_[static_cast<size_t>(mine)]++;
        if (t < tiles_q_) return mine * tiles_q_ + t;
      }
      const int64_t e = entry_++;
      if (e >= entries_) break;
      mine = e;
    }
    for (int64_t e = 0; e < entries_; ++e) {  // every entry claimed: help where tiles are left
      if (tile_[static_cast<size_t>(e)].load() >= tiles_q_) continue;
      const int64_t t = tile_[static_cast<size_t>(e)]++;
      if (t < tiles_q_) return (mine = e) * tiles_q_ + t;
    }
    return -1;
  }

 private:
  const int64_t entries_, tiles_q_;
  const bool by_entry_;
  std::atomic<int64_t> item_{0}, entry_{0};
  std::vector<std::atomic<int64_t>> tile_;  // [entries]: the next row tile of each entry
};

// Item `item` (numbered as rows_of takes them) on the call's packed keys, if any.
template <class K>
Rows<K> item_rows(const Flash<K>& f, const tiles::KeyPanels* panels, int64_t item) {
  Rows<K> r = rows_of(f, item);
  if constexpr (std::is_same_v<typename K::G, float>) r.kp = panels ? panels->of(r.k - f.k) : nullptr;
  if (f.chunk > 0) r.kp_chunk = gemm_panels_size(f.chunk, f.p->lk);  // pack_keys' chunked panels
  return r;
}

// P, the key parts of each item (key_tile_parts; flash_tiles.h). 1 under mask
// modifiers that list the tiles (block masks' candidate tiles, gathered in groups), whose walks
// the parts would have to cut as well (a window alone is one run of keys: walk, cut), and where
// the weights are returned: their second pass recomputes every score of the item's rows and
// normalises whole rows, so an item stays whole there.
// The workers are those that really run the call: one inside a parallel region (a caller's
// parallel_for or OpenMP region runs nested work inline), whatever set_num_threads says.
template <class K>
int64_t key_parts(const Flash<K>& f, const tiles::KeyPanels* panels, int64_t items) {
  const int64_t workers = detail::in_parallel_region() ? 1 : get_num_threads();
  if ((f.mods.masking && !f.mods.interval) || f.weights || items >= 4 * workers) return 1;
  int64_t longest = 0;  // key tiles of the longest item
  for (int64_t item = 0; item < items; ++item) longest = std::max(longest, walk_tiles(f, item_rows(f, panels, item)));
  return key_tile_parts(items, workers, longest);
}

// Key part `u` of the call's split items: its tiles of the item's walk into its partial.
template <class K, class T = typename K::T>
void run_part(const Flash<K>& f, Rows<K> r, Scratch<K>& sc, tiles::Partials<T>& pa, size_t u) {
  const tiles::KeyPart& part = pa.units[u];
  r.o = pa.o_of(u);
  const RowStart<K> st = start_rows(f, r, sc);
  const int64_t tiles = walk_tiles(f, r);
  walk(f, r, st, sc, part.first(tiles), part.last(tiles));
  std::copy_n(sc.m.begin(), r.rows, pa.m_of(u));
  std::copy_n(sc.l.begin(), r.rows, pa.l_of(u));
}

// Item `item` of the call's split items from its parts' partials (merged in part order, so
// the bits do not depend on which worker ran which part or merges), its rows finished as
// unsplit ones (finish_rows: fully masked and NaN rows alike) and rounded into a 16-bit output.
template <class K, class T = typename K::T>
void merge_rows(const Flash<K>& f, tiles::Partials<T>& pa, int64_t item, Scratch<K>& sc, typename K::S* narrow_out) {
  const Problem& p = *f.p;
  Rows<K> r = rows_of(f, item);
  if (narrow_out) r.o = sc.o.data();  // [rows, Dv], then rounded into the output
  tiles::merge_item(pa, item, r.rows, r.o, sc.m.data(), sc.l.data());
  finish_rows(f, r, sc.m.data(), sc.l.data());
  if constexpr (!std::is_same_v<typename K::S, T>) {
    if (narrow_out) kernels::convert_rows(r.o, r.rows, p.dv, p.dv, narrow_out + (r.b * p.lq + r.i0) * p.dv, p.dv);
  }
}

// Every item cut into key parts (split-KV, attention_cpu_split.h): the parts go to
// get_num_threads() workers from one counter (an item's parts in order, items as run_all
// numbers them: causal, longest first), and the worker that ends an item's last part merges
// it (merge_rows): one parallel region, no wait between parts and merges. Whole K and V are
// not widened per worker (widen_head): a worker reads a part of them. Not streamed: too few
// items to outgrow the workers' L2.
template <class K>
void run_split(const Flash<K>& f, const tiles::KeyPanels* panels, typename K::S* narrow_out, int64_t items,
               int64_t parts) {
  using T = typename K::T;
  const Problem& p = *f.p;
  auto tiles_of = [&](int64_t item) { return walk_tiles(f, item_rows(f, panels, item)); };
  tiles::Partials<T> pa = tiles::make_partials<T>(items, parts, f.tiles.br, p.dv, tiles_of);
  const auto units = static_cast<int64_t>(pa.units.size());
  forward_key_parts_run() += units;
  std::vector<std::atomic<int64_t>> left(static_cast<size_t>(items));  // [items]: parts not yet run
  for (int64_t i = 0; i < items; ++i) left[static_cast<size_t>(i)] = pa.first[i + 1] - pa.first[i];
  std::atomic<int64_t> next{0}, done{0};
  parallel_for(0, std::min<int64_t>(get_num_threads(), units), 1, [&](int64_t, int64_t) {
    Scratch<K> sc(f.tiles, p.dk, p.dv, f.k8 != nullptr, 0, panels != nullptr, narrow_out != nullptr, f.chunk > 0);
    for (int64_t u = next++; u < units && !interrupt_requested(); u = next++, ++done) {
      const int64_t item = pa.units[static_cast<size_t>(u)].item;
      run_part(f, item_rows(f, panels, item), sc, pa, static_cast<size_t>(u));
      if (left[static_cast<size_t>(item)].fetch_sub(1, std::memory_order_acq_rel) == 1) {
        merge_rows(f, pa, item, sc, narrow_out);  // the item's last part: every partial is written
      }
    }
  });
  // Parts left undone without an error: an interrupt that was cleared before parallel_for's check.
  if (done.load() < units) fail<Interrupted>(p.op, ": interrupted");
}

// Every item, on get_num_threads() workers taking items from an ItemQueue.
//
// An output larger than the workers' L2 is accumulated item by item in the scratch and
// stored once with streamed stores: accumulated in place, each item's output rows were
// first read from memory only to be overwritten (their zeroing was 3% of BigBird's samples
// at L = 4096, 0.4% of full attention's: the same 0.7 ms a call). BigBird, L = 4096, 2
// threads, paired rounds: 29.5-29.6 ms against 30.5-30.9 in slower rounds, within 1% in
// faster ones.
template <class K>
void run_all(const Flash<K>& f, const tiles::KeyPanels* panels, int64_t widen_head_bytes, typename K::S* narrow_out) {
  using T = typename K::T;
  const Problem& p = *f.p;
  const int64_t widen_budget = widen_head_bytes < 0 ? kWidenHeadBytes : widen_head_bytes;
  const int64_t tiles_q = (p.lq + f.tiles.br - 1) / f.tiles.br;
  const int64_t items = p.batch_size * tiles_q;
  if (items == 0) return;
  if (const int64_t parts = key_parts(f, panels, items); parts > 1)
    return run_split(f, panels, narrow_out, items, parts);
  const int64_t workers = std::min<int64_t>(get_num_threads(), items);
  ItemQueue queue(p.batch_size, tiles_q, widens_heads<K>(p, widen_budget) && p.batch_size >= workers);
  const std::vector<int64_t> order = item_order(f, items);
  const int64_t out_bytes = p.batch_size * p.lq * p.dv * static_cast<int64_t>(sizeof(T));
  const bool stream = narrow_out == nullptr && out_bytes > workers * l2_cache_bytes();
  parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    Scratch<K> sc(f.tiles, p.dk, p.dv, f.k8 != nullptr, gather_keys(f), panels != nullptr, stream || narrow_out,
                  f.chunk > 0);
    int64_t entry = -1;
    for (int64_t item = queue.next(entry); item >= 0 && !interrupt_requested(); item = queue.next(entry)) {
      Rows<K> r = item_rows(f, panels, order.empty() ? item : order[static_cast<size_t>(item)]);
      if constexpr (K::kWiden) widen_head(f, r, sc, widen_budget);
      T* const out = r.o;  // [rows, Dv], dense (null where narrow_out)
      if (stream || narrow_out) r.o = sc.o.data();
      run_rows(f, r, sc);
      if constexpr (!std::is_same_v<typename K::S, T>) {
        if (narrow_out) kernels::convert_rows(r.o, r.rows, p.dv, p.dv, narrow_out + (r.b * p.lq + r.i0) * p.dv, p.dv);
      }
      if (stream) {
        kernels::detail::stream_copy(out, r.o, r.rows * p.dv * static_cast<int64_t>(sizeof(T)));
      }
    }
    if (stream) kernels::detail::stream_fence();  // before the caller reads the output
  });
}

// The call over a problem whose q, k, v are S and floating mask T (flash_attention_cpu).
template <class K>
AttentionResult run_flash(const Problem& p, const AttentionOptions& options) {
  using T = typename K::T;
  const DType dt = dtype_of<T>::value;  // of the output accumulator, lse and weights
  // Pooled, huge-page advised (tensor/buffer_pool.h): a fresh 32 MB output (L = 16384, H = 8,
  // D = 64) page-faulted 8192 times per call, 6% of a sliding window's time there.
  // 16-bit inputs: each item's rows are rounded into the 16-bit output as they finish (run_all),
  // where a float32 output was converted whole after the call (2% of a bf16 call's samples at
  // (1, 8, 512, 64), and a float32 copy of the output in memory).
  constexpr bool kNarrowOut = !std::is_same_v<typename K::S, T>;
  Tensor out = kernels::empty_pooled(with_tail(p.batch, {p.lq, p.dv}),
                                     kNarrowOut ? dtype_of<typename K::S>::value : dt);  // [batch..., Lq, Dv]
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
  f.out = kNarrowOut ? nullptr : out.data<T>();
  f.lse = lse ? lse->data<T>() : nullptr;
  f.weights = weights ? weights->data<T>() : nullptr;
  std::optional<int8::QuantizedKeys> k8;  // K smoothed and quantized once per call (attention_int8.h)
  if constexpr (std::is_same_v<typename K::S, float>) {
    if (options.qk_quantization != QKQuantization::none) {
      k8 = int8::quantize_keys(p, options.qk_quantization == QKQuantization::int8);
      f.k8 = &*k8;
    }
  }
  // Q K^T in Dk chunks (tiles::score_chunk) but on the gathered tiles and int8 Q K^T (one product).
  if (gather_keys(f) > 0 || f.k8) f.chunk = 0;
  const std::optional<tiles::KeyPanels> panels = tiles::pack_keys(f, gather_keys(f) > 0);
  run_all(f, panels ? &*panels : nullptr, options.tuning.widen_head_bytes,
          kNarrowOut ? out.data<typename K::S>() : nullptr);

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
