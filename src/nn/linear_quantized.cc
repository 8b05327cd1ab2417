// qkv::nn::Linear's dynamic int8 quantization (qkv/nn/linear.h): int8 weights per
// output channel, int8 activations per token at run time, one int8 x int8 -> int32
// qkv::gemm, float32 out. Symmetric (no zero points): the int8 GEMM then needs no
// compensation terms, and the scales of both sides factor out of the dot product.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cpu/quantize.h"
#include "qkv/gemm.h"
#include "qkv/nn/linear.h"
#include "qkv/parallel.h"

namespace qkv::nn {

namespace {

// q[i] = round(x[i] / scale) in [-127, 127], scale = max|x| / 127 (1 when x is all 0, so
// that q is 0). Round half to even, as torch's quantize_per_channel. A NaN or inf in x
// gives scale 1 and saturated or undefined q: garbage in, as for torch. Returns the scale.
float quantize_row(const float* x, int64_t n, int8_t* q) {
  const float scale = kernels::symmetric_scale(kernels::max_abs(x, n));
  kernels::quantize_with(x, n, scale, q);
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

Linear Linear::quantize_static(float activation_scale) const {
  if (!(activation_scale > 0.0f) || !std::isfinite(activation_scale)) {
    fail<ValueError>("Linear: quantize_static needs a positive finite activation scale, got ", activation_scale);
  }
  Linear l = quantize_dynamic();
  auto q = std::make_shared<Int8Weight>(*l.quant_);
  q->activation_scale = activation_scale;
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
  // The int8 activations and int32 products live in per-thread buffers reused across calls
  // (perf showed 13% of the int8 layer's time in the kernel, mostly page faults of fresh
  // buffers). Measured after, 2 threads, quant_peers.py: 75.8-78.2 ms against 75.9-83.4
  // before: within this VM's noise. The buffers keep the largest size a thread has seen.
  thread_local std::vector<int8_t> xq_buffer;
  thread_local std::vector<int32_t> acc_buffer;
  xq_buffer.resize(static_cast<size_t>(rows * in_));    // [rows, in]
  acc_buffer.resize(static_cast<size_t>(rows * out_));  // [rows, out]
  std::vector<float> xs(static_cast<size_t>(rows));     // [rows]
  const float* af = a.data<float>();
  int8_t* q = xq_buffer.data();
  const float fixed = quant_->activation_scale;  // static: one scale; dynamic (0): per token
  parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t m = lo; m < hi; ++m) {
      if (fixed > 0.0f) {
        kernels::quantize_with(af + m * in_, in_, fixed, q + m * in_);
        xs[static_cast<size_t>(m)] = fixed;
      } else {
        xs[static_cast<size_t>(m)] = quantize_row(af + m * in_, in_, q + m * in_);
      }
    }
  });
  GemmShape g;
  g.trans_b = true;  // B = W^T from the [out, in] int8 weight
  g.m = rows, g.n = out_, g.k = in_;
  g.lda = in_, g.ldb = in_, g.ldc = out_;
  gemm(g, q, quant_->q.data<int8_t>(), acc_buffer.data());
  const int32_t* c = acc_buffer.data();
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

// ---- calibration -------------------------------------------------------------------------

ActivationObserver::ActivationObserver(Kind kind, double percentile) : kind_(kind), percentile_(percentile) {
  if (!(percentile > 0.0 && percentile <= 100.0)) {
    fail<ValueError>("ActivationObserver: percentile must be in (0, 100], got ", percentile);
  }
}

void ActivationObserver::observe(const Tensor& x) {
  constexpr size_t kSample = size_t{1} << 20;
  const std::vector<float> v = x.to_vector<float>();
  for (float e : v) {
    const float a = std::fabs(e);
    if (!std::isfinite(a)) continue;  // a NaN or inf says nothing about the range
    amax_ = std::max(amax_, a);
    ++seen_;
    if (kind_ != Kind::percentile) continue;
    if (sample_.size() < kSample) {
      sample_.push_back(a);
      continue;
    }
    rng_ ^= rng_ << 13, rng_ ^= rng_ >> 7, rng_ ^= rng_ << 17;  // xorshift64: reservoir sampling
    const uint64_t slot = rng_ % seen_;
    if (slot < kSample) sample_[slot] = a;
  }
}

float ActivationObserver::scale() const {
  if (seen_ == 0) fail<ValueError>("ActivationObserver: no finite value observed (calibrate with some batches)");
  float range = amax_;
  if (kind_ == Kind::percentile && !sample_.empty()) {
    std::vector<float> s = sample_;
    const auto rank = static_cast<size_t>(std::ceil(percentile_ / 100.0 * static_cast<double>(s.size()))) - 1;
    const size_t k = std::min(rank, s.size() - 1);
    std::nth_element(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(k), s.end());
    range = s[k];
  }
  return range > 0.0f ? range / 127.0f : 1.0f;
}

}  // namespace qkv::nn
