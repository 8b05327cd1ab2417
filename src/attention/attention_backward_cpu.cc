// Fused CPU attention backward: FlashAttention-2's backward (Dao 2023, Alg. 2).
//
// From q, k, v, the forward's output O, its row logsumexp L and dO, per flat batch
// entry (batch dims and heads are one flat batch):
//   D_i = dO_i . O_i                                   [Lq]
// and for every key tile j (Bc keys) and query tile i (Br rows) it meets:
//   S = scale Q_i K_j^T + bias      (tiles::score_tile, the forward's own scores: float32
//                                    over Dk > 128 in the forward's Dk chunks, score_chunk)
//   P = exp(S - L_i)                (the forward's softmax, from its saved L)
//   dP = (dO_i V_j^T) o M           (M: the forward's dropout factors, tiles::dropout_tile)
//   dV_j += (P o M)^T dO_i
//   dS = P o (dP - D_i)
//   dK_j += scale dS^T Q_i,   dQ_i += scale dS K_j
// The [Lq, Lk] scores never exist: a worker holds [Br, Bc] tiles. Causal masking
// skips the query tiles wholly above the diagonal of a key tile and narrows a tile on the
// diagonal to the keys its rows see; masks and GQA k/v
// are read in place through their (zero) strides.
//
// Threads: a work item is one part of a batch entry: the entry's key tiles dealt round
// robin to its P parts (part s takes key tiles s, s + P, ...; near-equal work under
// causal masking too). P is 1 where the entries alone keep the workers busy (key_tile_parts).
// An item's worker accumulates its dQ, and the dK and dV of its key tiles, in its own
// buffers (so no element is written by two threads while the tiles run) and adds them,
// under one lock, to the gradients once per item: entries that share a k/v head (GQA) or
// a broadcast operand sum there, as autograd sums. The parts of an entry add their dQ in
// part order (a part waits for the one before it), so a result does not depend on which
// worker finished first. The lock is taken once per item, not per tile. Items go to
// get_num_threads() workers (one inside a parallel region: P = 1 there) from an atomic
// counter; a call with a single item lets the tile GEMMs use the threads. The wait for a
// turn cannot deadlock however few workers run (an OpenMP team smaller than asked, a
// nested call run inline): items are claimed in counter order, entry-major, so the part
// before was claimed earlier by a worker that is running it and waits only on parts
// claimed before it (the first part of an entry waits on none).
#include "attention/attention_backward_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <mutex>
#include <numeric>
#include <thread>
#include <type_traits>
#include <vector>

#include "attention/attention_cpu_tiles.h"
#include "kernels/cpu/aligned_vector.h"
#include "kernels/cpu/parallel_internal.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "qkv/softmax.h"

namespace qkv::attention {

namespace {

using tiles::as_kernel_mask;
using tiles::dropout_tile;
using tiles::empty_tile;
using tiles::Flash;
using tiles::kNegInf;
using tiles::Mat;
using tiles::Rows;
using tiles::score_tile;

template <class T>
using Same = tiles::Types<T, T, T>;  // the backward computes in T on T operands

// Read-only state of one call besides the forward's (Flash), and the gradients.
template <class T>
struct Backward {
  const Flash<Same<T>>* f = nullptr;
  const T* out = nullptr;   // [batch, Lq, Dv] contiguous
  const T* dout = nullptr;  // [batch, Lq, Dv] contiguous
  const T* lse = nullptr;   // [batch, Lq]
  T* dq = nullptr;          // laid out as q (contiguous, the user's shape)
  T* dk = nullptr;          // as k
  T* dv = nullptr;          // as v
  // Every entry owns its rows of dq, dk and dv (no broadcast entry, no GQA group): the
  // first contribution writes them, so they need no zeros first; else entries add in turn.
  bool own = false;
  std::mutex* add = nullptr;
  std::vector<std::atomic<int64_t>>* turn{};  // [batch] (P > 1): the next part to add its dQ
  std::atomic<bool>* stop{};                  // a worker left with an item not added (its error, an interrupt)
};

// Part s of P of an entry: its key tiles are s, s + P, s + 2P, ... Their dK and dV rows
// lie densely in the worker's buffers, tile after tile (local_row).
struct Part {
  int64_t s = 0, n = 1;
  int64_t local_row(int64_t tile, int64_t bc) const { return tile / n * bc; }
};

// A worker's buffers, reused across its entries.
template <class T>
struct Scratch {
  // Cache-line aligned (kernels::AlignedVector): the tile products' operands and results.
  kernels::AlignedVector<T> s;           // [Br, Bc] scores, then P
  kernels::AlignedVector<T> w;           // [Br, Bc] P o M (dropout only)
  kernels::AlignedVector<T> ds;          // [Br, Bc] dP, then dS
  kernels::AlignedVector<T> d;           // [Lq] D_i
  kernels::AlignedVector<T> dq, dk, dv;  // [Lq, Dk] of the entry, [Lp, Dk] and [Lp, Dv] of its part's key tiles
  kernels::AlignedVector<T> qc, kc;      // [Br, Dk] Q_i and [Bc, Dk] K_j chunk-major (Flash::chunk) or empty
  kernels::AlignedVector<T> cap;         // [Br, Bc] softcap's derivative (mods.softcap only)
  kernels::AlignedVector<T> kp, vp;      // K_j and V_j packed in gemm panels (packed_tiles) or empty
  Scratch(const FlashTiles& t, const Problem& p, int64_t parts, bool dropout, bool softcap, bool packed, int64_t chunk)
      : s(n(t.br * t.bc)),
        w(n(dropout ? t.br * t.bc : 0)),
        ds(n(t.br * t.bc)),
        d(n(p.lq)),
        dq(n(p.lq * p.dk)),
        dk(n(part_rows(t, p, parts) * p.dk)),
        dv(n(part_rows(t, p, parts) * p.dv)),
        qc(n(chunk > 0 ? t.br * p.dk : 0)),
        kc(n(chunk > 0 ? t.bc * p.dk : 0)),
        cap(n(softcap ? t.br * t.bc : 0)),
        kp(n(packed ? tiles::key_panels_size(p.dk, t.bc, chunk) : 0)),
        vp(n(packed ? gemm_panels_size(p.dv, t.bc) : 0)) {}
  static size_t n(int64_t x) { return static_cast<size_t>(x); }
  // Lp: the key rows of a part, its ceil(tiles / P) key tiles (all Lk keys where P = 1).
  static int64_t part_rows(const FlashTiles& t, const Problem& p, int64_t parts) {
    if (parts == 1) return p.lk;
    return (p.lk + t.bc * parts - 1) / (t.bc * parts) * t.bc;
  }
};

// C [m, n] (ldc) += alpha op(A) op(B): the five tile products below.
template <class T>
void gemm_acc(bool ta, bool tb, int64_t m, int64_t n, int64_t k, T alpha, const T* a, int64_t lda, const T* b,
              int64_t ldb, T* c, int64_t ldc, T beta = T(1)) {
  GemmShape g;
  g.trans_a = ta;
  g.trans_b = tb;
  g.m = m, g.n = n, g.k = k;
  g.lda = lda, g.ldb = ldb, g.ldc = ldc;
  gemm(g, alpha, a, b, beta, c);
}

// One (query tile, key tile) pair of entry r.b: adds its terms to the entry's dQ, dK, dV.
// The pair's keys j0 .. j0 + cols (a causal tile's keys up to its last row's: run_item);
// its [rows, cols] scratch tiles are dense (row stride cols), so that a narrowed causal
// tile's S and dP still read K_j and V_j packed where cols is whole panels.
template <class T>
void tile_pair(const Backward<T>& bw, const Rows<Same<T>>& r, int64_t j0, int64_t cols, int64_t local0,
               Scratch<T>& sc) {
  const Flash<Same<T>>& f = *bw.f;
  const Problem& p = *f.p;
  const int64_t lds = cols, qs = p.q.stride(-2), ks = p.k.stride(-2), vs = p.v.stride(-2);
  const T scale = static_cast<T>(p.scale);
  const T* lse = bw.lse + r.b * p.lq + r.i0;             // [rows]
  const T* dout = bw.dout + (r.b * p.lq + r.i0) * p.dv;  // dO_i [rows, Dv]
  T* s = sc.s.data();                                    // [rows, cols]
  T* ds = sc.ds.data();                                  // [rows, cols]
  // Forward (attention_cpu.cc score_tile): S = cap(scale Q_i K_j^T) + bias.
  T* cap = sc.cap.empty() ? nullptr : sc.cap.data();  // d cap / d (scale Q K^T)
  // Q_i chunk-major where Q K^T is summed over Dk chunks (the forward's start_rows).
  score_tile(f, r, tiles::query_operand(f, r.q, r.rows, qs, sc.qc), j0, cols, s, lds, sc.kc, kNegInf<T>, cap);
  // Forward softmax_tile/finish_rows: P = exp(S - m) / l = exp(S - L); a row with L = -inf
  // had every key masked: weight 0, no gradient.
  for (int64_t x = 0; x < r.rows; ++x) {
    if (lse[x] == kNegInf<T>) {
      std::fill(s + x * lds, s + x * lds + cols, T(0));
    } else {
      (void)kernels::exp_shift_sum_fast(s + x * lds, cols, lse[x]);
    }
  }
  // Forward value_tile: O_i += (P o M) V_j. d/d(P o M): dO_i V_j^T (on V_j packed: sc.vp).
  // V_j is packed with K_j (run_item): its first cols / 64 panels where K_j's are read.
  const bool panels = tiles::reads_panels(r, j0, cols, lds);
  if constexpr (std::is_same_v<T, float>) {
    if (panels) gemm_panels({false, false, r.rows, cols, p.dv, p.dv, 0, lds}, 1.0f, dout, sc.vp.data(), 0, ds);
  }
  if (!panels) gemm_acc<T>(false, true, r.rows, cols, p.dv, T(1), dout, p.dv, r.v + j0 * vs, vs, ds, lds, T(0));
  const T* w = s;           // P o M
  if (f.dropout_p > 0.0) {  // forward dropout_tile: the same factors M, redrawn from the seed
    std::copy(s, s + r.rows * lds, sc.w.data());
    dropout_tile(f, r, j0, cols, sc.w.data(), lds, ds);  // and dP = (dO_i V_j^T) o M: one draw for both
    w = sc.w.data();
  }
  // Forward value_tile, d/dV_j: dV_j += (P o M)^T dO_i (dV_j at the part's local row local0).
  gemm_acc<T>(true, false, cols, p.dv, r.rows, T(1), w, lds, dout, p.dv, sc.dv.data() + local0 * p.dv, p.dv);
  // Softmax: dS = P o (dP - D_i), D_i = sum_j P_ij dP_ij = dO_i . O_i.
  // On Highway, one call per tile, where the plain loop compiled to 4-wide SSE (the baseline
  // ISA): 1 thread pinned, Zen 4, four alternated pairs each, best backward 14.66 ms against
  // 14.99 at (1, 8, 512, 64), 450.5 against 458.5 at (1, 2, 4096, 128); pairs within +-5% noise.
  kernels::softmax_backward_rows(s, ds, r.rows, cols, lds, sc.d.data() + r.i0);  // ds = P o (ds - D_i)
  for (int64_t x = 0; cap && x < r.rows; ++x) {  // forward score_mods' softcap: d/ds c tanh(s / c) = 1 - tanh^2
    for (int64_t c = 0; c < cols; ++c) ds[x * lds + c] *= cap[x * lds + c];
  }
  // Forward score_tile, S = scale Q_i K_j^T: dK_j += scale dS^T Q_i, dQ_i += scale dS K_j.
  gemm_acc<T>(true, false, cols, p.dk, r.rows, scale, ds, lds, r.q, qs, sc.dk.data() + local0 * p.dk, p.dk);
  gemm_acc<T>(false, false, r.rows, p.dk, cols, scale, ds, lds, r.k + j0 * ks, ks, sc.dq.data() + r.i0 * p.dk, p.dk);
}

// dst[rows, n] += src, or = src where `write` (dense rows; dst rows `ld` apart).
template <class T>
void add_rows(T* dst, int64_t ld, const T* src, int64_t rows, int64_t n, bool write) {
  for (int64_t x = 0; x < rows; ++x) {
    if (write) {
      std::copy_n(src + x * n, n, dst + x * ld);
    } else {
      kernels::add_row(dst + x * ld, src + x * n, n);
    }
  }
}

// Waits until the parts of entry b before part s have added their dQ; false where the
// call was interrupted or a worker left an item undone (stop): the part before may then
// never run, and the call ends with an error.
inline bool wait_turn(const std::atomic<int64_t>& turn, int64_t s, const std::atomic<bool>& stop) {
  while (turn.load(std::memory_order_acquire) != s) {
    if (interrupt_requested() || stop.load(std::memory_order_acquire)) return false;
    std::this_thread::yield();  // the part before is running: its worker needs the core more
  }
  return true;
}

// Adds an item's dQ (the whole entry's rows), and the dK, dV rows of its key tiles, to
// the call's gradients. Operands are contiguous in the user's shapes, so the entry's rows
// are dense at its batch offset (zero strides make GQA groups and broadcast entries meet).
template <class T>
void add_item(const Backward<T>& bw, int64_t b, const Part& part, Scratch<T>& sc) {
  const Problem& p = *bw.f->p;
  const int64_t bc = bw.f->tiles.bc;
  if (part.n > 1 && !wait_turn((*bw.turn)[static_cast<size_t>(b)], part.s, *bw.stop)) return;
  std::unique_lock<std::mutex> lock(*bw.add, std::defer_lock);
  if (!bw.own) lock.lock();  // entries that meet in the same rows add one at a time
  // dQ: part 0 writes the entry's rows, the later parts add in turn; dK, dV: each part's key tiles are its own.
  add_rows(bw.dq + batch_offset(p.q, p.batch, b, 1), p.dk, sc.dq.data(), p.lq, p.dk, bw.own && part.s == 0);
  T* const dk = bw.dk + batch_offset(p.k, p.batch, b, p.gqa_group);
  T* const dv = bw.dv + batch_offset(p.v, p.batch, b, p.gqa_group);
  for (int64_t j0 = part.s * bc; j0 < p.lk; j0 += part.n * bc) {
    const int64_t cols = std::min(bc, p.lk - j0), local = part.local_row(j0 / bc, bc);
    add_rows(dk + j0 * p.dk, p.dk, sc.dk.data() + local * p.dk, cols, p.dk, bw.own);
    add_rows(dv + j0 * p.dv, p.dv, sc.dv.data() + local * p.dv, cols, p.dv, bw.own);
  }
  if (part.n > 1) (*bw.turn)[static_cast<size_t>(b)].store(part.s + 1, std::memory_order_release);
}

// Every tile pair of part `part` of batch entry b (its key tiles, the query tiles each
// meets), then its gradients added to the call's.
template <class T>
void run_item(const Backward<T>& bw, int64_t b, const Part& part, Scratch<T>& sc) {
  const Flash<Same<T>>& f = *bw.f;
  const Problem& p = *f.p;
  const T* o = bw.out + b * p.lq * p.dv;
  const T* dout = bw.dout + b * p.lq * p.dv;
  for (int64_t i = 0; i < p.lq; ++i) {  // D_i = dO_i . O_i
    T acc = 0;
    for (int64_t c = 0; c < p.dv; ++c) acc += dout[i * p.dv + c] * o[i * p.dv + c];
    sc.d[static_cast<size_t>(i)] = acc;
  }
  std::fill(sc.dq.begin(), sc.dq.end(), T(0));
  std::fill(sc.dk.begin(), sc.dk.end(), T(0));
  std::fill(sc.dv.begin(), sc.dv.end(), T(0));
  Rows<Same<T>> r;
  r.b = b;
  const int64_t q_base = batch_offset(p.q, p.batch, b, 1);
  r.k = f.k + batch_offset(p.k, p.batch, b, p.gqa_group);
  r.v = f.v + batch_offset(p.v, p.batch, b, p.gqa_group);
  r.mask_base = p.mask ? batch_offset(*p.mask, p.batch, b, 1) : 0;
  const int64_t bc = f.tiles.bc;
  for (int64_t j0 = part.s * bc; j0 < p.lk && !interrupt_requested(); j0 += part.n * bc) {
    const int64_t cols = std::min(bc, p.lk - j0), local0 = part.local_row(j0 / bc, bc);
    // Causal: query rows i < j0 see none of these keys; tiles wholly before j0 are skipped.
    const int64_t first = f.causal ? j0 / f.tiles.br * f.tiles.br : 0;
    if constexpr (std::is_same_v<T, float>) {
      // K_j and V_j packed once for the query tiles' S and dP (packed_tiles); whole tiles
      // only, as product_tile reads panels only for tiles that fill the score rows.
      r.kp = nullptr;
      if (!sc.kp.empty() && cols == bc && cols % 64 == 0) {
        // per Dk chunk where Q K^T is chunked, as the forward's pack_keys
        tiles::pack_key_panels(r.k + j0 * p.k.stride(-2), cols, p.dk, p.k.stride(-2), f.chunk, sc.kp.data());
        gemm_pack_panels(true, p.dv, cols, r.v + j0 * p.v.stride(-2), p.v.stride(-2), sc.vp.data());
        r.kp = sc.kp.data(), r.kp_from = j0, r.kp_chunk = f.chunk > 0 ? gemm_panels_size(f.chunk, cols) : 0;
      }
    }
    for (r.i0 = first; r.i0 < p.lq; r.i0 += f.tiles.br) {
      r.rows = std::min(f.tiles.br, p.lq - r.i0);
      r.q = f.q + q_base + r.i0 * p.q.stride(-2);
      if (empty_tile(f, r, j0, cols)) continue;  // the forward skipped it: no gradient
      // Causal: the tile's rows see keys up to i0 + rows - 1; the keys after have P = 0 and
      // add nothing, so the pair takes only the keys before (a 128-row tile at the start of a
      // 512-key tile: its first 128). The masked triangle computed per key tile is then
      // Br x Br / 2 whatever Bc is (backward_tiles).
      const int64_t seen = f.causal ? std::min(cols, r.i0 + r.rows - j0) : cols;
      if (seen > 0) tile_pair(bw, r, j0, seen, local0, sc);
    }
  }
  add_item(bw, b, part, sc);
}

// The tiles of the backward: the call's own (options.tuning), else QKV_FLASH_TILES,
// else 256 x 512, causal 128 x 512. Five products per tile pair make small tiles pay
// oneDNN's per-call cost five times. Measured with BM_FlashBackward before K/V were packed
// (2 threads, AMD EPYC Zen 4, D = 64, GFLOP/s): 64x128 100-104 at (4, 8, 1024, 64), 128x128
// 123-132, 256x128 138-140, 256x256 136-153, 512x256 145-153, 256x512 108-115, 512x512 118-136.
// With K_j and V_j packed once per key tile (packed_tiles) 256 x 512 took the lead
// (2026-11-27, `qkv bench attention --backward`, QKV_FLASH_TILES alternated, backward ms):
// 1 thread pinned, (1, 1, 16384, 128) 3395-3419 against 3538-3548 for 256 x 256 (-4%),
// (1, 1, 8192, 128) 830-845 / 868-897 (128 x 512: 864-883), (1, 2, 2048, 128) 105.1-105.2 /
// 107.8-110.0, (1, 1, 16384, 64) 1763-1821 / 1837-1839, D = 256 / 512 and L <= 1024 within
// +-3% noise; 2 threads, three pairs: (1, 16, 4096, 64) 885-912 / 921-957, (4, 8, 1024, 64)
// 110.2-111.9 / 112.2-113.3, (1, 8, 512, 64) 6.91-7.05 / 6.99-7.15.
// Causal: a diagonal tile pair takes only the keys its rows see (run_item), so the masked
// triangle computed per key tile is Br x Br / 2 and a small Br with a wide Bc wins (the same
// day, 2 threads, two runs each, backward ms): (1, 8, 512, 64) 128x512 4.39-4.60, 128x256
// 4.49-4.52, 128x128 (the choice before narrowing) 5.32-5.66, 256x512 5.26-5.40; (4, 8, 1024, 64)
// 64.3-64.7 / 64.8-65.5 / 66.4-67.3 / 69.6-70.2; (1, 16, 4096, 64) 461-465 / 475-476 / 482 /
// 462-469; long problems, where 256 x 256 was the choice before: (1, 2, 8192, 128) 428-434
// against 438-441 for 256x512; 1 thread pinned, (1, 1, 16384, 128) 1685-1692 / 1709-1720 /
// 256x256 1750-1811.
FlashTiles backward_tiles(const FlashTiles& requested, bool causal, int64_t lq, int64_t lk) {
  const FlashTiles automatic = causal ? FlashTiles{128, 512} : FlashTiles{256, 512};
  FlashTiles t = requested.is_auto() ? flash_tiles_from_env().value_or(automatic) : requested;
  t.br = std::max<int64_t>(1, std::min(t.br, lq));
  t.bc = std::max<int64_t>(1, std::min(t.bc, lk));
  return t;
}

// Whether each key tile's K_j and V_j are packed in gemm panels once for the query tiles
// that meet it (float only): brgemm reads them as they are in S = Q_i K_j^T and
// dP = dO_i V_j^T, where it transposed both for every tile pair. Where a key tile meets
// at least two query tiles: measured (2 threads, AMD EPYC Zen 4, paired runs) 1.5-10% faster
// at (1, 16, 4096, 64), within +-1.2% at (4, 8, 1024, 64); at (1, 8, 16384, 128) causal
// (256 x 256 tiles), three alternating runs, 7344 / 7358 / 7349 ms against 7491 / 7435 / 7395
// unpacked (-1.5%). Causal on 128 x 512 (narrowed diagonal tiles read the first panels):
// 2 threads, two pairs each, 64.0-64.2 ms against 64.7 unpacked at (4, 8, 1024, 64),
// 458.7-461.3 / 460.9-464.6 at (1, 16, 4096, 64), 4.54-4.56 / 4.44-4.60 at (1, 8, 512, 64).
// Not where oneDNN has no packed kernel (AVX2).
template <class T>
bool packed_tiles(const Flash<Same<T>>& f) {
  return std::is_same_v<T, float> && f.p->lk > 0 && f.p->lq > f.tiles.br && gemm_panels_native();
}

template <class T>
AttentionGradients run_backward(const Problem& p, const Tensor& out, const Tensor& dout, const Tensor& lse,
                                const AttentionOptions& options) {
  const Flash<Same<T>> f = tiles::make_flash<Same<T>>(
      p, options,
      mod_tiles(backward_tiles(options.tuning.flash_tiles, options.is_causal, p.lq, p.lk),
                options.tuning.flash_tiles.is_auto() && !flash_tiles_from_env(), options.mods, p.lq, p.lk));
  const DType dt = dtype_of<T>::value;
  // Entries own their gradient rows where no operand is broadcast over the batch and there
  // are no GQA groups (numel says both); their rows are then written once, not zeroed and
  // added to. (1, 8, 512, 64), 1 thread pinned, AMD EPYC Zen 4: backward 14.2-14.9 ms against
  // 15.9-18.0 zeroed (three alternated runs; the zeros were 3-4% of perf's samples).
  const bool own = p.q_in.numel() == p.batch_size * p.lq * p.dk && p.k_in.numel() == p.batch_size * p.lk * p.dk &&
                   p.v_in.numel() == p.batch_size * p.lk * p.dv;
  auto gradient = [&](const Tensor& x) { return own ? Tensor::empty(x.shape(), dt) : Tensor::zeros(x.shape(), dt); };
  Tensor dq = gradient(p.q_in), dk = gradient(p.k_in), dv = gradient(p.v_in);
  std::mutex add;
  // The workers parallel_for will really run: one inside a parallel region (a caller's
  // parallel_for or OpenMP region, where it runs the range inline), so that such a call
  // splits no entry into parts it would only run one after the other (and its result is
  // the one-thread result, whatever set_num_threads says).
  const int64_t threads = detail::in_parallel_region() ? 1 : get_num_threads();
  // P, the parts of each entry (key_tile_parts, flash_tiles.h). A part costs its worker a zeroed
  // [Lq, Dk] dQ and the entry's D_i again, and the call (P - 1) [Lq, Dk] additions: small beside
  // its 5 Lq (Lk / P) D tile products.
  const int64_t parts = key_tile_parts(p.batch_size, threads, (p.lk + f.tiles.bc - 1) / f.tiles.bc);
  std::vector<std::atomic<int64_t>> turn(static_cast<size_t>(parts > 1 ? p.batch_size : 0));
  for (auto& t : turn) t.store(0, std::memory_order_relaxed);
  std::atomic<bool> stop{false};
  Backward<T> bw{&f,           out.data<T>(), dout.data<T>(), lse.data<T>(), dq.data<T>(), dk.data<T>(),
                 dv.data<T>(), own,           &add,           &turn,         &stop};
  std::atomic<int64_t> next{0};
  const int64_t items = p.batch_size * parts;  // entry-major: the parts of an entry in order
  const int64_t workers = std::min<int64_t>(threads, items);
  const bool packed = packed_tiles<T>(f);
  parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    // A worker that leaves with an item it will not add (its error, an interrupt) sets stop,
    // so that the entry's later parts stop waiting for that item's turn (wait_turn).
    int64_t item = next++;
    try {
      Scratch<T> sc(f.tiles, p, parts, f.dropout_p > 0.0, f.mods.softcap > 0.0, packed, f.chunk);
      for (; item < items && !interrupt_requested() && !stop.load(std::memory_order_acquire); item = next++) {
        run_item(bw, item / parts, Part{item % parts, parts}, sc);
      }
    } catch (...) {
      stop.store(true, std::memory_order_release);
      throw;
    }
    if (item < items) stop.store(true, std::memory_order_release);
  });
  check_interrupt(p.op);
  // Work left undone without an error: an interrupt that was cleared before the check above.
  if (stop.load(std::memory_order_acquire)) fail<Interrupted>(p.op, ": interrupted");
  return {dq, dk, dv};
}

}  // namespace

AttentionGradients flash_attention_backward_cpu(const Problem& checked, const Tensor& out, const Tensor& grad_out,
                                                const Tensor& logsumexp, const AttentionOptions& options) {
  if (!checked.device.is_cpu()) fail_no_kernel(checked.op, checked.device);  // reads host memory
  const DType dt = checked.out_dtype == DType::f64 ? DType::f64 : DType::f32;
  // Contiguous copies in the compute type (views where they already are): the batch
  // offsets of the expanded problem are then offsets into the gradients' buffers.
  auto dense = [dt](const Tensor& t) { return t.to(dt).contiguous(); };
  const Problem p = with_operands(checked, dense(checked.q_in), dense(checked.k_in), dense(checked.v_in),
                                  as_kernel_mask(checked.mask_in, dt));
  const AttentionGradients g = dt == DType::f64
                                   ? run_backward<double>(p, dense(out), dense(grad_out), dense(logsumexp), options)
                                   : run_backward<float>(p, dense(out), dense(grad_out), dense(logsumexp), options);
  return {g.dq.to(checked.q_in.dtype()), g.dk.to(checked.k_in.dtype()), g.dv.to(checked.v_in.dtype())};
}

}  // namespace qkv::attention
