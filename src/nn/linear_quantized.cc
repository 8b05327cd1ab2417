// qkv::nn::Linear's dynamic int8 quantization (qkv/nn/linear.h): int8 weights per
// output channel, int8 activations per token at run time, one int8 x int8 -> int32
// qkv::gemm, float32 out. Symmetric (no zero points): the int8 GEMM then needs no
// compensation terms, and the scales of both sides factor out of the dot product.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/quantize.h"
#include "qkv/gemm.h"
#include "qkv/nn/linear.h"
#include "qkv/parallel.h"
#include "tensor/buffer_pool.h"

namespace qkv::nn {

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// q[i] = round(x[i] / scale) in [-qmax, qmax], scale = max|x| / qmax (1 when x is all 0, so
// that q is 0). Round half to even, as torch's quantize_per_channel. Returns the scale, NaN
// when x holds a NaN or an inf (q is then saturated): the row's outputs become NaN as the
// float32 layer's do, where a scale of 1 gave finite numbers for an inf input (torch's
// quantize_dynamic raises there). Weights likewise: a NaN weight makes its channel NaN.
float quantize_row(const float* x, int64_t n, int8_t* q, float qmax = 127.0f) {
  const float amax = kernels::max_abs(x, n);
  const float scale = kernels::symmetric_scale(amax, qmax);
  kernels::quantize_with(x, n, scale, q, qmax);
  return std::isfinite(amax) ? scale : kNaN;
}

}  // namespace

int int8_weight_bits(int requested, const char* op) {
  if (requested != 0 && requested != 7 && requested != 8) {
    fail<ValueError>(op, ": weight_bits must be 8, 7 or 0 (this CPU's choice), got ", requested);
  }
  if (requested != 0) return requested;
  return gemm_int8_full_range() ? 8 : 7;
}

Linear Linear::quantize_dynamic(int weight_bits) const { return quantized_as(weight_bits, "Linear.quantize_dynamic"); }

Linear Linear::quantized_as(int weight_bits, const char* op) const {
  const int bits = int8_weight_bits(weight_bits, op);
  // qkv/gemm.h's int8 GEMM takes K <= kGemmInt8MaxDepth (its int32 products cannot overflow): a
  // deeper layer quantized without a word and then failed at every call with gemm's "k=... is
  // more than 131071", naming neither the layer nor a way out.
  if (in_ > kGemmInt8MaxDepth) {
    fail<ValueError>(op, ": in_features ", in_, " is more than ", kGemmInt8MaxDepth,
                     ", the depth of the int8 GEMM (its int32 sums could overflow); keep this projection float32");
  }
  // A dynamic layer of these bits is this one; a static one keeps its int8 weights but
  // quantizes its activations per token again (it stayed static, clipping at its scale).
  if (quant_ && quant_->bits == bits) {
    if (quant_->activation_scale == 0.0f) return *this;
    auto q = std::make_shared<Int8Weight>(*quant_);
    q->activation_scale = 0.0f;
    Linear l = *this;
    l.quant_ = std::move(q);
    return l;
  }
  const Tensor w = to_torch_layout();  // [out, in] f32 contiguous
  auto q = std::make_shared<Int8Weight>();
  q->q = Tensor::empty({out_, in_}, DType::i8);
  q->scale.resize(static_cast<size_t>(out_));
  q->bits = bits;
  const float qmax = bits == 7 ? 63.0f : 127.0f;
  const float* src = w.data<float>();
  int8_t* dst = q->q.data<int8_t>();
  parallel_for(0, out_, 16, [&](int64_t lo, int64_t hi) {
    for (int64_t n = lo; n < hi; ++n)
      q->scale[static_cast<size_t>(n)] = quantize_row(src + n * in_, in_, dst + n * in_, qmax);
  });
  Linear l = *this;
  l.quant_ = std::move(q);
  return l;
}

Linear Linear::quantize_static(float activation_scale, int weight_bits) const {
  if (!(activation_scale > 0.0f) || !std::isfinite(activation_scale)) {
    fail<ValueError>("Linear: quantize_static needs a positive finite activation scale, got ", activation_scale);
  }
  Linear l = quantized_as(weight_bits, "Linear.quantize_static");
  auto q = std::make_shared<Int8Weight>(*l.quant_);
  q->activation_scale = activation_scale;
  l.quant_ = std::move(q);
  return l;
}

int Linear::weight_bits() const {
  if (!quant_) fail<ValueError>("Linear: weight_bits of a layer that is not quantized (quantize_dynamic)");
  return quant_->bits;
}

Tensor Linear::quantized_weight() const {
  if (!quant_) fail<ValueError>("Linear: quantized_weight of a layer that is not quantized (quantize_dynamic)");
  return quant_->q;
}

Tensor Linear::weight_scales() const {
  if (!quant_) fail<ValueError>("Linear: weight_scales of a layer that is not quantized (quantize_dynamic)");
  return Tensor::from_vector(quant_->scale, {out_});
}

namespace {

// The rows [m0, m0 + rows) of one int8 forward: x [rows, in] quantized per token (or with the
// static scale `fixed` > 0) into xq, one int8 GEMM against the [out, in] weight into acc
// [rows, out], then y = acc * (x scale * weight scale) + bias.
struct Int8Rows {
  const float* x = nullptr;        // [rows, in]
  const int8_t* w = nullptr;       // [out, in]
  const float* w_scale = nullptr;  // [out]
  const float* bias = nullptr;     // [out] or null
  float fixed = 0.0f;
  bool narrow = false;  // 7-bit weights: gemm_int8_narrow_b
  int64_t in = 0, out = 0;
  float* y = nullptr;  // [rows, out]
};

// xq [rows, in], xs [rows] = rows m0.. of x quantized (per token, or with l.fixed > 0).
void quantize_rows(const Int8Rows& l, int64_t m0, int64_t rows, int8_t* xq, float* xs) {
  for (int64_t m = 0; m < rows; ++m) {
    const float* xm = l.x + (m0 + m) * l.in;
    if (l.fixed > 0.0f) {  // a NaN or inf in the row: NaN outputs, not the clipped value's
      kernels::quantize_with(xm, l.in, l.fixed, xq + m * l.in);
      xs[m] = std::isfinite(kernels::max_abs(xm, l.in)) ? l.fixed : kNaN;
    } else {
      xs[m] = quantize_row(xm, l.in, xq + m * l.in);
    }
  }
}

// acc [rows, out] = xq [rows, in] W^T (the [out, in] int8 weight).
void multiply_rows(const Int8Rows& l, int64_t rows, const int8_t* xq, int32_t* acc) {
  GemmShape g;
  g.trans_b = true;
  g.m = rows, g.n = l.out, g.k = l.in;
  g.lda = l.in, g.ldb = l.in, g.ldc = l.out;
  if (l.narrow) {
    detail::gemm_int8_narrow_b(g, xq, l.w, acc);
  } else {
    gemm(g, xq, l.w, acc);
  }
}

// y rows m0.. = acc [rows, out] * (x scale * weight scale) + bias.
void dequantize_rows(const Int8Rows& l, int64_t m0, int64_t rows, const int32_t* acc, const float* xs) {
  for (int64_t m = 0; m < rows; ++m) {
    float* ym = l.y + (m0 + m) * l.out;
    const int32_t* cm = acc + m * l.out;
    for (int64_t n = 0; n < l.out; ++n) {
      ym[n] = static_cast<float>(cm[n]) * (xs[m] * l.w_scale[n]) + (l.bias ? l.bias[n] : 0.0f);
    }
  }
}

// Per-thread buffers, reused across calls (page faults of fresh ones were 13% of the layer's
// time): xq [rows, in], acc [rows, out], xs [rows].
struct Int8Buffers {
  std::vector<int8_t> xq;
  std::vector<int32_t> acc;
  std::vector<float> xs;
  static Int8Buffers& of_thread(int64_t rows, int64_t in, int64_t out) {
    thread_local Int8Buffers b;
    b.xq.resize(static_cast<size_t>(rows * in));
    b.acc.resize(static_cast<size_t>(rows * out));
    b.xs.resize(static_cast<size_t>(rows));
    return b;
  }
};

}  // namespace

Tensor Linear::forward_int8(const Tensor& x) const {
  Shape out_shape = x.shape();
  out_shape.back() = out_;
  // Pooled: a fresh 37 MB output ([8, 512, 2304]) page-faulted in on every call otherwise.
  Tensor y = kernels::empty_pooled(out_shape, DType::f32, "int8 Linear output");  // [..., out]
  const int64_t rows = y.numel() / std::max<int64_t>(out_, 1);
  if (rows == 0 || out_ == 0) return y;
  const Tensor a = (x.dtype() == DType::f32 ? x : x.to(DType::f32)).reshape({rows, in_}).contiguous();  // [rows, in]
  const Int8Rows l{a.data<float>(),
                   quant_->q.data<int8_t>(),
                   quant_->scale.data(),
                   bias_ ? bias_->data<float>() : nullptr,
                   quant_->activation_scale,
                   quant_->bits == 7,
                   in_,
                   out_,
                   y.data<float>()};
  // Blocks of kBlock token rows, each quantized, multiplied (one single-threaded GEMM inside
  // parallel_for) and dequantized while its [kBlock, out] int32 products are in the L2,
  // where one GEMM over all rows wrote them to memory and read them back: (8, 512, 768, 12)
  // in-projection, 2 threads, AMD EPYC Zen 4: see docs/nn_quantization.md. Few rows (decode) stay one
  // multi-threaded GEMM, and so do CPUs without VNNI: there oneDNN's int8 gemm:jit packs the
  // whole weight on every call (23% of the layer's samples with blocks of 64 under
  // ONEDNN_MAX_CPU_ISA=AVX2; layer 118 ms in blocks of 64, 97 in 256, 93 in one GEMM).
  constexpr int64_t kBlock = 64;
  const int64_t blocks = (rows + kBlock - 1) / kBlock;
  if (gemm_int8_full_range() && blocks >= 2 * static_cast<int64_t>(get_num_threads())) {
    parallel_for(0, blocks, 1, [&](int64_t lo, int64_t hi) {
      Int8Buffers& b = Int8Buffers::of_thread(kBlock, in_, out_);
      for (int64_t m0 = lo * kBlock; m0 < std::min(rows, hi * kBlock); m0 += kBlock) {
        const int64_t n = std::min(kBlock, rows - m0);
        quantize_rows(l, m0, n, b.xq.data(), b.xs.data());
        multiply_rows(l, n, b.xq.data(), b.acc.data());
        dequantize_rows(l, m0, n, b.acc.data(), b.xs.data());
      }
    });
    return y;
  }
  Int8Buffers& b = Int8Buffers::of_thread(rows, in_, out_);
  parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    quantize_rows(l, lo, hi - lo, b.xq.data() + lo * in_, b.xs.data() + lo);
  });
  multiply_rows(l, rows, b.xq.data(), b.acc.data());
  parallel_for(0, rows, 16, [&](int64_t lo, int64_t hi) {
    dequantize_rows(l, lo, hi - lo, b.acc.data() + lo * out_, b.xs.data() + lo);
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
