// KVCache::state / from_state (qkv/kv_cache.h): a cache as named tensors, and back; the same
// file for every layout (contiguous, windowed ring, paged): each sequence's stored positions in
// order from index 0.
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <vector>

#include "qkv/error.h"
#include "qkv/kv_cache.h"

namespace qkv {

namespace {

constexpr const char* kOp = "KVCache.from_state";

const Tensor& need(const std::map<std::string, Tensor>& s, const std::string& name) {
  const auto it = s.find(name);
  if (it == s.end()) fail<ValueError>(kOp, ": the state has no '", name, "'");
  return it->second;
}

// The integers of a 1-D integer tensor: state() writes int64; a float 3.5 was read as 3, a [1, 2] as [2].
std::vector<int64_t> integers(const Tensor& t, const std::string& name) {
  if ((t.dtype() != DType::i32 && t.dtype() != DType::i64) || t.dim() != 1) {
    fail<ValueError>(kOp, ": '", name, "' must be 1-D int32 or int64, got ", dtype_name(t.dtype()), " ",
                     shape_str(t.shape()));
  }
  return t.to_vector<int64_t>();
}

int64_t scalar_or_zero(const std::map<std::string, Tensor>& s, const std::string& name) {
  const auto it = s.find(name);
  if (it == s.end()) return 0;
  const auto v = integers(it->second, name);
  if (v.size() != 1) fail<ShapeError>(kOp, ": '", name, "' must hold one value, got ", v.size());
  return v[0];
}

// An int8 state's scales as [B, Hk, n, groups]: the per-position format of states saved before
// group scales (one scale per position, [B, Hk, n]) gives every group that scale, which
// dequantizes to the same values. float32 scales (files written before bfloat16 scales) are
// rounded to bfloat16: such a cache decodes within 2^-9 of each group's values of before.
// Their [B, Hk, n] must be the keys' (copy_from would broadcast a scale of one head to all).
// A floating-point entry (state() writes bfloat16 scales, float32 offsets and spreads, a float64
// rotary entry): integer scales were converted as they were (an int8 scale of 1 for 0.0079).
const Tensor& floating(const std::map<std::string, Tensor>& s, const std::string& name) {
  const Tensor& t = need(s, name);
  if (!is_floating(t.dtype())) {
    fail<DTypeError>(kOp, ": '", name, "' must be floating point, got ", dtype_name(t.dtype()), " ",
                     shape_str(t.shape()));
  }
  return t;
}

Tensor int8_scales(const std::map<std::string, Tensor>& s, const std::string& name, const Tensor& keys,
                   int64_t groups) {
  const Tensor t = floating(s, name).to(DType::bf16);  // float32 in files written before bfloat16 scales
  const bool rows = (t.dim() == 3 || t.dim() == 4) && t.size(0) == keys.size(0) && t.size(1) == keys.size(1) &&
                    t.size(2) == keys.size(2);
  if (rows && t.dim() == 3) return t.unsqueeze(3).expand({t.size(0), t.size(1), t.size(2), groups});
  if (!rows || t.dim() != 4 || t.size(3) != groups) {
    fail<ShapeError>(kOp, ": '", name, "' must be [B, Hk, n, ", groups, "] (or [B, Hk, n]), got ",
                     shape_str(t.shape()));
  }
  return t;
}

// The "rotary" entry [base, layout (0 neox, 1 gptj), rotary_dim], if any (the base is checked by KVCache).
std::optional<CacheRotary> rotary_of(const std::map<std::string, Tensor>& s) {
  if (!s.count("rotary")) return std::nullopt;
  const Tensor& t = floating(s, "rotary");
  if (t.dim() != 1 || t.size(0) != 3) {  // a [1, 3] was read as its 3 values
    fail<ShapeError>(kOp, ": 'rotary' must be 1-D [base, layout, rotary_dim], got ", shape_str(t.shape()));
  }
  const auto r = t.to_vector<double>();
  if (!(std::abs(r[2]) < 1e15) || r[2] != std::floor(r[2])) {  // the cast of 1e30 or NaN is undefined
    fail<ValueError>(kOp, ": 'rotary' rotary_dim must be an integer, got ", r[2]);
  }
  if (r[1] != 0.0 && r[1] != 1.0) {  // 2 or NaN read as gptj
    fail<ValueError>(kOp, ": 'rotary' layout must be 0 (neox) or 1 (gptj), got ", r[1]);
  }
  return CacheRotary{r[0], r[1] == 1.0 ? RotaryLayout::gptj : RotaryLayout::neox, static_cast<int64_t>(r[2])};
}

// Each sequence's first stored position, which the keys' index 0 holds (the lengths checked first). A cache without a
// window stores every position from 0 ("first_kept" absent, or zeros). A window's ring keeps at most its `capacity`
// last positions and never less than the window before the length (set_length refuses to go back past an evicted
// window): max(0, n - capacity) <= first_kept <= max(0, n - window), the lower bound when "first_kept" is absent. Any
// other value placed the file's keys at positions they were not written for (a cache without a window read from 0 keys
// stored from first_kept).
std::vector<int64_t> stored_from(const std::map<std::string, Tensor>& s, const KVCacheConfig& c,
                                 const std::vector<int64_t>& lengths) {
  for (size_t b = 0; b < lengths.size(); ++b) {
    if (c.window > 0 && lengths[b] < 0) {  // a ring's lengths have no capacity limit
      fail<ValueError>(kOp, ": lengths[", b, "] = ", lengths[b], " must be >= 0 (window ", c.window, ")");
    }
    if (c.window == 0 && (lengths[b] < 0 || lengths[b] > c.capacity)) {
      fail<ValueError>(kOp, ": lengths[", b, "] = ", lengths[b], " is outside [0, ", c.capacity, "] (capacity)");
    }
  }
  std::vector<int64_t> first(lengths.size(), 0);
  for (size_t b = 0; b < lengths.size(); ++b)
    first[b] = c.window > 0 ? std::max<int64_t>(0, lengths[b] - c.capacity) : 0;
  const auto it = s.find("first_kept");
  if (it == s.end()) return first;
  const auto kept = integers(it->second, "first_kept");
  if (kept.size() != lengths.size()) {
    fail<ShapeError>(kOp, ": 'first_kept' must hold one position per sequence (", lengths.size(), "), got ",
                     kept.size());
  }
  for (size_t b = 0; b < kept.size(); ++b) {
    const int64_t n = lengths[b], most = c.window > 0 ? std::max<int64_t>(0, n - c.window) : 0;
    if (c.window == 0 && kept[b] != 0) {
      fail<ValueError>(kOp, ": first_kept[", b, "] = ", kept[b], " for a cache without a window (window 0, capacity ",
                       c.capacity, ", lengths[", b, "] = ", n, "), which stores every position from 0");
    }
    if (kept[b] < first[b] || kept[b] > most) {
      fail<ValueError>(kOp, ": first_kept[", b, "] = ", kept[b], " is outside [", first[b], ", ", most,
                       "] for lengths[", b, "] = ", n, ", window ", c.window, " and capacity ", c.capacity,
                       " (a ring keeps its last `capacity` positions, and at least the window before the length)");
    }
    first[b] = kept[b];
  }
  return first;
}

}  // namespace

Tensor KVCache::gather(const Tensor& storage, int64_t b, const char* op) const {
  check_sequence(b, op);
  const int64_t first = first_kept(b), n = length(b) - first, span = storage.size(2);
  Shape shape(storage.shape().begin() + 1, storage.shape().end());  // [Hk, n, ...]
  shape[1] = n;
  Tensor out = Tensor::empty(shape, storage.dtype());
  for (int64_t i = 0; i < n;) {  // run by run
    const int64_t p = first + i, len = std::min(n - i, run_end(b, p) - p), r = row(b, 0, p);
    out.slice(1, i, i + len)
        .copy_from(storage.select(0, r / (storage.size(1) * span)).slice(1, r % span, r % span + len));
    i += len;
  }
  return out;
}

Tensor KVCache::sequence_keys(int64_t b) const {
  const auto lock = read_lock();
  return gather(k_, b, "KVCache.sequence_keys");
}
Tensor KVCache::sequence_values(int64_t b) const {
  const auto lock = read_lock();
  return gather(v_, b, "KVCache.sequence_values");
}

std::map<std::string, Tensor> KVCache::state() const {
  const auto lock = read_lock();  // one state of the cache (qkv/kv_cache.h, "Threads")
  const KVCacheConfig& c = config_;
  int64_t used = 0;
  for (int64_t b = 0; b < c.batch; ++b) used = std::max(used, length(b) - first_kept(b));
  std::map<std::string, Tensor> s;
  const auto stack = [&](const Tensor& storage) {  // [B, Hk, used, ...]
    Shape shape = storage.shape();
    shape[0] = c.batch, shape[2] = used;
    Tensor out = Tensor::zeros(shape, storage.dtype());
    for (int64_t b = 0; b < c.batch; ++b)
      out.select(0, b).slice(1, 0, length(b) - first_kept(b)).copy_from(gather(storage, b, "KVCache.state"));
    return out;
  };
  s["keys"] = stack(k_);
  s["values"] = stack(v_);
  s["lengths"] = Tensor::from_vector(lengths_, {c.batch});
  s["capacity"] = Tensor::from_vector<int64_t>({c.capacity}, {1});
  s["window"] = Tensor::from_vector<int64_t>({c.window}, {1});
  s["page_size"] = Tensor::from_vector<int64_t>({c.page_size}, {1});
  s["pages"] = Tensor::from_vector<int64_t>({c.pages}, {1});
  if (c.window > 0) s["first_kept"] = Tensor::from_vector(kept_, {c.batch});
  if (c.rotary) {
    const double layout = c.rotary->layout == RotaryLayout::gptj ? 1.0 : 0.0;
    s["rotary"] = Tensor::from_vector<double>({c.rotary->base, layout, static_cast<double>(c.rotary->rotary_dim)}, {3});
  }
  if (c.dtype == DType::i8) {
    s["key_scales"] = stack(k_scale_);  // [B, Hk, used, groups]
    s["value_scales"] = stack(v_scale_);
    s["key_offsets"] = k_offset_;
    s["key_spreads"] = k_spread_;
  }
  return s;
}

KVCache KVCache::from_state(const std::map<std::string, Tensor>& s) {
  const Tensor& k = need(s, "keys");
  const Tensor& v = need(s, "values");
  const auto lengths = integers(need(s, "lengths"), "lengths");
  const auto capacity = integers(need(s, "capacity"), "capacity");
  if (k.dim() != 4 || v.dim() != 4 || capacity.size() != 1 || k.size(2) != v.size(2) ||
      static_cast<int64_t>(lengths.size()) != k.size(0) || k.size(2) > capacity[0]) {
    fail<ShapeError>(kOp, ": keys ", shape_str(k.shape()), ", values ", shape_str(v.shape()), ", ", lengths.size(),
                     " lengths and the capacity do not fit together");
  }
  if (v.size(0) != k.size(0) || v.size(1) != k.size(1)) {  // copy_from would broadcast one head's values to all
    fail<ShapeError>(kOp, ": values ", shape_str(v.shape()), " must share the keys' [B, Hk] (keys ",
                     shape_str(k.shape()), ")");
  }
  if (v.dtype() != k.dtype()) {  // the cache's dtype is the keys'; values of another would be converted silently
    fail<DTypeError>(kOp, ": values must have the keys' dtype ", dtype_name(k.dtype()), ", got ",
                     dtype_name(v.dtype()));
  }
  KVCacheConfig config{k.size(0), k.size(1), k.size(3), capacity[0], v.size(3), k.dtype()};
  config.window = scalar_or_zero(s, "window"), config.page_size = scalar_or_zero(s, "page_size");
  config.pages = scalar_or_zero(s, "pages");
  config.rotary = rotary_of(s);
  KVCache cache(config, kOp);  // its errors name from_state
  const bool int8 = k.dtype() == DType::i8;
  Tensor key_scales, value_scales;  // [B, Hk, n, groups]
  if (int8) {
    for (const char* name : {"key_offsets", "key_spreads"}) {  // copy_from would broadcast a [B, Hk, 1]
      if (floating(s, name).shape() != cache.k_offset_.shape()) {
        fail<ShapeError>(kOp, ": '", name, "' must be ", shape_str(cache.k_offset_.shape()), " for keys ",
                         shape_str(k.shape()), ", got ", shape_str(need(s, name).shape()));
      }
    }
    cache.k_offset_.copy_from(need(s, "key_offsets"));
    cache.k_spread_.copy_from(need(s, "key_spreads"));
    // the cache takes them over finite keys, spreads > 0: others decoded the head's keys to NaN or a constant
    const std::vector<float> offsets = cache.k_offset_.to_vector<float>(), spreads = cache.k_spread_.to_vector<float>();
    for (size_t i = 0; i < offsets.size(); ++i) {
      if (!std::isfinite(offsets[i]) || !std::isfinite(spreads[i]) || !(spreads[i] > 0.0f)) {
        fail<ValueError>(kOp, ": 'key_offsets' must be finite and 'key_spreads' finite and > 0, got ", offsets[i],
                         " and ", spreads[i], " at flat index ", i, " of ", shape_str(cache.k_offset_.shape()));
      }
    }
    key_scales = int8_scales(s, "key_scales", k, cache.k_scale_.size(3));
    value_scales = int8_scales(s, "value_scales", k, cache.v_scale_.size(3));
  }
  const std::vector<int64_t> kept = stored_from(s, cache.config(), lengths);  // each sequence's first stored position
  int64_t pages = 0;
  for (size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] - kept[b] > k.size(2)) {
      fail<ValueError>(kOp, ": lengths[", b, "] = ", lengths[b], " from position ", kept[b], " needs ",
                       lengths[b] - kept[b], " stored positions, keys ", shape_str(k.shape()), " hold ", k.size(2));
    }
    if (config.page_size > 0) pages += cache.pages_for(kept[b], lengths[b]);
  }
  if (pages > cache.free_pages()) {  // set_length would fail half way, naming itself
    fail<ValueError>(kOp, ": the sequences need ", pages, " pages of ", config.page_size, " positions, 'pages' is ",
                     cache.config().pages);
  }
  for (size_t b = 0; b < lengths.size(); ++b) {
    const int64_t n = lengths[b], first = kept[b];
    cache.kept_[b] = first;  // before set_length: it takes pages (afresh) for [first, n) only
    cache.set_length(static_cast<int64_t>(b), n);
    const Tensor kb = k.select(0, static_cast<int64_t>(b)).slice(1, 0, n - first);  // [Hk, n, D]
    const Tensor vb = v.select(0, static_cast<int64_t>(b)).slice(1, 0, n - first);
    if (int8) {
      const Tensor ks = key_scales.select(0, static_cast<int64_t>(b)).slice(1, 0, n - first);
      const Tensor vs = value_scales.select(0, static_cast<int64_t>(b)).slice(1, 0, n - first);
      cache.write_rows(static_cast<int64_t>(b), first, kb, vb, &ks, &vs);
    } else {
      cache.write_rows(static_cast<int64_t>(b), first, kb, vb, nullptr, nullptr);
    }
  }
  return cache;
}

}  // namespace qkv
