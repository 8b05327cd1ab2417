// KVCache's layout (contiguous, windowed ring, paged), appends and pages, and decode_attention's
// checks and dispatch (qkv/kv_cache.h). int8 quantization: kv_cache_int8.cc; state: kv_cache_state.cc.
#include "qkv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <new>
#include <shared_mutex>
#include <string>
#include <vector>

#include "attention/decode_cpu.h"
#include "qkv/error.h"
#include "qkv/size.h"

namespace qkv {

namespace {

constexpr const char* kAppend = "KVCache.append";
constexpr const char* kDecode = "decode_attention";

void check_config(const KVCacheConfig& c, const char* op) {
  if (c.batch < 0 || c.kv_heads < 1 || c.head_dim < 1 || c.capacity < 0 || c.value_dim < 1) {
    fail<ValueError>(op, ": batch and capacity must be >= 0, kv_heads, head_dim and value_dim >= 1; got batch ",
                     c.batch, ", kv_heads ", c.kv_heads, ", head_dim ", c.head_dim, ", capacity ", c.capacity,
                     ", value_dim ", c.value_dim);
  }
  if (c.dtype != DType::f32 && c.dtype != DType::bf16 && c.dtype != DType::f16 && c.dtype != DType::i8) {
    fail<DTypeError>(op, ": dtype must be float32, bfloat16, float16 or int8, got ", dtype_name(c.dtype));
  }
  if (c.window < 0 || c.page_size < 0 || c.pages < 0 || (c.window > 0 && c.capacity < c.window)) {
    fail<ValueError>(op, ": window, page_size and pages must be >= 0 and capacity >= window; got window ", c.window,
                     ", page_size ", c.page_size, ", pages ", c.pages, ", capacity ", c.capacity);
  }
  if (c.pages > 0 && c.page_size == 0) {  // was ignored: a contiguous cache of batch x capacity positions
    fail<ValueError>(op, ": pages = ", c.pages, " needs page_size > 0 (a paged cache); got page_size 0");
  }
  if (c.rotary) {
    const int64_t rd = c.rotary->rotary_dim;
    // rotary_dim 0 rotates all head_dim features: an odd head_dim failed only at the first append
    if (rd < 0 || rd > c.head_dim || (rd == 0 ? c.head_dim : rd) % 2 != 0 || !(c.rotary->base > 0.0) ||
        !std::isfinite(c.rotary->base)) {
      fail<ValueError>(op, ": rotary_dim must be even and <= head_dim = ", c.head_dim, " (got ", rd,
                       rd == 0 ? ": all of head_dim" : "", "), the rotary base positive and finite (got ",
                       c.rotary->base, ")");
    }
  }
}

// a >= 0, b > 0; (a + b - 1) / b overflowed for a capacity or a ring's length near 2^63
int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// The rotary options of a cache for rows at positions [B, T] (qkv/rotary.h).
RotaryOptions rotary_at(const CacheRotary& r, std::vector<int64_t> positions, int64_t b, int64_t t) {
  RotaryOptions o;
  o.base = r.base, o.layout = r.layout, o.rotary_dim = r.rotary_dim;
  o.positions = Tensor::from_vector(positions, {b, t});
  return o;
}

}  // namespace

KVCache::KVCache(const KVCacheConfig& config) : KVCache(config, "KVCache") {}

KVCache::KVCache(const KVCacheConfig& config, const char* op) : config_(config) {
  if (config_.value_dim == 0) config_.value_dim = config_.head_dim;
  KVCacheConfig& c = config_;
  check_config(c, op);
  const AllocationScope scope(op);             // names the cache in out-of-memory errors (qkv/size.h)
  int64_t slots = c.batch, span = c.capacity;  // [slots, Hk, span, D]
  if (c.page_size > 0) {
    if (c.pages == 0) {
      // a window's `capacity` positions may straddle one page more
      const int64_t per = std::min(ceil_div(c.capacity, c.page_size), kMaxElements);  // + 1 below: no overflow
      const auto all = checked_mul(c.batch, per + (c.window > 0 ? 1 : 0));
      if (!all) fail<ValueError>(op, ": batch ", c.batch, " x capacity ", c.capacity, " is too large");
      c.pages = *all;
    }
    slots = c.pages, span = c.page_size;
  }
  check_sizes(slots, span);
  try {
    for (int64_t p = c.pages - 1; p >= 0; --p) free_.push_back(p);  // page 0 is taken first
    lengths_.assign(static_cast<size_t>(c.batch), 0);
    kept_.assign(static_cast<size_t>(c.batch), 0);
    blocks_.assign(static_cast<size_t>(c.batch), {});
    dropped_.assign(static_cast<size_t>(c.batch), 0);
  } catch (const std::bad_alloc&) {
    scope.fail_bad_alloc();
  }
  k_ = Tensor::zeros({slots, c.kv_heads, span, c.head_dim}, c.dtype);  // [B, Hk, capacity, D] or pages
  v_ = Tensor::zeros({slots, c.kv_heads, span, c.value_dim}, c.dtype);
  if (c.dtype == DType::i8) {
    // [B, Hk, capacity, groups] or [pages, Hk, page_size, groups]: one bfloat16 scale per kInt8Group channels
    k_scale_ = Tensor::zeros({slots, c.kv_heads, span, ceil_div(c.head_dim, kInt8Group)}, DType::bf16);
    v_scale_ = Tensor::zeros({slots, c.kv_heads, span, ceil_div(c.value_dim, kInt8Group)}, DType::bf16);
    k_offset_ = Tensor::zeros({c.batch, c.kv_heads, c.head_dim});  // [B, Hk, D]
    k_spread_ = Tensor::ones({c.batch, c.kv_heads, c.head_dim});
  }
}

// Every allocation of a cache of [slots, Hk, span, ...] storage checked before the first: the
// storage's (OutOfMemoryError naming the cache, the role, the shape and the bytes) and the
// per-sequence and page bookkeeping's (KVCache(2^40, 1, 8, 0) holds no key, and its lengths and
// block tables ended in a bare std::bad_alloc).
void KVCache::check_sizes(int64_t slots, int64_t span) const {
  const KVCacheConfig& c = config_;
  checked_alloc_bytes(Shape{slots, c.kv_heads, span, c.head_dim}, c.dtype, "keys");
  checked_alloc_bytes(Shape{slots, c.kv_heads, span, c.value_dim}, c.dtype, "values");
  if (c.dtype == DType::i8) {
    checked_alloc_bytes(Shape{slots, c.kv_heads, span, ceil_div(c.head_dim, kInt8Group)}, DType::bf16, "key scales");
    checked_alloc_bytes(Shape{slots, c.kv_heads, span, ceil_div(c.value_dim, kInt8Group)}, DType::bf16, "value scales");
    checked_alloc_bytes(Shape{c.batch, c.kv_heads, c.head_dim}, DType::f32, "key offsets");
  }
  // lengths_, kept_, dropped_ and an empty block table per sequence; a free list of `pages`
  constexpr int64_t kPerSequence = 3 * sizeof(int64_t) + sizeof(std::vector<int64_t>);
  const auto state = checked_mul(c.batch, kPerSequence), pool = checked_mul(c.pages, sizeof(int64_t));
  const std::string what = "per-sequence state of " + std::to_string(c.batch) + " sequences (" +
                           std::to_string(kPerSequence) + " bytes each)";
  if (!state) fail<OutOfMemoryError>(AllocationScope::describe("KVCache"), ": ", what, " overflows");
  check_alloc_bytes(static_cast<size_t>(*state), what, "KVCache");
  if (!pool)
    fail<OutOfMemoryError>(AllocationScope::describe("KVCache"), ": the free list of ", c.pages, " pages overflows");
  check_alloc_bytes(static_cast<size_t>(*pool), "the free list of " + std::to_string(c.pages) + " pages", "KVCache");
}

std::shared_lock<std::shared_mutex> KVCache::read_lock() const {
  { const std::lock_guard<std::mutex> gate(lock_.gate); }  // after a waiting writer
  return std::shared_lock<std::shared_mutex>(lock_.m);
}

std::unique_lock<std::shared_mutex> KVCache::write_lock() {
  const std::lock_guard<std::mutex> gate(lock_.gate);  // new readers wait behind this writer
  return std::unique_lock<std::shared_mutex>(lock_.m);
}

int64_t KVCache::row(int64_t b, int64_t hk, int64_t position) const {
  const KVCacheConfig& c = config_;
  if (c.page_size > 0) {
    const auto i = static_cast<size_t>(b);
    const int64_t page = blocks_[i][static_cast<size_t>(position / c.page_size - dropped_[i])];
    return (page * c.kv_heads + hk) * c.page_size + position % c.page_size;
  }
  return (b * c.kv_heads + hk) * c.capacity + (c.window > 0 ? position % c.capacity : position);
}

int64_t KVCache::run_end(int64_t, int64_t position) const {
  const KVCacheConfig& c = config_;
  const int64_t span = c.page_size > 0 ? c.page_size
                       : c.window > 0  ? c.capacity
                                       : 0,
                most = std::numeric_limits<int64_t>::max();
  if (span == 0) return most;
  const int64_t start = position - position % span;  // a ring's positions go up to 2^63 - 1: no overflow past it
  return start > most - span ? most : start + span;
}

void KVCache::check_sequence(int64_t b, const char* op) const {
  if (b < 0 || b >= config_.batch) fail<IndexError>(op, ": sequence ", b, " is outside [0, ", config_.batch, ")");
}

int64_t KVCache::first_kept(int64_t b) const {
  check_sequence(b, "KVCache.first_kept");
  return kept_[static_cast<size_t>(b)];
}

const std::vector<int64_t>& KVCache::block_table(int64_t b) const {
  check_sequence(b, "KVCache.block_table");
  return blocks_[static_cast<size_t>(b)];
}

int64_t KVCache::first_block(int64_t b) const {
  check_sequence(b, "KVCache.first_block");
  return dropped_[static_cast<size_t>(b)];
}

int64_t KVCache::pages_for(int64_t first, int64_t length) const {
  return first < length ? ceil_div(length, config_.page_size) - first / config_.page_size : 0;
}

int64_t KVCache::held_pages(int64_t b) const {
  const auto& blocks = block_table(b);
  return static_cast<int64_t>(std::count_if(blocks.begin(), blocks.end(), [](int64_t p) { return p >= 0; }));
}

// The block table holds pages from block dropped_[b] on: a window's evicted blocks leave it (they
// were entries -1, one per page_size positions a ring ever held: a table of 2^38 entries after
// set_length(b, 2^40) with pages of 4, std::bad_alloc or the machine's memory).
void KVCache::reserve_pages(int64_t b, int64_t length, int64_t first) {
  auto& blocks = blocks_[static_cast<size_t>(b)];
  int64_t& dropped = dropped_[static_cast<size_t>(b)];
  if (blocks.empty()) dropped = std::max(dropped, first / config_.page_size);  // evict_pages ran before
  while (dropped + static_cast<int64_t>(blocks.size()) < ceil_div(length, config_.page_size)) {
    blocks.push_back(free_.back());  // the caller checked that the pool has enough
    free_.pop_back();
  }
}

void KVCache::release_pages(int64_t b, int64_t length) {
  auto& blocks = blocks_[static_cast<size_t>(b)];
  const int64_t dropped = dropped_[static_cast<size_t>(b)];
  while (!blocks.empty() && dropped + static_cast<int64_t>(blocks.size()) - 1 >= ceil_div(length, config_.page_size)) {
    free_.push_back(blocks.back());
    blocks.pop_back();
  }
  if (length == 0) dropped_[static_cast<size_t>(b)] = 0;  // reset: a fresh sequence
}

void KVCache::evict_pages(int64_t b, int64_t first) {
  auto& blocks = blocks_[static_cast<size_t>(b)];
  int64_t& dropped = dropped_[static_cast<size_t>(b)];
  size_t gone = 0;  // the leading blocks wholly before `first`
  while (gone < blocks.size() && dropped + static_cast<int64_t>(gone) + 1 <= first / config_.page_size) {
    free_.push_back(blocks[gone++]);
  }
  blocks.erase(blocks.begin(), blocks.begin() + static_cast<std::ptrdiff_t>(gone));
  dropped += static_cast<int64_t>(gone);
}

void KVCache::write_rows(int64_t b, int64_t at, const Tensor& k, const Tensor& v, const Tensor* ks, const Tensor* vs) {
  const int64_t n = k.size(1);
  for (int64_t i = 0; i < n;) {  // run by run: [Hk, len, D] into consecutive rows of every head
    const int64_t p = at + i, len = std::min(n - i, run_end(b, p) - p);
    const int64_t first = row(b, 0, p), span = k_.size(2), slot = first / (k_.size(1) * span), off = first % span;
    k_.select(0, slot).slice(1, off, off + len).copy_from(k.slice(1, i, i + len));
    v_.select(0, slot).slice(1, off, off + len).copy_from(v.slice(1, i, i + len));
    if (ks) k_scale_.select(0, slot).slice(1, off, off + len).copy_from(ks->slice(1, i, i + len));
    if (vs) v_scale_.select(0, slot).slice(1, off, off + len).copy_from(vs->slice(1, i, i + len));
    i += len;
  }
}

void KVCache::append(const Tensor& k, const Tensor& v, const std::vector<int64_t>& counts) {
  const auto lock = write_lock();  // qkv/kv_cache.h, "Threads"
  const KVCacheConfig& c = config_;
  const bool shapes_ok = k.dim() == 4 && v.dim() == 4 && k.size(0) == c.batch && k.size(1) == c.kv_heads &&
                         k.size(3) == c.head_dim && v.size(0) == c.batch && v.size(1) == c.kv_heads &&
                         v.size(2) == k.size(2) && v.size(3) == c.value_dim;
  if (!shapes_ok) {
    fail<ShapeError>(kAppend, ": k must be [", c.batch, ", ", c.kv_heads, ", T, ", c.head_dim, "] and v [", c.batch,
                     ", ", c.kv_heads, ", T, ", c.value_dim, "], got k ", shape_str(k.shape()), ", v ",
                     shape_str(v.shape()));
  }
  if (!is_floating(k.dtype()) || !is_floating(v.dtype())) {
    fail<DTypeError>(kAppend, ": k and v must be floating point, got ", dtype_name(k.dtype()), " and ",
                     dtype_name(v.dtype()));
  }
  const int64_t t = k.size(2);
  if (!counts.empty() && static_cast<int64_t>(counts.size()) != c.batch) {
    fail<ValueError>(kAppend, ": counts must have one value per sequence (", c.batch, "), got ", counts.size());
  }
  int64_t new_pages = 0;
  std::vector<int64_t> kept_after(static_cast<size_t>(c.batch), 0);  // windowed: the first position kept
  for (int64_t b = 0; b < c.batch; ++b) {                            // every check before the first write
    const int64_t n = counts.empty() ? t : counts[static_cast<size_t>(b)], at = length(b);
    if (n < 0 || n > t) fail<ValueError>(kAppend, ": counts[", b, "] = ", n, " is outside [0, ", t, "]");
    if (n > std::numeric_limits<int64_t>::max() - at) {  // a windowed cache's lengths have no capacity limit
      fail<ValueError>(kAppend, ": sequence ", b, "'s length ", at, " + ", n, " new positions passes 2^63 - 1");
    }
    if (c.rotary && n > 0 && at > kMaxRotaryPosition - (n - 1)) {
      fail<ValueError>(kAppend, ": sequence ", b, "'s rotary positions ", at, " .. ", at + n - 1,
                       " pass 2^53 = ", kMaxRotaryPosition,
                       " (float64 holds every integer only up to 2^53; qkv/rotary.h)");
    }
    if (c.window == 0 && at + n > c.capacity) {
      fail<ValueError>(kAppend, ": sequence ", b, " would hold ", at + n, " positions, past the capacity ", c.capacity);
    }
    if (c.window > 0) kept_after[static_cast<size_t>(b)] = std::max(first_kept(b), at + n - c.capacity);
    if (c.page_size > 0) new_pages += pages_for(kept_after[static_cast<size_t>(b)], at + n) - held_pages(b);
  }
  if (new_pages > free_pages()) {
    fail<ValueError>(kAppend, ": the page pool is exhausted: this append needs ", new_pages, " more pages of ",
                     c.page_size, " positions, ", free_pages(), " of ", c.pages, " are free");
  }
  Tensor kr = k;  // [B, Hk, T, D], rotated at each sequence's positions
  if (c.rotary) {
    // [B, T]; rows past counts[b] are not stored: the last stored one's position, or 0 for a
    // sequence that stores none (its length may lie past the rotary limit: it is not checked then).
    std::vector<int64_t> positions;
    for (int64_t b = 0; b < c.batch; ++b) {
      const int64_t n = counts.empty() ? t : counts[static_cast<size_t>(b)];
      for (int64_t j = 0; j < t; ++j) positions.push_back(n == 0 ? 0 : length(b) + std::min(j, n - 1));
    }
    const Tensor wide = k.dtype() == DType::f64 ? k : k.to(DType::f32);  // rotated before any rounding
    kr = apply_rotary(wide, rotary_at(*c.rotary, positions, c.batch, t));
  }
  if (c.page_size > 0 && c.window > 0) {  // pages the windows leave go back first: they may serve this append
    for (int64_t b = 0; b < c.batch; ++b) evict_pages(b, kept_after[static_cast<size_t>(b)]);
  }
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t n = counts.empty() ? t : counts[static_cast<size_t>(b)], at = length(b);
    if (n == 0) continue;
    if (c.page_size > 0) reserve_pages(b, at + n, kept_after[static_cast<size_t>(b)]);
    // a ring keeps only its last `capacity` positions: earlier ones of this append are skipped
    const int64_t skip = c.window > 0 ? std::max<int64_t>(0, n - c.capacity) : 0;
    const Tensor kb = kr.select(0, b).slice(1, skip, n), vb = v.select(0, b).slice(1, skip, n);  // [Hk, n, D]
    if (c.dtype == DType::i8) {
      append_int8(b, at + skip, kb, vb);
    } else {  // the copy engine converts the dtype
      write_rows(b, at + skip, kb.to(c.dtype), vb.to(c.dtype), nullptr, nullptr);
    }
    lengths_[static_cast<size_t>(b)] = at + n;
    if (c.window > 0) kept_[static_cast<size_t>(b)] = kept_after[static_cast<size_t>(b)];
  }
}

void KVCache::set_length(int64_t b, int64_t length) {
  const auto lock = write_lock();
  const KVCacheConfig& c = config_;
  const int64_t old = b >= 0 && b < c.batch ? this->length(b) : 0;
  const bool limit_ok = c.window > 0 || length <= c.capacity;
  if (b < 0 || b >= c.batch || length < 0 || !limit_ok) {
    fail<ValueError>("KVCache.set_length: sequence ", b, " of ", c.batch, ", length ", length, " outside [0, ",
                     c.capacity, "]");
  }
  // a ring cannot go back past the positions it evicted: the window before `length` must be stored
  const int64_t kept = c.window > 0 && b >= 0 && b < c.batch ? first_kept(b) : 0;
  if (c.window > 0 && length < old && std::max<int64_t>(0, length - c.window) < kept) {
    fail<ValueError>("KVCache.set_length: sequence ", b, " cannot go back to ", length, ": positions before ", kept,
                     " were evicted (window ", c.window, ")");
  }
  const int64_t kept_now = c.window > 0 ? std::max(kept, length - c.capacity) : 0;
  if (c.page_size > 0) {
    const int64_t more = pages_for(kept_now, length) - held_pages(b);
    if (more > free_pages()) {
      fail<ValueError>("KVCache.set_length: the page pool is exhausted: ", more, " more pages needed, ", free_pages(),
                       " free");
    }
    release_pages(b, length);
    evict_pages(b, kept_now);
    reserve_pages(b, length, kept_now);
  }
  lengths_[static_cast<size_t>(b)] = length;
  kept_[static_cast<size_t>(b)] = kept_now;
}

void KVCache::reset() {
  const auto lock = write_lock();
  for (int64_t b = 0; b < config_.batch; ++b) {
    if (config_.page_size > 0) release_pages(b, 0);
    lengths_[static_cast<size_t>(b)] = 0;
    kept_[static_cast<size_t>(b)] = 0;
  }
}

namespace attention {

DecodeCall check_decode(const Tensor& q, const KVCache& cache, const DecodeOptions& o, const char* op) {
  const KVCacheConfig& c = cache.config();
  if (q.dim() != 4 || q.size(0) != c.batch || q.size(3) != c.head_dim || q.size(1) % c.kv_heads != 0 ||
      q.size(1) == 0) {
    fail<ShapeError>(op, ": q must be [", c.batch, ", Hq, Lq, ", c.head_dim, "] with Hq a multiple of the cache's ",
                     c.kv_heads, " heads, got ", shape_str(q.shape()));
  }
  if (!is_floating(q.dtype())) fail<DTypeError>(op, ": q must be floating point, got ", dtype_name(q.dtype()));
  if (o.window < 0 || o.chunk < 0 || !(o.softcap >= 0.0) || !std::isfinite(o.softcap) ||
      (o.scale && !std::isfinite(*o.scale))) {
    fail<ValueError>(op, ": window and chunk must be >= 0, softcap and scale finite (softcap >= 0)");
  }
  for (int64_t b = 0; c.rotary && b < c.batch; ++b) {  // only a windowed cache's set_length gets so far
    if (cache.length(b) - 1 > kMaxRotaryPosition) {
      fail<ValueError>(op, ": sequence ", b, "'s queries reach position ", cache.length(b) - 1,
                       ", past the rotary limit 2^53 = ", kMaxRotaryPosition, " (qkv/rotary.h)");
    }
  }
  DecodeCall d;
  d.b = c.batch, d.hq = q.size(1), d.hk = c.kv_heads, d.lq = q.size(2), d.dk = c.head_dim, d.dv = c.value_dim;
  d.group = d.hq / d.hk;
  d.scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(d.dk)));
  d.window = o.window;
  if (c.window > 0) {  // the cache's window, or a narrower one; its keys must all be stored
    if (o.window > c.window) {
      fail<ValueError>(op, ": window ", o.window, " is wider than the cache's window ", c.window,
                       " (older keys are evicted)");
    }
    d.window = o.window > 0 ? o.window : c.window;
    if (d.window + d.lq - 1 > c.capacity) {
      fail<ValueError>(op, ": ", d.lq, " queries with a window of ", d.window, " need a cache capacity of at least ",
                       d.window + d.lq - 1, ", the cache has ", c.capacity);
    }
    for (int64_t b = 0; b < c.batch; ++b) {  // after set_length went back, fewer keys may be stored
      const int64_t first = std::max<int64_t>(0, cache.length(b) - d.lq - d.window + 1);
      if (first < cache.first_kept(b)) {
        fail<ValueError>(op, ": sequence ", b, "'s queries need keys from position ", first,
                         ", the cache keeps them from ", cache.first_kept(b));
      }
    }
  }
  return d;
}

Tensor rotate_queries(const Tensor& q, const KVCache& cache, bool reference) {
  const int64_t b = q.size(0), lq = q.size(2);
  std::vector<int64_t> positions;  // [B, Lq]: query t of sequence s at length(s) - Lq + t
  for (int64_t s = 0; s < b; ++s) {
    for (int64_t t = 0; t < lq; ++t) positions.push_back(cache.length(s) - lq + t);
  }
  const RotaryOptions o = rotary_at(*cache.config().rotary, positions, b, lq);
  return reference ? apply_rotary_reference(q, o) : apply_rotary(q, o);
}

}  // namespace attention

AttentionResult decode_attention(const Tensor& q, const KVCache& cache, const DecodeOptions& options) {
  const auto lock = cache.read_lock();  // one state of the cache throughout (qkv/kv_cache.h, "Threads")
  const attention::DecodeCall d = attention::check_decode(q, cache, options, kDecode);
  if (!q.device().is_cpu()) fail_no_kernel(kDecode, q.device());
  return attention::decode_attention_cpu(d, q, cache, options);
}

}  // namespace qkv
