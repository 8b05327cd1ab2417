// qkv::nn::Linear: the projection every attention layer uses (PyTorch nn.Linear,
// Keras Dense / EinsumDense with one contracted axis), through qkv::gemm.
//
// y[..., out] = x[..., in] @ W + b. The weight is kept as given, without copies:
//   PyTorch layout: weight [out, in] (nn.Linear.weight, rows of in_proj_weight);
//   Keras layout:   kernel [in, out...] (EinsumDense "abc,cde->abde": [dim, heads,
//                   key_dim] is in = dim, out = heads * key_dim, head-major), or
//                   [in..., out] (the output dense "abcd,cde->abe": in = heads * value_dim).
// Converting between the two is a reshape + transpose (to_torch_layout/to_keras_layout).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::nn {

// What static int8 quantization needs from the inputs of a projection during calibration
// (torch.ao's MinMaxObserver / HistogramObserver roles, symmetric): the largest |x| seen,
// or a percentile of |x| (clipping rare outliers), from which scale() is that / 127.
class ActivationObserver {
 public:
  enum class Kind { min_max, percentile };
  // percentile in (0, 100]; ValueError otherwise.
  explicit ActivationObserver(Kind kind = Kind::min_max, double percentile = 99.99);
  void observe(const Tensor& x);  // any shape; f16/bf16/f64 read as f32
  // The int8 scale; ValueError when nothing was observed. Percentiles come from a uniform
  // reservoir sample of at most 2^20 values (fixed seed: the same data give the same scale).
  float scale() const;
  int64_t count() const { return static_cast<int64_t>(seen_); }

 private:
  Kind kind_;
  double percentile_;
  float amax_ = 0.0f;
  uint64_t seen_ = 0;
  std::vector<float> sample_;  // |x| values (percentile)
  uint64_t rng_ = 0x9e3779b97f4a7c15ull;
};

// Gradients through a Linear (Linear::backward).
struct LinearGradients {
  Tensor dx;                    // [..., in], x's shape, f32
  Tensor dweight;               // the weight as the layer holds it: torch layout [out, in]; Keras layout [in, out]
                                // (reshape to the EinsumDense kernel's axes as needed)
  std::optional<Tensor> dbias;  // [out] when the layer has a bias
};

class Linear {
 public:
  Linear() = default;
  // PyTorch layout: weight [out, in] (rows may be strided, as a slice of in_proj_weight),
  // bias [out] or none. ShapeError on mismatched shapes, DTypeError unless f32.
  static Linear torch(const Tensor& weight, const std::optional<Tensor>& bias);
  // Keras layout: kernel [in_dims..., out_dims...] with `in_dims` leading axes
  // contracted (1 for a query/key/value EinsumDense, 2 for the output dense);
  // bias [out_dims...] or none.
  static Linear keras(const Tensor& kernel, const std::optional<Tensor>& bias, int in_dims = 1);

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }
  bool has_bias() const { return bias_.has_value(); }
  bool defined() const { return in_ > 0 || out_ > 0; }

  // x [..., in] (any strides; f32, f16/bf16/f64 are converted) -> y [..., out] f32, contiguous.
  Tensor forward(const Tensor& x) const;

  // Backward of y = forward(x): given dy = d loss / d y [..., out], the gradients with
  // respect to x, the weight and the bias (forward: y = x W + b, so dx = dy W^T,
  // dW = x^T dy summed over every leading index, db = sum dy). Float32 layers only
  // (ValueError for a quantized one); ShapeError naming Linear for mismatched shapes.
  LinearGradients backward(const Tensor& x, const Tensor& dy) const;

  // Dynamic int8 quantization (seed 002; torch.ao.quantization.quantize_dynamic does the
  // same to nn.Linear): the weight becomes int8 per output channel (scale = max|w_n| / 127,
  // round to nearest even), and forward quantizes each input row (token) at run time the
  // same way (symmetric, scale = max|x_m| / 127), multiplies int8 x int8 -> int32 through
  // qkv::gemm (oneDNN: VNNI/AMX where present) and returns
  //   y[m, n] = scale_x[m] * scale_w[n] * acc[m, n] + b[n]   (float32).
  // The bias stays float32. linear_quantized.cc.
  // weight_bits: 8, or 7 (weights in [-63, 63], scale = max|w_n| / 63: twice the weight's
  // rounding error, as torch's reduce_range costs its activations), or 0 for this CPU's
  // choice: 8 where qkv::gemm_int8_full_range() (VNNI, AMX), else 7, the range oneDNN's
  // int8 kernel multiplies exactly without VNNI (8-bit weights there take the exact float32
  // path, no faster than a float32 layer: docs/nn_quantization.md). ValueError for other values. On a
  // quantized layer: itself if its bits are those, else quantized again from its float32 weight;
  // a static layer (quantize_static) becomes dynamic either way. ValueError for in_features >
  // 131071, the int8 GEMM's depth limit (qkv/gemm.h: int32 sums could overflow).
  Linear quantize_dynamic(int weight_bits = 0) const;
  // Static int8 quantization: weights as quantize_dynamic, activations with one fixed scale
  // for every token (from calibration: ActivationObserver::scale()), values beyond it
  // clipped to +-127. ValueError unless activation_scale > 0 and finite.
  Linear quantize_static(float activation_scale, int weight_bits = 0) const;
  bool quantized() const { return quant_ != nullptr; }
  // 8 or 7 (quantize_dynamic's weight_bits as resolved); ValueError unless quantized().
  int weight_bits() const;
  // The quantized weight [out, in] int8 and its per-channel scales [out] (f32); ValueError
  // unless quantized().
  Tensor quantized_weight() const;
  Tensor weight_scales() const;

  // The weight as PyTorch stores it ([out, in], contiguous) / as Keras stores it
  // ([in, out], contiguous; reshape to the EinsumDense kernel's axes as needed).
  Tensor to_torch_layout() const;
  Tensor to_keras_layout() const;
  const std::optional<Tensor>& bias() const { return bias_; }  // [out]

 private:
  struct Int8Weight {
    Tensor q;                    // [out, in] int8, contiguous
    std::vector<float> scale;    // [out]
    float activation_scale = 0;  // static quantization's fixed scale; 0: per token (dynamic)
    int bits = 8;                // 7: every value in [-63, 63] (gemm_int8_narrow_b)
  };
  Tensor forward_int8(const Tensor& x) const;
  // quantize_dynamic's work, its errors naming `op` (quantize_dynamic or quantize_static).
  Linear quantized_as(int weight_bits, const char* op) const;

  std::shared_ptr<const Int8Weight> quant_;  // set by quantize_dynamic (shared by copies)
  Tensor weight_;                            // [out, in] when transposed_, else [in, out]; rows contiguous
  bool transposed_ = false;
  std::optional<Tensor> bias_;  // [out] contiguous f32
  int64_t in_ = 0, out_ = 0;
};

// The weight bits of an int8 quantization: 8 or 7 as asked, 0 resolved for this CPU (8 where
// qkv::gemm_int8_full_range(), else 7; Linear::quantize_dynamic); ValueError naming `op` for
// any other value.
int int8_weight_bits(int requested, const char* op);

// Reads an f32 parameter: converts other float dtypes, ShapeError naming `what`
// unless its shape is `shape`.
Tensor parameter(const Tensor& t, const Shape& shape, const char* what);

}  // namespace qkv::nn
