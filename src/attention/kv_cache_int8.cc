// int8 KV caches (qkv/kv_cache.h): quantization on append, dequantized copies for the reference.
#include <algorithm>
#include <cmath>
#include <vector>

#include "qkv/kv_cache.h"

namespace qkv {

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
  Tensor kq = Tensor::empty({c.kv_heads, n, c.head_dim}, DType::i8), ks = Tensor::empty({c.kv_heads, n});
  Tensor vq = Tensor::empty({c.kv_heads, n, c.value_dim}, DType::i8), vs = Tensor::empty({c.kv_heads, n});
  std::vector<float> row(static_cast<size_t>(c.head_dim));
  for (int64_t h = 0; h < c.kv_heads; ++h) {
    float* offset = k_offset_.data<float>() + (b * c.kv_heads + h) * c.head_dim;  // [D]
    float* spread = k_spread_.data<float>() + (b * c.kv_heads + h) * c.head_dim;  // [D]
    const float* kh = kf.data<float>() + h * n * c.head_dim;                      // [n, D]
    if (length(b) == 0) channel_stats(kh, n, c.head_dim, offset, spread);         // the sequence's first keys
    for (int64_t j = 0; j < n; ++j) {
      const int64_t at_hj = h * n + j;  // in [Hk, n]
      for (int64_t d = 0; d < c.head_dim; ++d) row[d] = (kh[j * c.head_dim + d] - offset[d]) / spread[d];
      ks.data<float>()[at_hj] = quantize_row(row.data(), c.head_dim, kq.data<int8_t>() + at_hj * c.head_dim);
      vs.data<float>()[at_hj] =
          quantize_row(vf.data<float>() + at_hj * c.value_dim, c.value_dim, vq.data<int8_t>() + at_hj * c.value_dim);
    }
  }
  write_rows(b, at, kq, vq, &ks, &vs);
}

// Dequantized copies: every stored row of every sequence (other rows are stale either way).
Tensor KVCache::keys_f32() const {
  Tensor out = k_.to(DType::f32);  // storage shape: q s r + c
  if (config_.dtype != DType::i8) return out;
  const KVCacheConfig& c = config_;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.kv_heads; ++h) {
      const float* off = k_offset_.data<float>() + (b * c.kv_heads + h) * c.head_dim;
      const float* spread = k_spread_.data<float>() + (b * c.kv_heads + h) * c.head_dim;
      for (int64_t p = first_kept(b); p < length(b); ++p) {
        const int64_t r = row(b, h, p);
        const float s = k_scale_.data<float>()[r];
        float* x = out.data<float>() + r * c.head_dim;
        for (int64_t d = 0; d < c.head_dim; ++d) x[d] = x[d] * s * spread[d] + off[d];
      }
    }
  }
  return out;
}

Tensor KVCache::values_f32() const {
  Tensor out = v_.to(DType::f32);  // storage shape: q s
  if (config_.dtype != DType::i8) return out;
  const KVCacheConfig& c = config_;
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.kv_heads; ++h) {
      for (int64_t p = first_kept(b); p < length(b); ++p) {
        const int64_t r = row(b, h, p);
        const float s = v_scale_.data<float>()[r];
        for (int64_t d = 0; d < c.value_dim; ++d) out.data<float>()[r * c.value_dim + d] *= s;
      }
    }
  }
  return out;
}

}  // namespace qkv
