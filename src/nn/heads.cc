#include "nn/heads.h"

#include <limits>
#include <string>

#include "qkv/error.h"
#include "qkv/parallel.h"

namespace qkv::nn::detail {

Tensor split_heads(const Tensor& x, int64_t heads, bool batch_first) {
  const int64_t a = x.size(0), b = x.size(1), hd = x.size(2);
  const Tensor v = x.view({a, b, heads, hd / heads});                      // [L, N, H, D] or [N, L, H, D]
  return batch_first ? v.permute({0, 2, 1, 3}) : v.permute({1, 2, 0, 3});  // [N, H, L, D]
}

Tensor merge_heads(const Tensor& o, bool batch_first) {
  const int64_t n = o.size(0), h = o.size(1), l = o.size(2), d = o.size(3);
  const Tensor t = batch_first ? o.permute({0, 2, 1, 3}) : o.permute({2, 0, 1, 3});  // [N|L, L|N, H, D]
  return batch_first ? t.reshape({n, l, h * d}) : t.reshape({l, n, h * d});
}

Tensor append_key_row(const Tensor& k, const std::optional<Tensor>& row) {
  const int64_t n = k.size(0), h = k.size(1), s = k.size(2), d = k.size(3);
  Tensor out = Tensor::empty({n, h, s + 1, d});  // [N, H, S+1, D]
  out.slice(2, 0, s).copy_from(k);
  const Tensor last = out.slice(2, s, s + 1);  // [N, H, 1, D]
  if (row) {
    last.copy_from(row->reshape({1, h, 1, d}));
  } else {
    last.fill(0.0);
  }
  return out;
}

Tensor additive_mask(const Tensor& m, bool true_masks, const char* what) {
  if (m.dtype() == DType::b8) {
    const Tensor c = m.contiguous();
    const bool* src = c.data<bool>();
    Tensor out = Tensor::empty(m.shape());
    float* dst = out.data<float>();
    const float inf = std::numeric_limits<float>::infinity();
    for (int64_t i = 0; i < m.numel(); ++i) dst[i] = (src[i] == true_masks) ? -inf : 0.0f;
    return out;
  }
  if (m.dtype() != DType::f32 && m.dtype() != DType::f64 && m.dtype() != DType::f16 && m.dtype() != DType::bf16) {
    fail<DTypeError>(what, ": expected a bool or floating-point mask");
  }
  return m.to(DType::f32).contiguous();
}

Tensor add_broadcast(const Tensor& a, const Tensor& b) {
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), "mask");
  Tensor out = a.expand(shape).clone();  // [shape], a fresh copy to add into
  const Tensor bb = b.expand(shape).contiguous();
  float* o = out.data<float>();
  const float* p = bb.data<float>();
  parallel_for(0, out.numel(), 1 << 16, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) o[i] += p[i];
  });
  return out;
}

Tensor pad_last(const Tensor& m, int64_t extra, float value) {
  if (extra == 0) return m;
  Shape shape = m.shape();
  const int64_t s = shape.back();
  shape.back() += extra;
  Tensor out = Tensor::empty(shape, m.dtype());
  out.slice(-1, 0, s).copy_from(m);
  out.slice(-1, s, s + extra).fill(value);
  return out;
}

void check_cache(const KVCache& cache, const char* op, int64_t n, int64_t h, int64_t d, int64_t dv) {
  const KVCacheConfig& c = cache.config();
  if (c.batch != n || c.kv_heads != h || c.head_dim != d || c.value_dim != dv) {
    fail<ShapeError>(op, ": the cache must be [N = ", n, ", H = ", h, ", capacity, ", d, "]",
                     dv == d ? "" : " (values " + std::to_string(dv) + ")", ", got [", c.batch, ", ", c.kv_heads, ", ",
                     c.capacity, ", ", c.head_dim, "] (values ", c.value_dim, ")");
  }
}

}  // namespace qkv::nn::detail
