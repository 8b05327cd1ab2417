// KVCache and decode_attention's checks and dispatch (qkv/kv_cache.h).
#include "qkv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "attention/decode_cpu.h"
#include "qkv/error.h"
#include "qkv/size.h"

namespace qkv {

namespace {

constexpr const char* kAppend = "KVCache.append";
constexpr const char* kDecode = "decode_attention";

}  // namespace

KVCache::KVCache(const KVCacheConfig& config) : config_(config) {
  if (config_.value_dim == 0) config_.value_dim = config_.head_dim;
  const KVCacheConfig& c = config_;
  if (c.batch < 0 || c.kv_heads < 1 || c.head_dim < 1 || c.capacity < 0 || c.value_dim < 1) {
    fail<ValueError>("KVCache: batch and capacity must be >= 0, kv_heads, head_dim and value_dim >= 1; got batch ",
                     c.batch, ", kv_heads ", c.kv_heads, ", head_dim ", c.head_dim, ", capacity ", c.capacity,
                     ", value_dim ", c.value_dim);
  }
  if (c.dtype != DType::f32 && c.dtype != DType::bf16 && c.dtype != DType::f16 && c.dtype != DType::i8) {
    fail<DTypeError>("KVCache: dtype must be float32, bfloat16, float16 or int8, got ", dtype_name(c.dtype));
  }
  k_ = Tensor::zeros({c.batch, c.kv_heads, c.capacity, c.head_dim}, c.dtype);  // [B, Hk, capacity, D]
  v_ = Tensor::zeros({c.batch, c.kv_heads, c.capacity, c.value_dim}, c.dtype);
  if (c.dtype == DType::i8) {
    k_scale_ = Tensor::zeros({c.batch, c.kv_heads, c.capacity});  // [B, Hk, capacity]
    v_scale_ = Tensor::zeros({c.batch, c.kv_heads, c.capacity});
    k_offset_ = Tensor::zeros({c.batch, c.kv_heads, c.head_dim});  // [B, Hk, D]
    k_spread_ = Tensor::ones({c.batch, c.kv_heads, c.head_dim});
  }
  lengths_.assign(static_cast<size_t>(c.batch), 0);
}

void KVCache::append(const Tensor& k, const Tensor& v, const std::vector<int64_t>& counts) {
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
  for (int64_t b = 0; b < c.batch; ++b) {  // every check before the first write
    const int64_t n = counts.empty() ? t : counts[static_cast<size_t>(b)];
    if (n < 0 || n > t) fail<ValueError>(kAppend, ": counts[", b, "] = ", n, " is outside [0, ", t, "]");
    if (lengths_[static_cast<size_t>(b)] + n > c.capacity) {
      fail<ValueError>(kAppend, ": sequence ", b, " would hold ", lengths_[static_cast<size_t>(b)] + n,
                       " positions, past the capacity ", c.capacity);
    }
  }
  for (int64_t b = 0; b < c.batch; ++b) {
    const int64_t n = counts.empty() ? t : counts[static_cast<size_t>(b)], at = lengths_[static_cast<size_t>(b)];
    if (n == 0) continue;
    if (c.dtype == DType::i8) {
      append_int8(b, at, k.select(0, b).slice(1, 0, n), v.select(0, b).slice(1, 0, n));
    } else {  // [Hk, n, D] into the cache's [Hk, at:at+n, D] (the copy engine converts the dtype)
      k_.select(0, b).slice(1, at, at + n).copy_from(k.select(0, b).slice(1, 0, n).to(c.dtype));
      v_.select(0, b).slice(1, at, at + n).copy_from(v.select(0, b).slice(1, 0, n).to(c.dtype));
    }
    lengths_[static_cast<size_t>(b)] = at + n;
  }
}

namespace {

// Row [n] of x scaled to int8: round(x / s) with s = max|x| / 127 (1 for a zero row); returns s.
float quantize_row(const float* x, int64_t n, int8_t* out) {
  float big = 0.0f;
  for (int64_t i = 0; i < n; ++i) big = std::max(big, std::fabs(x[i]));
  const float s = big > 0.0f ? big / 127.0f : 1.0f;
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] / s), -127.0f, 127.0f));
  return s;
}

// offset[d], spread[d] = mean and RMS deviation of channel d over keys [n, dim] (spread 1
// where a channel does not vary).
void channel_stats(const float* k, int64_t n, int64_t dim, float* offset, float* spread) {
  for (int64_t d = 0; d < dim; ++d) {
    double sum = 0, squares = 0;
    for (int64_t j = 0; j < n; ++j) sum += k[j * dim + d];
    const double mean = sum / static_cast<double>(n);
    for (int64_t j = 0; j < n; ++j) squares += (k[j * dim + d] - mean) * (k[j * dim + d] - mean);
    const double rms = std::sqrt(squares / static_cast<double>(n));
    offset[d] = static_cast<float>(mean);
    spread[d] = rms > 1e-12 ? static_cast<float>(rms) : 1.0f;
  }
}

}  // namespace

void KVCache::append_int8(int64_t b, int64_t at, const Tensor& k, const Tensor& v) {
  const KVCacheConfig& c = config_;
  const Tensor kf = k.to(DType::f32).contiguous(), vf = v.to(DType::f32).contiguous();  // [Hk, n, D]
  const int64_t n = kf.size(1);
  for (int64_t h = 0; h < c.kv_heads; ++h) {
    float* offset = k_offset_.data<float>() + (b * c.kv_heads + h) * c.head_dim;  // [D]
    float* spread = k_spread_.data<float>() + (b * c.kv_heads + h) * c.head_dim;  // [D]
    const float* kh = kf.data<float>() + h * n * c.head_dim;                      // [n, D]
    if (at == 0) channel_stats(kh, n, c.head_dim, offset, spread);                // fixed by the sequence's first keys
    std::vector<float> row(static_cast<size_t>(c.head_dim));
    for (int64_t j = 0; j < n; ++j) {
      const int64_t slot = (b * c.kv_heads + h) * c.capacity + at + j;
      for (int64_t d = 0; d < c.head_dim; ++d) row[d] = (kh[j * c.head_dim + d] - offset[d]) / spread[d];
      k_scale_.data<float>()[slot] = quantize_row(row.data(), c.head_dim, k_.data<int8_t>() + slot * c.head_dim);
      const float* vj = vf.data<float>() + (h * n + j) * c.value_dim;
      v_scale_.data<float>()[slot] = quantize_row(vj, c.value_dim, v_.data<int8_t>() + slot * c.value_dim);
    }
  }
}

Tensor KVCache::keys_f32() const {
  if (config_.dtype != DType::i8) return k_.to(DType::f32);
  Tensor out = k_.to(DType::f32);  // [B, Hk, capacity, D]: q s r + c
  const KVCacheConfig& c = config_;
  float* o = out.data<float>();
  for (int64_t bh = 0; bh < c.batch * c.kv_heads; ++bh) {
    for (int64_t j = 0; j < c.capacity; ++j) {
      const float s = k_scale_.data<float>()[bh * c.capacity + j];
      const float* off = k_offset_.data<float>() + bh * c.head_dim;
      const float* spread = k_spread_.data<float>() + bh * c.head_dim;
      float* row = o + (bh * c.capacity + j) * c.head_dim;
      for (int64_t d = 0; d < c.head_dim; ++d) row[d] = row[d] * s * spread[d] + off[d];
    }
  }
  return out;
}

Tensor KVCache::values_f32() const {
  if (config_.dtype != DType::i8) return v_.to(DType::f32);
  Tensor out = v_.to(DType::f32);  // [B, Hk, capacity, Dv]: q s
  const KVCacheConfig& c = config_;
  float* o = out.data<float>();
  for (int64_t slot = 0; slot < c.batch * c.kv_heads * c.capacity; ++slot) {
    const float s = v_scale_.data<float>()[slot];
    for (int64_t d = 0; d < c.value_dim; ++d) o[slot * c.value_dim + d] *= s;
  }
  return out;
}

void KVCache::set_length(int64_t b, int64_t length) {
  if (b < 0 || b >= config_.batch || length < 0 || length > config_.capacity) {
    fail<ValueError>("KVCache.set_length: sequence ", b, " of ", config_.batch, ", length ", length, " outside [0, ",
                     config_.capacity, "]");
  }
  lengths_[static_cast<size_t>(b)] = length;
}

void KVCache::reset() { std::fill(lengths_.begin(), lengths_.end(), 0); }

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
  DecodeCall d;
  d.b = c.batch, d.hq = q.size(1), d.hk = c.kv_heads, d.lq = q.size(2), d.dk = c.head_dim, d.dv = c.value_dim;
  d.group = d.hq / d.hk;
  d.scale = o.scale.value_or(1.0 / std::sqrt(static_cast<double>(d.dk)));
  return d;
}

}  // namespace attention

AttentionResult decode_attention(const Tensor& q, const KVCache& cache, const DecodeOptions& options) {
  const attention::DecodeCall d = attention::check_decode(q, cache, options, kDecode);
  if (!q.device().is_cpu()) fail_no_kernel(kDecode, q.device());
  return attention::decode_attention_cpu(d, q, cache, options);
}

}  // namespace qkv
