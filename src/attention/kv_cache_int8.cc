// int8 KV caches (qkv/kv_cache.h): quantization on append, dequantized copies for the reference.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/quantize.h"
#include "qkv/kv_cache.h"

namespace qkv {

namespace {

// Row [n] of x scaled to int8 group by group (KVCache::kInt8Group channels): round(x / s_g)
// with s_g = max|x| / 127 over the group (1 for a zero group) rounded to a bfloat16, written to
// scales[g]; the values are rounded with that stored scale (the group's largest may clip, by a
// quarter step at most). Groups rather than one scale per row: issue 17's error on LLM-like keys
// went from 1.06e-2 (one scale per position) to 7.5e-3 (9.3e-3 with groups of 32). bfloat16
// rather than float32 scales: 144 bytes a row of 128 instead of 160 for a step that reads at
// memory speed; the test's error 7.51e-3 -> 8.18e-3 (7.7-8.7e-3 over 7 queries; rounding the
// scales up instead, never clipping, gave 9.6e-3; docs/decode.md).
void quantize_row(const float* x, int64_t n, int8_t* out, bfloat16* scales) {
  for (int64_t g0 = 0; g0 < n; g0 += KVCache::kInt8Group) {
    const int64_t len = std::min(KVCache::kInt8Group, n - g0);
    const float amax = kernels::max_abs(x + g0, len);
    // a NaN or inf in the group: scale NaN, so that it dequantizes to NaN as a float cache's row
    // reads (a scale of 1 stored finite numbers); the kernels keep such scales on their float passes
    const bfloat16 s(std::isfinite(amax) ? kernels::symmetric_scale(amax) : std::numeric_limits<float>::quiet_NaN());
    kernels::quantize_with(x + g0, len, static_cast<float>(s), out + g0);
    scales[g0 / KVCache::kInt8Group] = s;
  }
}

// offset[d], spread[d] = mean and RMS deviation of channel d over keys [n, dim], the squared
// deviation shrunk towards M^2, M the median channel's RMS deviation, as if kPriorKeys more keys
// had it: r_d^2 = (n rms_d^2 + kPriorKeys M^2) / (n + kPriorKeys) (spread 1 where that is 0, as
// with one key). A first append of 2 or 3 keys gives channels whose deviation is near 0 by chance;
// a later key's (k - c) / r there set its group's scale and rounded the group's other channels to
// nothing: 10-46% relative error after a 2-key first append against 0.7% after 300 keys (N(0, 1)
// keys, D = 128, 300 keys); shrunk, 0.7-1.2%. The median, not the mean: a few outlier channels
// (the spreads' reason to be) would pull the others' spreads up to theirs. Over the finite values
// only: a NaN or inf key in the first append made its channel's offset NaN, and every later key.
constexpr double kPriorKeys = 8.0;
void channel_stats(const float* k, int64_t n, int64_t dim, float* offset, float* spread) {
  std::vector<double> square(static_cast<size_t>(dim)), count(static_cast<size_t>(dim));  // [D] each
  for (int64_t d = 0; d < dim; ++d) {
    double sum = 0, squares = 0;
    double& finite = count[d];
    for (int64_t j = 0; j < n; ++j) {
      if (std::isfinite(k[j * dim + d])) sum += k[j * dim + d], finite += 1;
    }
    const double mean = finite > 0 ? sum / finite : 0.0;
    for (int64_t j = 0; j < n; ++j) {
      if (std::isfinite(k[j * dim + d])) squares += (k[j * dim + d] - mean) * (k[j * dim + d] - mean);
    }
    offset[d] = static_cast<float>(mean);
    square[d] = finite > 0 ? squares / finite : 0.0;
  }
  std::vector<double> sorted = square;
  std::nth_element(sorted.begin(), sorted.begin() + dim / 2, sorted.end());
  const double median = sorted[static_cast<size_t>(dim / 2)];
  for (int64_t d = 0; d < dim; ++d) {
    const double keys = count[d], rms = std::sqrt((keys * square[d] + kPriorKeys * median) / (keys + kPriorKeys));
    spread[d] = rms > 1e-12 ? static_cast<float>(rms) : 1.0f;
  }
}

}  // namespace

void KVCache::append_int8(int64_t b, int64_t at, const Tensor& k, const Tensor& v) {
  const KVCacheConfig& c = config_;
  const Tensor kf = k.to(DType::f32).contiguous(), vf = v.to(DType::f32).contiguous();  // [Hk, n, D]
  const int64_t n = kf.size(1), kg = k_scale_.size(3), vg = v_scale_.size(3);
  Tensor kq = Tensor::empty({c.kv_heads, n, c.head_dim}, DType::i8),
         ks = Tensor::empty({c.kv_heads, n, kg}, DType::bf16);
  Tensor vq = Tensor::empty({c.kv_heads, n, c.value_dim}, DType::i8),
         vs = Tensor::empty({c.kv_heads, n, vg}, DType::bf16);
  std::vector<float> row(static_cast<size_t>(c.head_dim));
  for (int64_t h = 0; h < c.kv_heads; ++h) {
    float* offset = k_offset_.data<float>() + (b * c.kv_heads + h) * c.head_dim;  // [D]
    float* spread = k_spread_.data<float>() + (b * c.kv_heads + h) * c.head_dim;  // [D]
    const float* kh = kf.data<float>() + h * n * c.head_dim;                      // [n, D]
    if (length(b) == 0) channel_stats(kh, n, c.head_dim, offset, spread);         // the sequence's first keys
    for (int64_t j = 0; j < n; ++j) {
      const int64_t at_hj = h * n + j;  // in [Hk, n]
      for (int64_t d = 0; d < c.head_dim; ++d) row[d] = (kh[j * c.head_dim + d] - offset[d]) / spread[d];
      quantize_row(row.data(), c.head_dim, kq.data<int8_t>() + at_hj * c.head_dim, ks.data<bfloat16>() + at_hj * kg);
      quantize_row(vf.data<float>() + at_hj * c.value_dim, c.value_dim, vq.data<int8_t>() + at_hj * c.value_dim,
                   vs.data<bfloat16>() + at_hj * vg);
    }
  }
  write_rows(b, at, kq, vq, &ks, &vs);
}

// Dequantized copies: every stored row of every sequence (other rows are stale either way),
// scalar loops (the reference reads these; the kernel dequantizes on the fly, decode_rows-inl.h).
Tensor KVCache::keys_f32() const {
  Tensor out = k_.to(DType::f32);  // storage shape: q s r + c
  if (config_.dtype != DType::i8) return out;
  const KVCacheConfig& c = config_;
  const int64_t groups = k_scale_.size(3);
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.kv_heads; ++h) {
      const float* off = k_offset_.data<float>() + (b * c.kv_heads + h) * c.head_dim;
      const float* spread = k_spread_.data<float>() + (b * c.kv_heads + h) * c.head_dim;
      for (int64_t p = first_kept(b); p < length(b); ++p) {
        const int64_t r = row(b, h, p);
        const bfloat16* s = k_scale_.data<bfloat16>() + r * groups;  // [groups]
        float* x = out.data<float>() + r * c.head_dim;
        for (int64_t d = 0; d < c.head_dim; ++d) {
          x[d] = x[d] * (static_cast<float>(s[d / kInt8Group]) * spread[d]) + off[d];
        }
      }
    }
  }
  return out;
}

Tensor KVCache::values_f32() const {
  Tensor out = v_.to(DType::f32);  // storage shape: q s
  if (config_.dtype != DType::i8) return out;
  const KVCacheConfig& c = config_;
  const int64_t groups = v_scale_.size(3);
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.kv_heads; ++h) {
      for (int64_t p = first_kept(b); p < length(b); ++p) {
        const int64_t r = row(b, h, p);
        const bfloat16* s = v_scale_.data<bfloat16>() + r * groups;  // [groups]
        float* x = out.data<float>() + r * c.value_dim;
        for (int64_t d = 0; d < c.value_dim; ++d) x[d] *= static_cast<float>(s[d / kInt8Group]);
      }
    }
  }
  return out;
}

}  // namespace qkv
