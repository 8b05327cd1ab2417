// The tile pieces shared by the fused CPU attention forward (attention_cpu.cc) and
// backward (attention_backward_cpu.cc): element types, the call's read-only state, a
// query-row block, and the score tile S = scale Q K^T + bias with masks, causal
// masking and dropout, so that both passes compute the same scores and draw the same
// dropout mask. Internal to the two kernels.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "attention/attention_int8.h"
#include "attention/dropout_rows.h"
#include "attention/flash_tiles.h"
#include "attention/mods.h"
#include "attention/problem.h"
#include "kernels/cpu/aligned_vector.h"
#include "kernels/cpu/convert.h"
#include "qkv/gemm.h"
#include "qkv/random.h"
#include "qkv/softmax.h"

namespace qkv::attention::tiles {

// The kernels' element types (attention_cpu.cc's top): T computes (float, or double for f64:
// OpenBLAS dgemm tiles, the row kernels' double versions), S stores q, k and v, G is
// what the tile GEMMs read (S, or T when 16-bit tiles are widened).
template <class Compute, class Stored, class Gemm>
struct Types {
  using T = Compute;
  using S = Stored;
  using G = Gemm;
  static constexpr bool kWiden = !std::is_same_v<S, G>;   // q, k, v tiles widened to G = T
  static constexpr bool kRoundP = !std::is_same_v<T, G>;  // P rounded to G = S for P V
};

template <class T>
constexpr T kNegInf = -std::numeric_limits<T>::infinity();

// A matrix as a tile GEMM reads it: rows `ld` elements apart.
template <class G>
struct Mat {
  const G* data = nullptr;
  int64_t ld = 0;
};

// t with rows the tile GEMMs can read (contiguous within, apart by >= a row), in its
// own dtype; copies only when needed.
inline Tensor as_kernel_input(const Tensor& t) {
  const bool rows_contiguous = t.size(-1) <= 1 || t.stride(-1) == 1;
  const bool rows_apart = t.size(-2) <= 1 || t.stride(-2) >= t.size(-1);
  return rows_contiguous && rows_apart ? t : t.contiguous();
}

// Bool masks are read as they are; floating masks as T (converted at the
// user's shape, before broadcasting, so never per head).
inline std::optional<Tensor> as_kernel_mask(const std::optional<Tensor>& m, DType dt) {
  if (!m || m->dtype() == DType::b8 || m->dtype() == dt || !is_floating(m->dtype())) return m;
  return m->to(dt);
}

// Float32 Q K^T over Dk > kChunkFrom sums chunks of kScoreChunk products (S = sum_c Q_c K_c^T,
// each chunk one GEMM into S, beta 1 after the first), as torch's matmul sums in blocks: oneDNN's
// brgemm sums the Dk products of a score in one FMA chain, whose error grows with Dk (1.5-1.9x
// torch's RMS error at D = 256 / 512; docs/attention-cpu.md, "float32 accuracy"). The chunks'
// operands are dense (Q rows and K tiles chunk-major, K panels packed per chunk), so that
// oneDNN keeps its brgemm kernels. Dk <= kChunkFrom: one product, as before.
inline constexpr int64_t kChunkFrom = 128;
inline constexpr int64_t kScoreChunk = 64;

// Flash::chunk: kScoreChunk for float32 tiles over float32 operands with Dk > kChunkFrom, else 0.
template <class K>
int64_t score_chunk(int64_t dk) {
  using F = float;
  constexpr bool f32 =
      std::is_same_v<typename K::T, F> && std::is_same_v<typename K::S, F> && std::is_same_v<typename K::G, F>;
  return f32 && dk > kChunkFrom ? kScoreChunk : 0;
}

// Read-only state of one call, shared by the workers.
template <class K>
struct Flash {
  using T = typename K::T;
  using S = typename K::S;
  const Problem* p = nullptr;
  FlashTiles tiles;
  bool causal = false;
  double dropout_p = 0.0;
  uint64_t seed = 0;
  T keep_scale = 1;
  ModPlan mods;                             // options.mods prepared (inactive when none is set)
  int64_t chunk = 0;                        // Dk chunk width of Q K^T (score_chunk), 0: one product
  const int8::QuantizedKeys* k8 = nullptr;  // int8 Q K^T (options.qk_quantization, forward only) or null
  const S* q = nullptr;                     // p->q [batch..., Lq, Dk] element 0
  const S* k = nullptr;                     // p->k [kv batch..., Lk, Dk]
  const S* v = nullptr;                     // p->v [kv batch..., Lk, Dv]
  const bool* mask_bool = nullptr;          // p->mask [batch..., Lq, Lk] when bool
  const T* mask_float = nullptr;            // p->mask when floating (as T)
  T* out = nullptr;                         // [batch, Lq, Dv] contiguous
  T* lse = nullptr;                         // [batch, Lq] or null
  T* weights = nullptr;                     // [batch, Lq, Lk] or null
};

// The read-only state of a call over problem p (q, k, v of type S, a bool or T mask),
// with its options and tiles; the outputs (out, lse, weights) are the caller's to set.
template <class K>
Flash<K> make_flash(const Problem& p, const AttentionOptions& options, const FlashTiles& tiles) {
  using T = typename K::T;
  using S = typename K::S;
  Flash<K> f;
  f.p = &p;
  f.tiles = tiles;
  f.causal = options.is_causal;
  f.dropout_p = options.dropout_p;
  f.seed = options.seed;
  f.keep_scale = options.dropout_p < 1.0 ? static_cast<T>(1.0 / (1.0 - options.dropout_p)) : T(0);
  f.mods = make_mod_plan(options.mods, p.lq, p.lk, p.heads_q);
  f.chunk = score_chunk<K>(p.dk);
  f.q = p.q.data<S>();
  f.k = p.k.data<S>();
  f.v = p.v.data<S>();
  if (p.mask && p.mask->dtype() == DType::b8) f.mask_bool = p.mask->data<bool>();
  if (p.mask && p.mask->dtype() != DType::b8) f.mask_float = p.mask->data<T>();
  return f;
}

// One work item: `rows` query rows from i0 of flat batch entry b.
template <class K>
struct Rows {
  using T = typename K::T;
  using S = typename K::S;
  using G = typename K::G;
  int64_t b = 0, i0 = 0, rows = 0;
  int64_t kv_end = 0;     // keys [0, kv_end) take part (causal stops at the diagonal)
  const S* q = nullptr;   // [rows, Dk], row stride p->q.stride(-2)
  const S* k = nullptr;   // [Lk, Dk] of the entry's k/v head
  const S* v = nullptr;   // [Lk, Dv]
  int64_t mask_base = 0;  // offset of the entry's [Lq, Lk] mask
  T* o = nullptr;         // [rows, Dv] output rows, the accumulator
  // The entry's keys from kp_from packed by gemm_pack_panels (float tiles), or null:
  // product_tile then reads a key tile starting at a panel as it is (no per-product
  // transposition); forward: the whole K (KeyPanels), backward: the key tile.
  const G* kp = nullptr;
  int64_t kp_from = 0;
  int64_t kp_chunk = 0;  // where Flash::chunk: floats between the Dk chunks' panels (pack_key_panels)
  // The entry's whole K [Lk, Dk] and V [Lk, Dv] widened to G once per worker (16-bit operands
  // without a native GEMM, small heads: attention_cpu.cc widen_head), or null: each tile is
  // widened where it is used.
  const G* kw = nullptr;
  const G* vw = nullptr;
};

// `rows` rows of n elements (ld apart) as the tile GEMMs read them: in place, or
// converted into `buffer` (dense rows) when the GEMM's type G differs from X.
template <class G, class X>
Mat<G> gemm_operand(const X* x, int64_t rows, int64_t n, int64_t ld, kernels::AlignedVector<G>& buffer) {
  if constexpr (std::is_same_v<G, X>) {
    return {x, ld};
  } else {
    kernels::convert_rows(x, rows, n, ld, buffer.data(), n);
    return {buffer.data(), n};
  }
}

// dst = `rows` rows of n elements (ld apart) from x, chunk-major: chunk c (columns
// [c0, c0 + w), c0 = c * chunk, w = min(chunk, n - c0)) as dense [rows, w] at dst + rows * c0.
template <class G>
void chunk_major(const G* x, int64_t rows, int64_t n, int64_t ld, int64_t chunk, G* dst) {
  for (int64_t c0 = 0; c0 < n; c0 += chunk) {
    const int64_t w = std::min(chunk, n - c0);
    for (int64_t i = 0; i < rows; ++i) std::copy_n(x + i * ld + c0, w, dst + rows * c0 + i * w);
  }
}

// The item's Q rows [rows, Dk] as the score product reads them: chunk-major in `buffer`
// where the call chunks Q K^T (Flash::chunk; ld then unused), else as gemm_operand.
template <class K, class G = typename K::G, class X>
Mat<G> query_operand(const Flash<K>& f, const X* x, int64_t rows, int64_t ld, kernels::AlignedVector<G>& buffer) {
  if constexpr (std::is_same_v<G, X>) {
    if (f.chunk > 0) {
      chunk_major(x, rows, f.p->dk, ld, f.chunk, buffer.data());
      return {buffer.data(), f.chunk};
    }
  }
  return gemm_operand(x, rows, f.p->dk, ld, buffer);
}

// Floats of n keys of Dk elements packed for the score products: per Dk chunk where the call
// chunks Q K^T (chunk > 0, Flash::chunk), else whole as gemm_pack_panels packs them.
inline int64_t key_panels_size(int64_t dk, int64_t n, int64_t chunk) {
  if (chunk <= 0) return gemm_panels_size(dk, n);
  const int64_t last = dk - (dk - 1) / chunk * chunk;  // width of the last chunk
  return (dk - last) / chunk * gemm_panels_size(chunk, n) + gemm_panels_size(last, n);
}

// k [n, Dk] (rows ld apart) packed for the score products (key_panels_size floats): chunk by
// chunk where chunk > 0 (Dk columns [c0, c0 + w) as gemm_pack_panels packs a [n, w] K, at
// panels + c * gemm_panels_size(chunk, n)), else whole.
inline void pack_key_panels(const float* k, int64_t n, int64_t dk, int64_t ld, int64_t chunk, float* panels,
                            bool stream = false) {
  if (chunk <= 0) return gemm_pack_panels(true, dk, n, k, ld, panels, stream);
  for (int64_t c0 = 0; c0 < dk; c0 += chunk) {
    gemm_pack_panels(true, std::min(chunk, dk - c0), n, k + c0, ld, panels + c0 / chunk * gemm_panels_size(chunk, n),
                     stream);
  }
}

// s [rows, cols] (row stride lds) += the mask of rows i0.. and keys j0..
template <class K, class T = typename K::T>
void add_mask(const Flash<K>& f, const Rows<K>& r, int64_t j0, int64_t cols, T* s, int64_t lds) {
  const Tensor& mask = *f.p->mask;
  const int64_t si = mask.stride(-2), sj = mask.stride(-1);
  for (int64_t x = 0; x < r.rows; ++x) {
    T* row = s + x * lds;  // [cols]
    const int64_t base = r.mask_base + (r.i0 + x) * si + j0 * sj;
    if constexpr (std::is_same_v<T, float>) {
      // Dense mask rows of float32 tiles on Highway, where the plain loops compiled to SSE
      // (float) and to scalar code (bool, for the stride): (1, 8, 2048, 64), 1 thread, a
      // [1, 1, L, L] mask cost +56% (bool) and +25% (float) over no mask before.
      if (sj == 1 && f.mask_bool) {
        kernels::add_bool_mask(row, f.mask_bool + base, cols);
        continue;
      }
      if (sj == 1) {
        kernels::add_row(row, f.mask_float + base, cols);
        continue;
      }
    }
    if (f.mask_bool) {  // False adds -inf (PyTorch's conversion): a NaN or +inf score stays NaN
      const bool* m = f.mask_bool + base;
      for (int64_t c = 0; c < cols; ++c) row[c] += m[c * sj] ? T(0) : kNegInf<T>;
    } else if (sj == 1) {
      const T* m = f.mask_float + base;
      for (int64_t c = 0; c < cols; ++c) row[c] += m[c];
    } else {
      const T* m = f.mask_float + base;
      for (int64_t c = 0; c < cols; ++c) row[c] += m[c * sj];
    }
  }
}

// score_mods on Highway for float32 tiles where softcap, ALiBi and the relative bias are the only
// score modifiers (a score_mod goes element by element, below): false where it does not apply.
// Per element in double before: (1, 8, 2048, 64), 1 thread, softcap made the forward 4.9x
// slower (482.8 ms against 98.4), ALiBi 1.4x and a relative bias 1.8x (163.0 ms; 92.2 after).
template <class K, class T>
bool score_mods_vector(const Flash<K>& f, const Rows<K>& r, int64_t j0, int64_t cols, T* s, int64_t lds, T* cap_grad) {
  const ModPlan& m = f.mods;
  if constexpr (!std::is_same_v<T, float>) {
    return false;
  } else {
    if (m.mods->score_mod) return false;
    // ALiBi's key - query distances as floats: exact within 2^24.
    constexpr int64_t kExact = int64_t{1} << 24;
    const int64_t nearest = j0 - (r.i0 + r.rows - 1 + m.offset), farthest = j0 + cols - (r.i0 + m.offset);
    if (!m.alibi.empty() && (nearest < -kExact || farthest > kExact)) return false;
    const float slope = m.alibi.empty() ? 0.0f : static_cast<float>(m.alibi[static_cast<size_t>(r.b % m.heads)]);
    for (int64_t x = 0; x < r.rows; ++x) {
      float* row = s + x * lds;  // [cols]
      if (m.softcap > 0.0) {
        kernels::softcap_row(row, cols, static_cast<float>(m.softcap), cap_grad ? cap_grad + x * lds : nullptr);
      }
      if (!m.alibi.empty()) kernels::add_ramp(row, cols, static_cast<float>(j0 - (r.i0 + x + m.offset)), slope);
      if (!m.relative_f.empty()) {  // + relative[hb, j - i + Lq - 1]: keys j0.. are one run of it
        const int64_t hb = m.relative_heads == 1 ? 0 : r.b % m.heads;
        kernels::add_row(row, m.relative_f.data() + hb * (m.lq + m.lk - 1) + j0 - (r.i0 + x) + m.lq - 1, cols);
      }
    }
    return true;
  }
}

// The score modifiers on s [rows, cols] of rows i0.., keys j0.. (qkv/attention_mods.h's
// order); cap_grad, when given, gets softcap's derivative 1 - tanh^2 for the backward.
template <class K, class T = typename K::T>
void score_mods(const Flash<K>& f, const Rows<K>& r, int64_t j0, int64_t cols, T* s, int64_t lds, T* cap_grad) {
  const ModPlan& m = f.mods;
  if (score_mods_vector(f, r, j0, cols, s, lds, cap_grad)) return;
  for (int64_t x = 0; x < r.rows; ++x) {
    for (int64_t c = 0; c < cols; ++c) {
      const double v = s[x * lds + c];
      if (cap_grad) {
        const double t = std::tanh(v / m.softcap);
        cap_grad[x * lds + c] = static_cast<T>(1.0 - t * t);
      }
      s[x * lds + c] = static_cast<T>(m.score(v, r.b, r.i0 + x, j0 + c));
    }
  }
}

// The mask modifiers: keys a row may not see get `masked` (-inf, or masked_fill's value).
template <class K, class T = typename K::T>
void mask_mods(const Flash<K>& f, const Rows<K>& r, int64_t j0, int64_t cols, T* s, int64_t lds, T masked) {
  const ModPlan& m = f.mods;
  if (m.interval) {  // each row's keys are one run: mask outside its ends, no element test
    if (m.key_lo(r.i0 + r.rows - 1) <= j0 && m.key_hi(r.i0) >= j0 + cols) return;  // every row sees every key
    for (int64_t x = 0; x < r.rows; ++x) {
      T* row = s + x * lds;  // [cols]
      const int64_t a = std::clamp<int64_t>(m.key_lo(r.i0 + x) - j0, 0, cols);
      const int64_t e = std::clamp<int64_t>(m.key_hi(r.i0 + x) - j0, a, cols);
      std::fill(row, row + a, masked);
      std::fill(row + e, row + cols, masked);
    }
    return;
  }
  const TileClass cls = m.classify(r.i0, r.i0 + r.rows, j0, j0 + cols);
  if (cls == TileClass::full) return;
  for (int64_t x = 0; x < r.rows; ++x) {
    T* row = s + x * lds;  // [cols]
    if (cls == TileClass::empty) {
      std::fill(row, row + cols, masked);
      continue;
    }
    thread_local std::vector<char> ok;  // [cols]: the row's allowed keys
    ok.resize(static_cast<size_t>(cols));
    m.row_allowed(r.b, r.i0 + x, j0, cols, ok.data());
    for (int64_t c = 0; c < cols; ++c) row[c] = ok[static_cast<size_t>(c)] ? row[c] : masked;
  }
}

// Whether the mask modifiers leave no key of rows r x keys [j0, j0 + cols): the kernels skip it.
template <class K>
bool empty_tile(const Flash<K>& f, const Rows<K>& r, int64_t j0, int64_t cols) {
  return f.mods.masking && f.mods.classify(r.i0, r.i0 + r.rows, j0, j0 + cols) == TileClass::empty;
}

// s [rows, cols] = scale * Q K^T on the tile GEMM of type G; k: [cols, Dk], or `panels`, the
// same keys packed by gemm_pack_panels (float tiles only; attention_cpu.cc's KeyPanels).
template <class K, class T = typename K::T, class G = typename K::G>
void product(const Flash<K>& f, const Rows<K>& r, Mat<G> q, Mat<G> k, int64_t cols, T* s, int64_t lds,
             const G* panels = nullptr) {
  const Problem& p = *f.p;
  GemmShape g;
  g.trans_b = true;
  g.m = r.rows;
  g.n = cols;
  g.k = p.dk;
  g.lda = q.ld;
  g.ldb = k.ld;
  g.ldc = lds;
  // gemm skips A B when alpha is 0 (BLAS rules); scale 0 must still turn an inf q . k into NaN.
  const T alpha = static_cast<T>(p.scale);
  const T a = alpha == T(0) ? T(1) : alpha;
  if constexpr (std::is_same_v<G, float>) {
    if (panels) gemm_panels(g, a, q.data, panels, T(0), s);
  }
  if (panels == nullptr || !std::is_same_v<G, float>) gemm(g, a, q.data, k.data, T(0), s);
  if (alpha == T(0)) {
    for (int64_t x = 0; x < r.rows; ++x) kernels::scale(s + x * lds, cols, T(0));
  }
}

// Whether the score product of keys j0.. (cols keys in score rows lds wide) reads them packed
// (Rows::kp): the tile starts a panel and fills the score rows with whole panels (product_tile).
template <class K>
bool reads_panels(const Rows<K>& r, int64_t j0, int64_t cols, int64_t lds) {
  return r.kp && j0 >= r.kp_from && (j0 - r.kp_from) % 64 == 0 && cols == lds && cols % 64 == 0;
}

// s [rows, cols] = scale * Q K[j0:j0+cols]^T summed over Dk chunks (Flash::chunk: float32
// tiles): q chunk-major (query_operand); K as chunked panels (Rows::kp, pack_key_panels) where
// product_tile would read panels, else its tile copied chunk-major into k_buffer [Bc, Dk].
template <class K>
void product_chunks(const Flash<K>& f, const Rows<K>& r, Mat<float> q, int64_t j0, int64_t cols, float* s, int64_t lds,
                    kernels::AlignedVector<float>& k_buffer) {
  const Problem& p = *f.p;
  const bool packed = reads_panels(r, j0, cols, lds);
  if (!packed) chunk_major(r.k + j0 * p.k.stride(-2), cols, p.dk, p.k.stride(-2), f.chunk, k_buffer.data());
  GemmShape g;
  g.trans_b = true;
  g.m = r.rows;
  g.n = cols;
  g.ldc = lds;
  // gemm skips A B when alpha is 0 (BLAS rules); scale 0 must still turn an inf q . k into NaN.
  const float alpha = static_cast<float>(p.scale);
  const float a = alpha == 0.0f ? 1.0f : alpha;
  for (int64_t c0 = 0; c0 < p.dk; c0 += f.chunk) {
    g.k = g.lda = g.ldb = std::min(f.chunk, p.dk - c0);
    const float beta = c0 == 0 ? 0.0f : 1.0f;
    if (packed) {
      const float* panels = r.kp + c0 / f.chunk * r.kp_chunk + (j0 - r.kp_from) / 64 * gemm_panels_size(g.k, 64);
      gemm_panels(g, a, q.data + r.rows * c0, panels, beta, s);
    } else {
      gemm(g, a, q.data + r.rows * c0, k_buffer.data() + cols * c0, beta, s);
    }
  }
  if (alpha == 0.0f) {
    for (int64_t x = 0; x < r.rows; ++x) kernels::scale(s + x * lds, cols, 0.0f);
  }
}

// s [rows, cols] = scale * Q K[j0:j0+cols]^T on the tile GEMM of type G.
template <class K, class T = typename K::T, class G = typename K::G>
void product_tile(const Flash<K>& f, const Rows<K>& r, Mat<G> q, int64_t j0, int64_t cols, T* s, int64_t lds,
                  kernels::AlignedVector<G>& k_buffer) {
  const Problem& p = *f.p;
  if constexpr (std::is_same_v<G, float> && std::is_same_v<T, float> && std::is_same_v<typename K::S, float>) {
    if (f.chunk > 0) return product_chunks(f, r, q, j0, cols, s, lds, k_buffer);
  }
  // The tile's keys packed (Rows::kp) where they start a panel and fill the score rows with
  // whole panels. Narrower tiles (a causal row block's 128-key first tile in 256-wide scores;
  // the last 488 keys at Lk = 1000 in 512-wide ones) take the transposing product: gemm_panels
  // would stage their C rows through a copy (oneDNN 2.6 runs packed products with ldc != N on
  // its reference matmul), and packing them measured no faster at causal (4, 8, 1024, 64) and
  // (1, 16, 4096, 64) (2 threads, Zen 4, three alternating runs).
  const G* panels = nullptr;
  if (reads_panels(r, j0, cols, lds)) {
    panels = r.kp + (j0 - r.kp_from) / 64 * gemm_panels_size(p.dk, 64);
  }
  const Mat<G> k = r.kw ? Mat<G>{r.kw + j0 * p.dk, p.dk}
                        : gemm_operand(r.k + j0 * p.k.stride(-2), cols, p.dk, p.k.stride(-2), k_buffer);
  product(f, r, q, k, cols, s, lds, panels);
}

// The scores s [rows, cols] of keys j0.. after the product: score mods, mask, mask mods,
// causal (score_tile's order; keys a mask modifier hides get `masked`).
template <class K, class T = typename K::T>
void modify_tile(const Flash<K>& f, const Rows<K>& r, int64_t j0, int64_t cols, T* s, int64_t lds, T masked,
                 T* cap_grad) {
  if (f.mods.scoring) score_mods(f, r, j0, cols, s, lds, cap_grad);
  if (f.p->mask) add_mask(f, r, j0, cols, s, lds);
  if (f.mods.masking) mask_mods(f, r, j0, cols, s, lds, masked);
  if (f.causal && j0 + cols - 1 > r.i0) {  // the tile crosses the diagonal
    for (int64_t x = 0; x < r.rows; ++x) {
      const int64_t first = std::max<int64_t>(0, r.i0 + x + 1 - j0);  // keys j > i are masked
      std::fill(s + x * lds + std::min(first, cols), s + x * lds + cols, kNegInf<T>);
    }
  }
}

// s [rows, cols] = scale * Q K[j0:j0+cols]^T + bias (score mods, mask, mask mods, causal);
// q: the item's Q rows; k_buffer: [Bc, Dk] where K tiles are widened (K::kWiden). Keys a
// mask modifier hides get `masked`; cap_grad: see score_mods. q8: the item's Q rows on
// int8 (attention_int8.h) when the call quantizes Q K^T, else null.
template <class K, class T = typename K::T, class G = typename K::G>
void score_tile(const Flash<K>& f, const Rows<K>& r, Mat<G> q, int64_t j0, int64_t cols, T* s, int64_t lds,
                kernels::AlignedVector<G>& k_buffer, T masked = kNegInf<T>, T* cap_grad = nullptr,
                int8::QuantizedQuery* q8 = nullptr) {
  const Problem& p = *f.p;
  if (q8 == nullptr || !q8->ok) {
    product_tile(f, r, q, j0, cols, s, lds, k_buffer);
  } else if constexpr (std::is_same_v<T, float>) {
    int8::quantized_scores(*q8, r.rows, j0, cols, static_cast<float>(p.scale), s, lds);
  }
  modify_tile(f, r, j0, cols, s, lds, masked, cap_grad);
}

// The dropout draw's index of weight (row x of the item, key j) in [..., Hq, Lq, Lk]: the
// reference's (attention_reference.cc), so that both drop the same weights.
template <class K>
uint64_t dropout_index(const Flash<K>& f, const Rows<K>& r, int64_t x, int64_t j) {
  const Problem& p = *f.p;
  return static_cast<uint64_t>((r.b * p.lq + r.i0 + x) * p.lk + j);
}

// Dropout on probabilities s [rows, cols] (row stride lds) of rows i0.., keys j0.., and with
// the same draws on s2 (same layout) where it is not null: the backward's P and dP.
template <class K, class T = typename K::T>
void dropout_tile(const Flash<K>& f, const Rows<K>& r, int64_t j0, int64_t cols, T* s, int64_t lds, T* s2 = nullptr) {
  for (int64_t x = 0; x < r.rows; ++x) {
    T* row = s + x * lds;                                    // [cols]
    T* row2 = s2 ? s2 + x * lds : static_cast<T*>(nullptr);  // [cols] or null
    const uint64_t index = dropout_index(f, r, x, j0);
    if constexpr (std::is_same_v<T, float>) {  // the same draws, vectorized (dropout_rows.h)
      dropout_row(row, cols, f.seed, index, f.dropout_p, f.keep_scale, row2);
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        const bool keep = random::dropout_keep(f.seed, index + static_cast<uint64_t>(c), f.dropout_p);
        row[c] = keep ? row[c] * f.keep_scale : T(0);
        if (row2) row2[c] = keep ? row2[c] * f.keep_scale : T(0);
      }
    }
  }
}

}  // namespace qkv::attention::tiles
