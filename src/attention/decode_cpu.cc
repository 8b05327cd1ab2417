// decode_attention's CPU kernel (qkv/kv_cache.h): split-KV over (sequence, cache head, key
// chunk) work items, the query heads of a cache head together, partials merged by logsumexp.
//
// Item (b, hk, c) reads keys [c0, c1) of cache head hk of sequence b once and computes, for the
// G = Hq / Hk query heads h = hk G .. hk G + G - 1 and the Lq new queries (G Lq rows, contiguous
// in q [B, Hq, Lq, D]):
//   S = scale Q K[c0:c1]^T  [G Lq, C], softcap, keys outside each row's range -inf
//   m = rowmax(S), P = exp(S - m), l = rowsum(P), O = P V[c0:c1]  [G Lq, Dv]
// then every (b, hq, t) merges its chunks: M = max_c m_c, L = sum_c l_c e^(m_c - M),
// out = sum_c O_c e^(m_c - M) / L, lse = M + log L. Every cache is read in place by Highway kernels
// (decode_rows.h) that load float32 rows as they are and widen (or dequantize) the others in
// registers: the step is bandwidth-bound, and widening each chunk into scratch first read bf16
// at 73-78% of memcpy; float32 caches went through two qkv::gemm calls (M = G Lq rows) until
// 2026-11-27, which read them at 14-18 GB/s on 2 threads where these kernels read 21-32
// (docs/decode_performance.md, "float32 caches read in place").
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/decode_cpu.h"
#include "attention/decode_rows.h"
#include "attention/lse_merge.h"
#include "kernels/cpu/convert.h"
#include "qkv/parallel.h"
#include "qkv/softmax.h"

namespace qkv::attention {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Item {
  int64_t b, hk, c0, c1, slot;  // keys [c0, c1); partials at slot
};

// The keys any query of sequence b may see start at `first` (query 0's window start).
int64_t first_needed(const DecodeCall& d, const DecodeOptions& o, int64_t length) {
  return decode_keys(d, o.causal, length, 0).first;
}

// The largest automatic chunk: 1024 keys, or kInt8Chunk on an int8 cache whose G Lq query rows
// the kernels take in one pass (1 row, or kRowsPerPass rows) with Dv a multiple of 64 (value
// passes over blocks of kInt8ValueKeys keys in L1): each key row and value row is read once, so
// nothing asks the chunk to stay in L2; and the scores [G Lq, C] stay within 128 KB. Each item
// starts its key and value streams cold (its first rows before the prefetches run ahead) and
// adds a partial to merge: at 32k keys, 2 threads, 8192-key chunks took the int8 step from 30.0
// to 25.0 ms at B = 8 and from 3.91 to 3.42 ms at B = 1 (docs/decode_int8.md, "Fifth pass"; 32768:
// 24.7 and 3.55 ms, 4 items a thread at B = 1 too few to balance).
constexpr int64_t kInt8Chunk = 8192;
int64_t int8_chunk_max(const DecodeCall& d, const KVCache& cache) {
  const int64_t rows = d.group * d.lq;
  if (cache.config().dtype != DType::i8 || d.dv % 64 != 0 || (rows != 1 && rows != kRowsPerPass)) return 1024;
  return std::max<int64_t>(1024, std::min(kInt8Chunk, (int64_t{32} << 10) / rows));
}

// Keys per item: the caller's, else enough chunks for 4 items per thread over B Hk sequences
// of the longest span of keys, between 256 keys (each item starts its streams cold and adds a
// partial to merge) and 1024 (a chunk's values stay in L2 for the value passes over its channels;
// whole-sequence chunks of a bf16 cache widened to f32 scratch ran at 2.6 GB/s at 32k keys),
// or kInt8Chunk for an int8 cache whose kernels read each key and value once (int8_chunk_max).
int64_t chunk_size(const DecodeCall& d, const KVCache& cache, const DecodeOptions& o) {
  if (o.chunk > 0) return o.chunk;
  int64_t longest = 1;
  for (int64_t b = 0; b < d.b; ++b) longest = std::max(longest, cache.length(b) - first_needed(d, o, cache.length(b)));
  const int64_t heads = std::max<int64_t>(1, d.b * d.hk);  // a batch of 0 sequences divided by 0 (SIGFPE)
  const int64_t per_seq = std::max<int64_t>(1, (4 * get_num_threads() + heads - 1) / heads);
  return std::clamp<int64_t>((longest + per_seq - 1) / per_seq, 256, int8_chunk_max(d, cache));
}

// Work items (b, hk, keys [c0, c1)): chunks over the keys some query needs, on multiples of the
// chunk whatever the layout (a paged or windowed cache gives the contiguous cache's items, bit for
// bit the same result; an item whose rows are not consecutive — pages, a ring's wrap — gathers
// them run by run into its scratch, or its kernels read it run by run).
std::vector<Item> make_items(const DecodeCall& d, const KVCache& cache, const DecodeOptions& o) {
  const int64_t chunk = chunk_size(d, cache, o);
  std::vector<Item> items;
  for (int64_t b = 0; b < d.b; ++b) {
    const int64_t length = cache.length(b), lo = std::min(first_needed(d, o, length), length);
    for (int64_t hk = 0; hk < d.hk; ++hk) {
      int64_t c0 = lo;
      do {  // >= 1 item per row
        const int64_t c1 =
            c0 + std::min(length - c0, chunk - c0 % chunk);  // (c0 / chunk + 1) chunk overflowed near 2^63
        items.push_back({b, hk, c0, c1, static_cast<int64_t>(items.size())});
        c0 = c1;
      } while (c0 < length);
    }
  }
  return items;
}

// f(i, len, first, next) for each run of consecutive rows of item it's keys (a page, or up to a
// ring's wrap; qkv/kv_cache.h): keys it.c0 + i .. + len - 1 are rows first .. first + len - 1,
// and the item's next run starts at row `next` (-1: none).
template <class F>
void for_each_run(const KVCache& cache, const Item& it, F&& f) {
  const int64_t cols = it.c1 - it.c0;
  int64_t first = cache.row(it.b, it.hk, it.c0);
  for (int64_t i = 0; i < cols;) {
    const int64_t p = it.c0 + i, len = std::min(cols - i, cache.run_end(it.b, p) - p);
    const int64_t next = i + len < cols ? cache.row(it.b, it.hk, p + len) : -1;
    f(i, len, first, next);
    i += len, first = next;
  }
}

// Row `next` of storage t (-1: null), for the kernels' prefetches across runs.
template <class T>
const T* next_row(const Tensor& t, int64_t next) {
  return next < 0 ? nullptr : t.data<T>() + next * t.size(3);
}

// Rows [n, Dx] of the cache's storage t (int8 values and their scales) of
// item it: in place when consecutive, else gathered into `buffer` run by run.
template <class T>
const T* cache_rows(const KVCache& cache, const Tensor& t, const Item& it, std::vector<T>& buffer) {
  const int64_t dx = t.size(3), n = it.c1 - it.c0;
  if (cache.run_end(it.b, it.c0) >= it.c1) return t.data<T>() + cache.row(it.b, it.hk, it.c0) * dx;
  buffer.resize(static_cast<size_t>(n * dx));
  for_each_run(cache, it, [&](int64_t i, int64_t len, int64_t first, int64_t) {
    std::copy_n(t.data<T>() + first * dx, len * dx, buffer.data() + i * dx);  // [len, Dx]
  });
  return buffer.data();
}

struct Partials {
  int64_t rows = 0, dv = 0;
  std::vector<float> m, l, o;  // [slots, rows], [slots, rows], [slots, rows, Dv]
};

struct Scratch {
  std::vector<float> s;
  std::vector<char> keyless;        // [G Lq]: the row has no key in the item
  std::vector<int8_t> v8;           // an int8 block of values [<= kInt8ValueKeys, Dv] spanning runs, gathered
  std::vector<bfloat16> v8_scales;  // its scales [<= kInt8ValueKeys, Dv / 16]
  // int8 caches' query (decode_rows.h's Int8Query): q r as floats, then rounded: q_hat as floats
  // [G Lq, D], its scales and q . c [G Lq]; q_hat [G Lq, D] and in the kernel's layout
  std::vector<float> qs, sigma, qc;
  std::vector<int16_t> q_hat, q16;
  int64_t q_for = -1;  // the cache head (b Hk + hk) they were made for: a thread's items mostly follow one another
};

// int8_query's rows for cache head bh into sc.
void fill_int8_query(const DecodeCall& d, const float* qrows, const KVCache& cache, int64_t bh, Scratch& sc) {
  const int64_t rows = d.group * d.lq, dk = d.dk;
  sc.q_for = bh;
  const float* spread = cache.key_spreads().data<float>() + bh * dk;  // [D]
  const float* offset = cache.key_offsets().data<float>() + bh * dk;  // [D]
  sc.qs.resize(static_cast<size_t>(rows * dk)), sc.q_hat.resize(static_cast<size_t>(rows * dk));
  sc.sigma.resize(static_cast<size_t>(rows)), sc.qc.resize(static_cast<size_t>(rows));
  sc.q16.resize(dk % 64 == 0 ? static_cast<size_t>(rows * dk) : 0);
  for (int64_t r = 0; r < rows; ++r) {
    double qc = 0.0;
    float* qs = sc.qs.data() + r * dk;
    int16_t* q_hat = sc.q_hat.data() + r * dk;
    for (int64_t c = 0; c < dk; ++c) {
      qs[c] = qrows[r * dk + c] * spread[c];
      qc += static_cast<double>(qrows[r * dk + c]) * offset[c];
    }
    sc.qc[r] = static_cast<float>(qc);
    sc.sigma[r] = quantize_query_row(qs, dk, q_hat);
    for (int64_t c = 0; c < dk; ++c) qs[c] = static_cast<float>(q_hat[c]);
    for (int64_t c = 0; c < static_cast<int64_t>(sc.q16.size()) / rows; ++c) {  // block of 64: even, odd channels
      sc.q16[r * dk + c] = q_hat[c / 64 * 64 + (c % 64 < 32 ? 2 * (c % 64) : 2 * (c % 64 - 32) + 1)];
    }
  }
}

// int8 caches' query rows [rows, D] for cache head (b, hk): q r rounded per row (its spreads r),
// in channel order and, when D is a multiple of 64, in the kernel's layout; q . c (offsets c).
Int8Query int8_query(const DecodeCall& d, const float* qrows, const KVCache& cache, int64_t bh, Scratch& sc) {
  // Made once per cache head: rounding 4 rows of 128 per item of 1024 keys was 10% of its scores' time.
  if (sc.q_for != bh) fill_int8_query(d, qrows, cache, bh, sc);
  return {sc.q16.empty() ? nullptr : sc.q16.data(), sc.qs.data(), sc.sigma.data(), sc.qc.data()};
}

// int8 caches (decode_rows.h): S = scale Q K^T and O = P V on the int8 rows in place, run by
// run (a page, or up to a ring's wrap): q . k = (q r) . (q_k s) + q . c with r, c the keys'
// spreads and offsets and q r rounded to int16 per row (integer products with the keys).
void scores_int8(const DecodeCall& d, const float* qrows, const KVCache& cache, const Item& it, Scratch& sc) {
  const int64_t rows = d.group * d.lq, cols = it.c1 - it.c0;
  const Int8Query q = int8_query(d, qrows, cache, it.b * d.hk + it.hk, sc);
  const int64_t groups = cache.key_scales().size(3);
  for_each_run(cache, it, [&](int64_t i, int64_t len, int64_t first, int64_t next) {
    int8_scores(q, rows, cache.keys().data<int8_t>() + first * d.dk,
                cache.key_scales().data<bfloat16>() + first * groups, len, d.dk, next_row<int8_t>(cache.keys(), next),
                static_cast<float>(d.scale), sc.s.data() + i, cols);
  });
}
// The value kernel rounds p s per block of kInt8ValueKeys keys from the first key of its call
// (decode_rows.h), so an item of several runs (pages, a ring's wrap) goes block by block from
// the item's first key, as the contiguous cache's one call does, and decodes to its bits: a
// block within one run is read in place, one that spans runs is gathered (rows and scales) into
// scratch. Run by run, blocks started at each page: 1e-5 apart at 256-position pages (items do
// not start on multiples of 128 keys), 6e-4 at 7-position pages (D = 128). A run's whole blocks go
// in one call (`qkv bench decode --cache-len 32768 --dtype int8`, 2 threads, Zen 4, loaded,
// three alternating rounds): 256-position pages 3.8-3.9 ms, against 4.0-4.3 block by block and
// 3.4-4.4 run by run before; 16-position pages, gathered, 8.8-9.6 ms against 11.8-16.9 run by run.
void values_int8(const DecodeCall& d, const KVCache& cache, const Item& it, Scratch& sc, float* o) {
  const int64_t rows = d.group * d.lq, cols = it.c1 - it.c0;
  std::fill(o, o + rows * d.dv, 0.0f);
  for (int64_t j0 = 0; j0 < cols;) {  // j0: a block's first key
    // Keys [j0, j1): the whole blocks the run at j0 holds (to the item's end where the run
    // reaches it: one call for a contiguous cache) read in place; none: the block spans runs.
    const int64_t run = cache.run_end(it.b, it.c0 + j0) - it.c0;
    int64_t j1 = run >= cols ? cols : j0 + (run - j0) / kInt8ValueKeys * kInt8ValueKeys;
    if (j1 == j0) j1 = std::min(cols, j0 + kInt8ValueKeys);
    const Item part{it.b, it.hk, it.c0 + j0, it.c0 + j1, it.slot};  // in place, or the block gathered
    const int8_t* v = cache_rows(cache, cache.values(), part, sc.v8);
    const bfloat16* s = cache_rows(cache, cache.value_scales(), part, sc.v8_scales);
    const int64_t next = j1 < cols ? cache.row(it.b, it.hk, it.c0 + j1) : -1;
    int8_values(sc.s.data() + j0, cols, rows, v, s, j1 - j0, d.dv, next_row<int8_t>(cache.values(), next), o);
    j0 = j1;
  }
}

// float32, bf16 and f16 caches (decode_rows.h), at every matmul_precision: S = scale Q K^T and
// O = P V on the rows in place, run by run, 16-bit rows widened exactly in registers (T: float,
// bfloat16 or float16).
// "medium" ran bf16 GEMMs (q and P rounded) until they measured 1.7-2.0x slower than this on
// Zen 4 (docs/decode_performance.md): the step is memory-bound, and this reads the same bytes, exactly.
template <class T>
void scores_in_place(const DecodeCall& d, const float* qrows, const KVCache& cache, const Item& it, Scratch& sc) {
  const int64_t rows = d.group * d.lq, cols = it.c1 - it.c0;
  for_each_run(cache, it, [&](int64_t i, int64_t len, int64_t first, int64_t next) {
    half_scores(qrows, rows, cache.keys().data<T>() + first * d.dk, len, d.dk, next_row<T>(cache.keys(), next),
                static_cast<float>(d.scale), sc.s.data() + i, cols);
  });
}
template <class T>
void values_in_place(const DecodeCall& d, const KVCache& cache, const Item& it, Scratch& sc, float* o) {
  const int64_t rows = d.group * d.lq, cols = it.c1 - it.c0;
  std::fill(o, o + rows * d.dv, 0.0f);
  for_each_run(cache, it, [&](int64_t i, int64_t len, int64_t first, int64_t next) {
    half_values(sc.s.data() + i, cols, rows, cache.values().data<T>() + first * d.dv, len, d.dv,
                next_row<T>(cache.values(), next), o);
  });
}

void run_item(const DecodeCall& d, const float* q, const KVCache& cache, const DecodeOptions& o, const Item& it,
              Partials& out, Scratch& sc) {
  const int64_t rows = d.group * d.lq, cols = it.c1 - it.c0;
  float* m = out.m.data() + it.slot * rows;
  float* l = out.l.data() + it.slot * rows;
  float* o_part = out.o.data() + it.slot * rows * d.dv;  // [G Lq, Dv]
  if (cols == 0) {  // a sequence without keys (length 0): no row to read, and a paged one has no page yet
    std::fill(m, m + rows, kNegInf), std::fill(l, l + rows, 0.0f), std::fill(o_part, o_part + rows * d.dv, 0.0f);
    return;
  }
  const float* qrows = q + (it.b * d.hq + it.hk * d.group) * d.lq * d.dk;  // [G Lq, D]
  const DType dtype = cache.config().dtype;
  sc.s.resize(static_cast<size_t>(rows * cols));
  sc.keyless.resize(static_cast<size_t>(rows));
  if (dtype == DType::i8) {
    scores_int8(d, qrows, cache, it, sc);
  } else if (dtype == DType::bf16) {
    scores_in_place<bfloat16>(d, qrows, cache, it, sc);
  } else if (dtype == DType::f16) {
    scores_in_place<float16>(d, qrows, cache, it, sc);
  } else {
    scores_in_place<float>(d, qrows, cache, it, sc);
  }
  const int64_t length = cache.length(it.b);
  for (int64_t r = 0; r < rows; ++r) {
    float* s = sc.s.data() + r * cols;  // [C]
    const KeyRange keys = decode_keys(d, o.causal, length, r % d.lq);
    // c tanh(s / c) on Highway (within 4 ulp), where std::tanh per score was scalar libm
    if (o.softcap > 0.0) kernels::softcap_row(s, cols, static_cast<float>(o.softcap), nullptr);
    const int64_t lo = std::clamp(keys.first - it.c0, int64_t{0}, cols), hi = std::clamp(keys.last - it.c0, lo, cols);
    sc.keyless[static_cast<size_t>(r)] = lo == hi;
    std::fill(s, s + lo, kNegInf);
    std::fill(s + hi, s + cols, kNegInf);
    m[r] = lo < hi ? kernels::max_value(s + lo, hi - lo) : kNegInf;
    if (m[r] == kNegInf) {
      std::fill(s, s + cols, 0.0f);
      l[r] = 0.0f;
    } else {
      l[r] = kernels::exp_shift_sum_fast(s, cols, m[r]);  // exp(-inf) = 0 outside the range
    }
  }
  if (dtype == DType::i8) {
    values_int8(d, cache, it, sc, o_part);
  } else if (dtype == DType::bf16) {
    values_in_place<bfloat16>(d, cache, it, sc, o_part);
  } else if (dtype == DType::f16) {
    values_in_place<float16>(d, cache, it, sc, o_part);
  } else {
    values_in_place<float>(d, cache, it, sc, o_part);
  }
  // A row with no key in this item takes no value from it: its P row of zeros times a NaN or inf
  // value made O_c NaN, which the merge's weight 0 kept (0 NaN): a row that never attends that key
  // came out NaN, and a row without keys too (docs/decode.md: 0). Keys outside a row's range in an
  // item where it has others: docs/decode.md, "Decode attention".
  for (int64_t r = 0; r < rows; ++r) {
    if (sc.keyless[static_cast<size_t>(r)]) std::fill(o_part + r * d.dv, o_part + (r + 1) * d.dv, 0.0f);
  }
}

// out [B, Hq, Lq, Dv] and lse [B, Hq, Lq] from the partials of each (b, hk)'s chunks, merged by
// merge_row (lse_merge.h, the fused forward's key parts' merge too): a NaN row is NaN; a row
// with no key (M = -inf) gets sum_c 0 O_c = 0, its O_c being 0 in every item (run_item).
void merge(const DecodeCall& d, const std::vector<Item>& items, const Partials& p, float* out, float* lse) {
  const int64_t rows = d.group * d.lq;
  std::vector<double> acc(static_cast<size_t>(d.dv));
  size_t first = 0;
  while (first < items.size()) {  // items of one (b, hk) are adjacent
    size_t last = first;
    while (last < items.size() && items[last].b == items[first].b && items[last].hk == items[first].hk) ++last;
    for (int64_t r = 0; r < rows; ++r) {
      const auto part = [&](size_t c) {
        const int64_t at = items[first + c].slot * rows + r;
        return RowPart<float>{p.m[at], p.l[at], p.o.data() + at * d.dv};
      };
      const MergedRow m = merge_row(last - first, part, d.dv, acc.data());
      const int64_t row = (items[first].b * d.hq + items[first].hk * d.group) * d.lq + r;  // in [B, Hq, Lq]
      const double total = m.sum > 0 ? m.sum : 1.0;  // NaN: acc is NaN already; 0: no key, acc = sum_c 0 O_c
      for (int64_t c = 0; c < d.dv; ++c) out[row * d.dv + c] = static_cast<float>(acc[c] / total);
      if (lse) lse[row] = static_cast<float>(m.nan ? m.sum : m.max + std::log(m.sum));  // -inf + log 0: -inf
    }
    first = last;
  }
}

}  // namespace

KeyRange decode_keys(const DecodeCall& d, bool causal, int64_t length, int64_t t) {
  const int64_t position = length - d.lq + t;  // of query t
  KeyRange r{0, causal ? std::min(length, position + 1) : length};
  // position - window + 1, without its overflow (a window near INT64_MAX on a cache without one, position < 0)
  if (d.window > 0) r.first = position >= d.window ? position - d.window + 1 : 0;
  r.last = std::max(r.last, r.first);
  return r;
}

AttentionResult decode_attention_cpu(const DecodeCall& d, const Tensor& q, const KVCache& cache,
                                     const DecodeOptions& o) {
  Tensor qf = q.to(DType::f32).contiguous();  // [B, Hq, Lq, D]
  if (cache.config().rotary) qf = rotate_queries(qf, cache, false);
  const std::vector<Item> items = make_items(d, cache, o);
  Partials p;
  p.rows = d.group * d.lq, p.dv = d.dv;
  p.m.resize(items.size() * p.rows), p.l.resize(items.size() * p.rows), p.o.resize(items.size() * p.rows * d.dv);
  std::atomic<int64_t> next{0};
  const auto n = static_cast<int64_t>(items.size());
  parallel_for(0, std::min<int64_t>(get_num_threads(), n), 1, [&](int64_t, int64_t) {
    Scratch sc;
    for (int64_t x = next++; x < n && !interrupt_requested(); x = next++) {
      run_item(d, qf.data<float>(), cache, o, items[static_cast<size_t>(x)], p, sc);
    }
  });
  check_interrupt("decode_attention");
  Tensor out = Tensor::empty({d.b, d.hq, d.lq, d.dv}, DType::f32);  // [B, Hq, Lq, Dv]
  std::optional<Tensor> lse;
  if (o.return_logsumexp) lse = Tensor::empty({d.b, d.hq, d.lq}, DType::f32);
  merge(d, items, p, out.data<float>(), lse ? lse->data<float>() : nullptr);
  AttentionResult r;
  r.output = q.dtype() == DType::f64 ? out.to(DType::f64) : out;
  r.logsumexp = lse;
  return r;
}

}  // namespace qkv::attention
