// Generation: a key/value cache and attention of a few new queries against it (issue 17).
//
// qkv::KVCache holds K [B, Hk, capacity, D] and V [B, Hk, capacity, Dv], allocated once, in
// f32, bf16 or f16, with one length per sequence (ragged batches: sequence b's keys are
// positions [0, length(b))). append(k, v) writes each sequence's new positions after its
// current length, without reallocating (ValueError past the capacity). Two other layouts
// (KVCacheConfig): a sliding-window ring that keeps each sequence's last `window` positions, and
// a paged pool with a block table per sequence (vLLM-style); rotary settings make append rotate
// keys and decode_attention rotate queries at their absolute positions (docs/decode.md).
//
// qkv::decode_attention(q, cache) is attention for the last Lq positions of each sequence
// (Lq = 1 when decoding token by token, a few for speculative decoding; the new keys and
// values must have been appended first): q [B, Hq, Lq, D], Hq a multiple of Hk (GQA/MQA: query
// head h reads cache head h / (Hq / Hk), by index, never copied); query t of sequence b is at
// position p = length(b) - Lq + t and attends keys j <= p (causal, the default) — with a
// window W > 0 (DecodeOptions::window, else the cache's KVCacheConfig::window), only the W keys
// p - W < j <= p (ONNX Runtime 1.32 GroupQueryAttention's local_window_size = W, checked by
// tests/attention/decode_ort_test.cc) — scores scale q.k (1/sqrt(D) by default), softcap c > 0:
// c tanh(s / c). Rows with no key (length(b) < Lq - t) give 0. A cache with rotary settings
// rotates q at the positions p.
//
// The kernel (src/attention/decode_cpu.cc) splits every sequence's keys into chunks: work
// items are (sequence, cache head, chunk), so that B·Hk smaller than the thread count still
// keeps every thread busy (split-KV, as llama.cpp and FlashDecoding do); each item computes the
// Hq / Hk query heads of its cache head together (one qkv::gemm for scores, one for P V), and
// the partial outputs are merged by their logsumexp. Only keys [0, length(b)) are read: ragged
// batches do no padding work. decode_attention_reference (float64 loops) is its oracle.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/rotary.h"
#include "qkv/tensor.h"

namespace qkv {

// Rotary position embeddings fused into the cache (qkv/rotary.h's settings; docs/decode.md):
// append rotates each new key at its absolute position length(b) + t before storing it (as ONNX
// Runtime's GroupQueryAttention and llama.cpp store them), decode_attention rotates q at its
// positions length(b) - Lq + t. Keys and queries are passed unrotated.
struct CacheRotary {
  double base = 10000.0;
  RotaryLayout layout = RotaryLayout::neox;  // neox: (x[i], x[i + rd/2]); gptj: (x[2i], x[2i+1])
  int64_t rotary_dim = 0;                    // even, <= head_dim; 0: head_dim
};

struct KVCacheConfig {
  int64_t batch = 1;
  int64_t kv_heads = 1;
  int64_t head_dim = 0;
  int64_t capacity = 0;      // positions per sequence (a windowed cache: slots of its ring)
  int64_t value_dim = 0;     // 0: head_dim
  DType dtype = DType::f32;  // f32, bf16, f16, or i8 (quantized: below)
  // > 0: sliding-window eviction: only the last `window` positions of each sequence are kept,
  // in a ring of `capacity` >= window slots (position p in slot p % capacity: appends never
  // shift or reallocate, lengths count absolute positions, without a capacity limit), and
  // decode_attention attends the last `window` keys up to each query, itself included (ONNX
  // Runtime 1.32's local_window_size = window, by its outputs). Lq > 1 queries need capacity >= window + Lq - 1.
  int64_t window = 0;
  // > 0: paged (vLLM-style): K and V live in a pool of `pages` pages of page_size positions,
  // [pages, Hk, page_size, D], and each sequence has a block table (its pages in order); append
  // takes pages from the pool as sequences grow (ValueError when it is exhausted), set_length /
  // reset give them back. capacity stays the per-sequence limit; with a `window`, capacity is the
  // positions kept, and the pages a window leaves behind go back to the pool (and leave the block table).
  int64_t page_size = 0;
  int64_t pages = 0;  // paged: the pool; 0: enough for every sequence at capacity (> 0 needs page_size)
  std::optional<CacheRotary> rotary = std::nullopt;
};

class KVCache {
 public:
  // ValueError / DTypeError for bad sizes or dtypes; OutOfMemoryError (Python: MemoryError) naming
  // KVCache, the storage or bookkeeping and its bytes for a cache past the allocation limit (qkv/size.h).
  explicit KVCache(const KVCacheConfig& config);

  // Writes k [B, Hk, T, D] and v [B, Hk, T, Dv] (any float dtype, converted to the cache's)
  // after each sequence's length; `counts` (B values in [0, T]) appends only the first
  // counts[b] positions of sequence b (ragged steps). ShapeError / ValueError naming
  // "KVCache.append" and the shapes; nothing is written when a check fails.
  void append(const Tensor& k, const Tensor& v, const std::vector<int64_t>& counts = {});

  const std::vector<int64_t>& lengths() const { return lengths_; }
  int64_t length(int64_t b) const {  // IndexError naming KVCache.length unless 0 <= b < batch
    check_sequence(b, "KVCache.length");
    return lengths_[static_cast<size_t>(b)];
  }
  // Sets sequence b's length (<= capacity): truncation, or keys written by hand.
  void set_length(int64_t b, int64_t length);
  void reset();  // every length 0

  const KVCacheConfig& config() const { return config_; }
  int64_t value_dim() const { return config_.value_dim; }
  // The storage: [B, Hk, capacity, D] / [.., Dv] (positions past a sequence's length are stale;
  // windowed: position p in slot p % capacity), paged [pages, Hk, page_size, D]. Viewed as rows
  // [-1, D], head hk of sequence b's position p is row(b, hk, p); positions p .. run_end(b, p) - 1
  // sit in consecutive rows (up to a page's end or the ring's wrap). The scales below likewise.
  const Tensor& keys() const { return k_; }
  const Tensor& values() const { return v_; }
  int64_t row(int64_t b, int64_t hk, int64_t position) const;
  int64_t run_end(int64_t b, int64_t position) const;
  // The first position of sequence b still stored (> 0 once a window evicted older ones; a
  // windowed cache's set_length going back keeps it: the positions after the new length are gone).
  int64_t first_kept(int64_t b) const;
  // Sequence b's stored keys and values in position order, [Hk, n, D] / [Hk, n, Dv] in the cache's
  // dtype (positions first_kept(b) .. length(b) - 1), copies.
  Tensor sequence_keys(int64_t b) const;
  Tensor sequence_values(int64_t b) const;
  // Paged caches: sequence b's pages in order from block first_block(b) (entry i holds positions
  // [(first_block(b) + i) page_size, + page_size)), and the pages left in the pool. A window's
  // evicted pages leave the table (first_block(b) grows: the table stays ~capacity / page_size + 1 long).
  const std::vector<int64_t>& block_table(int64_t b) const;
  int64_t first_block(int64_t b) const;
  int64_t free_pages() const { return static_cast<int64_t>(free_.size()); }

  // int8 caches (dtype i8): each key is stored as round((k - c) / (r s_k)) with c and r per
  // (sequence, head) and channel — the mean and the RMS deviation over the keys of the
  // sequence's first append (LLM keys have outlier channels with large, steady means and
  // spreads; taking the mean out is SageAttention's smoothing, dividing by r evens the
  // channels so that one scale fits them all) — and s_k = max|(k - c) / r| / 127 per position
  // and group of kInt8Group channels (channels [16 g, 16 g + 16); the last group may be
  // shorter); each value as round(v / s_v), s_v = max|v| / 127 per position and group. The
  // scales are bfloat16, to nearest (the values are rounded with the stored scale).
  // decode_attention reads k = q s_k r + c, v = q s_v.
  static constexpr int64_t kInt8Group = 16;
  // [B, Hk, capacity, ceil(D / 16)] bf16 (i8 caches; paged: [pages, Hk, page_size, ..])
  const Tensor& key_scales() const { return k_scale_; }
  const Tensor& value_scales() const { return v_scale_; }  // [B, Hk, capacity, ceil(Dv / 16)] bf16 (i8 caches)
  const Tensor& key_offsets() const { return k_offset_; }  // [B, Hk, D] f32: c (i8 caches)
  const Tensor& key_spreads() const { return k_spread_; }  // [B, Hk, D] f32: r (i8 caches)
  // The cached keys / values as float32 [B, Hk, capacity, D] (dequantized for i8 caches).
  Tensor keys_f32() const;
  Tensor values_f32() const;

  // Save / load (e.g. through qkv::io::save as safetensors): "keys", "values" [B, Hk, n, D] with
  // sequence b's stored positions first_kept(b) .. length(b) - 1 from index 0 (n the most any
  // sequence stores), "lengths" int64 [B], "capacity" int64 [1], "window", "page_size", "pages"
  // int64 [1] (absent: 0), "first_kept" int64 [B] (windowed caches), the rotary settings ("rotary" f64 [base, layout (0
  // neox, 1 gptj), rotary_dim]) when set, and for int8 caches "key_scales", "value_scales" ([B, Hk, n,
  // groups], same prefix; a state of the per-position format, [B, Hk, n], loads with that scale
  // in every group), "key_offsets", "key_spreads". The layout does not matter to the file (a paged cache's pages
  // are taken afresh). from_state restores an equal cache, and refuses (ValueError / ShapeError naming
  // the entry, its value and the geometry) a state no cache writes: a first_kept on a cache without a window
  // or outside a ring's [max(0, n - capacity), max(0, n - window)], a rotary layout not 0 or 1, int8
  // offsets not finite or spreads not > 0, a pool too small for the sequences (docs/decode.md).
  std::map<std::string, Tensor> state() const;
  static KVCache from_state(const std::map<std::string, Tensor>& state);

  // Threads (docs/decode.md, "Threads"): one cache may be used from several threads. append,
  // set_length and reset hold the cache's lock exclusively; decode_attention,
  // decode_attention_reference, state, sequence_keys and sequence_values share it, so each sees
  // one state (a paged cache's block tables and pages, the lengths) whole. The accessors that
  // return references or single values (lengths, length, block_table, keys, ...) take no lock:
  // while another thread may write, read them under read_lock(). Never call a locking method
  // while holding it (a waiting writer may block it).
  std::shared_lock<std::shared_mutex> read_lock() const;

 private:
  KVCache(const KVCacheConfig& config, const char* op);  // errors name `op` (from_state: KVCache.from_state)
  void check_sizes(int64_t slots, int64_t span) const;   // OutOfMemoryError before any allocation
  KVCacheConfig config_;
  // Writes [Hk, n, D] rows already in the storage dtype (and int8 scales [Hk, n]) at positions
  // at .. at + n - 1 of sequence b, run by run; pages must have been reserved.
  void write_rows(int64_t b, int64_t at, const Tensor& k, const Tensor& v, const Tensor* ks, const Tensor* vs);
  void append_int8(int64_t b, int64_t at, const Tensor& k, const Tensor& v);  // [Hk, n, D] each
  int64_t pages_for(int64_t first, int64_t length) const;  // paged: pages positions [first, length) span
  int64_t held_pages(int64_t b) const;
  void reserve_pages(int64_t b, int64_t length, int64_t first = 0);  // paged: pages for [first, length)
  void evict_pages(int64_t b, int64_t first);     // paged: pages wholly before `first` back to the pool
  void release_pages(int64_t b, int64_t length);  // paged: pages past those of [0, length) back
  Tensor gather(const Tensor& storage, int64_t b, const char* op) const;  // [Hk, kept, ...] of sequence b
  void check_sequence(int64_t b, const char* op) const;                   // IndexError unless 0 <= b < batch
  Tensor k_, v_;
  Tensor k_scale_, v_scale_, k_offset_, k_spread_;  // i8 caches only
  std::vector<int64_t> lengths_;
  std::vector<int64_t> kept_;                 // windowed: each sequence's first stored position
  std::vector<std::vector<int64_t>> blocks_;  // paged: block table per sequence, from block dropped_[b]
  std::vector<int64_t> dropped_;              // paged: each sequence's evicted leading blocks, out of its table
  std::vector<int64_t> free_;                 // paged: free pages (a stack)
  // Readers share `m`, writers hold it alone; a waiting writer holds `gate`, which new readers pass
  // first, so that readers in turn (decode steps from two threads) do not starve it (glibc's
  // shared_mutex prefers readers: the two-thread Python test took 20-34 s, not 2). A copied or
  // moved cache gets a lock of its own.
  struct Lock {
    std::shared_mutex m;
    std::mutex gate;
    Lock() = default;
    Lock(const Lock&) {}
    Lock& operator=(const Lock&) { return *this; }
  };
  std::unique_lock<std::shared_mutex> write_lock();
  mutable Lock lock_;
};

struct DecodeOptions {
  std::optional<double> scale;  // default 1/sqrt(D)
  bool causal = true;           // query t sees keys j <= its position (else every key of the sequence)
  int64_t window = 0;           // > 0: only the last `window` keys up to the position (<= a windowed cache's)
  double softcap = 0.0;         // > 0: scores c tanh(s / c)
  int64_t chunk = 0;            // keys per work item; 0: automatic (docs/decode.md)
  // Accepted for the API's sake and ignored: every cache dtype is read exactly (bf16/f16 rows
  // widened to float32 in registers). The step is memory-bound; "medium"'s bf16 GEMMs (q and P
  // rounded) read the same bytes and measured 1.7-2.0x slower on Zen 4 (docs/decode_performance.md).
  MatmulPrecision matmul_precision = MatmulPrecision::highest;
  bool return_logsumexp = false;
};

// Output [B, Hq, Lq, Dv] in q's dtype (f32 for 16-bit q); logsumexp [B, Hq, Lq] f32 when asked.
AttentionResult decode_attention(const Tensor& q, const KVCache& cache, const DecodeOptions& options = {});
// The oracle: float64 loops over each sequence's keys, one thread.
AttentionResult decode_attention_reference(const Tensor& q, const KVCache& cache, const DecodeOptions& options = {});

}  // namespace qkv
