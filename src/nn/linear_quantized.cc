// qkv::nn::Linear's dynamic int8 quantization (qkv/nn/linear.h): int8 weights per
// output channel, int8 activations per token at run time, one int8 x int8 -> int32
// qkv::gemm, float32 out. Symmetric (no zero points): the int8 GEMM then needs no
// compensation terms, and the scales of both sides factor out of the dot product.
#include <algorithm>
#include <cmath>

#include "qkv/gemm.h"
#include "qkv/nn/linear.h"
#include "qkv/parallel.h"

namespace qkv::nn {

namespace {

// q[i] = round(x[i] / scale) in [-127, 127], scale = max|x| / 127 (1 when x is all 0, so
// that q is 0). Round half to even, as torch's quantize_per_channel. A NaN or inf in x
// gives scale 1 and saturated or undefined q: garbage in, as for torch. Returns the scale.
float quantize_row(const float* x, int64_t n, int8_t* q) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(x[i]));
  const float scale = amax > 0.0f && std::isfinite(amax) ? amax / 127.0f : 1.0f;
  const float inv = 1.0f / scale;
  // Round half to even by the 1.5 * 2^23 trick (exact for |r| <= 2^22, in the default
  // rounding mode): unlike std::nearbyint it vectorizes. Measured with
  // bench/peers/quant_peers.py, (8, 512, 768, 12), 2 threads: the int8 layer took 83.1 ms
  // with nearbyint, 75.9 ms with this.
  constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
  for (int64_t i = 0; i < n; ++i) {
    const float r = (std::clamp(x[i] * inv, -127.0f, 127.0f) + kMagic) - kMagic;
    q[i] = static_cast<int8_t>(r);
  }
  return scale;
}

}  // namespace

Linear Linear::quantize_dynamic() const {
  if (quant_) return *this;
  const Tensor w = to_torch_layout();  // [out, in] f32 contiguous
  auto q = std::make_shared<Int8Weight>();
  q->q = Tensor::empty({out_, in_}, DType::i8);
  q->scale.resize(static_cast<size_t>(out_));
  const float* src = w.data<float>();
  int8_t* dst = q->q.data<int8_t>();
  parallel_for(0, out_, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n)
      q->scale[static_cast<size_t>(n)] = quantize_row(src + n * in_, in_, dst + n * in_);
  });
  Linear l = *this;
  l.quant_ = std::move(q);
  return l;
}

Tensor Linear::quantized_weight() const {
  if (!quant_) fail<ValueError>("Linear: quantized_weight of a layer that is not quantized (quantize_dynamic)");
  return quant_->q;
}

Tensor Linear::weight_scales() const {
  if (!quant_) fail<ValueError>("Linear: weight_scales of a layer that is not quantized (quantize_dynamic)");
  return Tensor::from_vector(quant_->scale, {out_});
}

Tensor Linear::forward_int8(const Tensor& x) const {
  Shape out_shape = x.shape();
  out_shape.back() = out_;
  Tensor y = Tensor::empty(out_shape);  // [..., out]
  const int64_t rows = y.numel() / std::max<int64_t>(out_, 1);
  if (rows == 0 || out_ == 0) return y;
  const Tensor a = (x.dtype() == DType::f32 ? x : x.to(DType::f32)).reshape({rows, in_}).contiguous();  // [rows, in]
  Tensor xq = Tensor::empty({rows, in_}, DType::i8);                                                    // [rows, in]
  Tensor acc = Tensor::empty({rows, out_}, DType::i32);                                                 // [rows, out]
  std::vector<float> xs(static_cast<size_t>(rows));                                                     // [rows]
  const float* af = a.data<float>();
  int8_t* q = xq.data<int8_t>();
  parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) xs[static_cast<size_t>(m)] = quantize_row(af + m * in_, in_, q + m * in_);
  });
  GemmShape g;
  g.trans_b = true;  // B = W^T from the [out, in] int8 weight
  g.m = rows, g.n = out_, g.k = in_;
  g.lda = in_, g.ldb = in_, g.ldc = out_;
  gemm(g, q, quant_->q.data<int8_t>(), acc.data<int32_t>());
  const int32_t* c = acc.data<int32_t>();
  const float* b = bias_ ? bias_->data<float>() : nullptr;
  const float* ws = quant_->scale.data();
  float* out = y.data<float>();
  parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) {
      const float s = xs[static_cast<size_t>(m)];
      for (int64_t n = 0; n < out_; ++n) {
        out[m * out_ + n] = static_cast<float>(c[m * out_ + n]) * (s * ws[n]) + (b ? b[n] : 0.0f);
      }
    }
  });
  return y;
}

}  // namespace qkv::nn
