// MultiheadAttention::quantized_state_dict / from_quantized_state_dict (qkv/nn/mha.h): a
// quantized layer saved as its int8 weights with their per-channel scales (issue 14 item 4).
#include <cmath>
#include <string>

#include "qkv/error.h"
#include "qkv/nn/mha.h"

namespace qkv::nn {

namespace {

constexpr const char* kOp = "MultiheadAttention";
constexpr const char* kWeights[] = {"in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight",
                                    "out_proj.weight"};

bool is_weight(const std::string& name) {
  for (const char* w : kWeights) {
    if (name == w) return true;
  }
  return false;
}

}  // namespace

std::map<std::string, Tensor> MultiheadAttention::quantized_state_dict() const {
  if (!quantized_) fail<ValueError>(kOp, ".quantized_state_dict: the layer is not quantized");
  std::map<std::string, Tensor> out;
  for (const auto& [name, t] : params_) {
    if (!is_weight(name)) {
      out[name] = t;  // biases (and bias_k / bias_v) stay float32
      continue;
    }
    // [out, in] per output channel, exactly as the layer's projections quantize it
    const Linear q = Linear::torch(t, std::nullopt).quantize_dynamic(weight_bits_);
    out[name] = q.quantized_weight();          // int8 [out, in]
    out[name + ".scale"] = q.weight_scales();  // f32 [out]
  }
  if (static_scales_) {
    const auto& s = *static_scales_;
    out["activation_scales"] = Tensor::from_vector<float>({s[0], s[1], s[2], s[3]}, {4});  // query, key, value, out
  }
  return out;
}

MultiheadAttention MultiheadAttention::from_quantized_state_dict(const MultiheadAttentionConfig& config,
                                                                 const std::map<std::string, Tensor>& state_dict) {
  std::map<std::string, Tensor> f32;  // weights dequantized: int8 * scale per row
  bool seven_bit = true;              // every weight in [-63, 63]: quantize_dynamic(7)'s
  for (const auto& [name, t] : state_dict) {
    if (name == "activation_scales") continue;
    if (name.ends_with(".scale")) {  // a weight's scales, read with it; any other is unexpected
      const std::string stem = name.substr(0, name.size() - 6);
      if (!is_weight(stem) || !state_dict.count(stem)) {
        fail<ValueError>(
            kOp, ".from_quantized_state_dict: unexpected key '", name,
            "' (scales belong to a projection weight of the layer's own keys, no prefix: in_proj_weight.scale, "
            "out_proj.weight.scale, ...)");
      }
      continue;
    }
    if (!is_weight(name)) {
      f32[name] = t;
      continue;
    }
    const auto scale = state_dict.find(name + ".scale");
    if (t.dtype() != DType::i8 || t.dim() != 2 || scale == state_dict.end() || scale->second.dim() != 1 ||
        scale->second.size(0) != t.size(0)) {
      fail<ValueError>(kOp, ".from_quantized_state_dict: '", name, "' must be int8 [out, in] with '", name,
                       ".scale' [out], got ", dtype_name(t.dtype()), " ", shape_str(t.shape()));
    }
    const Tensor s = scale->second.to(DType::f32).contiguous().unsqueeze(1);  // [out, 1]
    Tensor w = t.to(DType::f32).contiguous();                                 // [out, in]
    for (int64_t r = 0; r < w.size(0); ++r) {
      const float sr = s.data<float>()[r];
      // max|w_n| / 127 (1 for an all-zero row; NaN for a row holding a NaN or an inf, as the
      // saved layer computed it) is never negative or infinite: a negative scale loaded that
      // channel's weights negated without a word
      if (sr < 0.0f || std::isinf(sr)) {
        fail<ValueError>(kOp, ".from_quantized_state_dict: '", name, ".scale'[", r,
                         "] must be >= 0 and finite (max|w| / 127), got ", sr);
      }
      float* row = w.data<float>() + r * w.size(1);
      for (int64_t c = 0; c < w.size(1); ++c) {
        seven_bit = seven_bit && std::fabs(row[c]) <= 63.0f;  // the int8 value, before its scale
        row[c] *= sr;
      }
    }
    f32[name] = w;
  }
  MultiheadAttention layer = from_state_dict(config, f32);
  layer.quantized_ = true;
  layer.weight_bits_ = seven_bit ? 7 : 8;
  if (const auto a = state_dict.find("activation_scales"); a != state_dict.end()) {
    const auto v = a->second.to_vector<float>();
    if (v.size() != 4) fail<ValueError>(kOp, ".from_quantized_state_dict: activation_scales must hold 4 values");
    for (float x : v) {  // else Linear's "quantize_static needs a positive finite activation scale", naming no key
      if (!(x > 0.0f) || !std::isfinite(x)) {
        fail<ValueError>(kOp, ".from_quantized_state_dict: activation_scales must be positive and finite, got ", x);
      }
    }
    layer.static_scales_ = std::array<float, 4>{v[0], v[1], v[2], v[3]};
  }
  layer.rebuild();  // re-quantizing int8 * scale gives back the same int8 weights and scales
  return layer;
}

}  // namespace qkv::nn
