// Additive attention (Bahdanau et al. 2015; Keras 3's AdditiveAttention; seed 002's
// catalogue): scores_ij = sum_d scale_d tanh(q_id + k_jd), weights = softmax_j(scores),
// out_i = sum_j weights_ij v_j. Masks follow Keras: a masked key's score is lowered by 1e9
// (not set to -inf), so a row whose every key is masked gets uniform weights, as in Keras.
//
// q [..., Tq, D], k [..., Tk, D], v [..., Tk, Dv] with equal leading dims; f32 (f64 inputs in
// float64). Errors name "additive_attention" and the shapes. (Luong's unscaled dot-product
// attention, Keras' Attention(score_mode="dot"), is scaled_dot_product_attention with
// scale = 1 or the layer's learned scalar.)
#pragma once

#include <optional>

#include "qkv/tensor.h"

namespace qkv {

struct AdditiveAttentionOptions {
  std::optional<Tensor> scale;       // [D]: Keras' use_scale weight; none: 1
  std::optional<Tensor> value_mask;  // [..., Tk] bool, False = padding (Keras' value mask)
  bool use_causal_mask = false;      // key j > query i masked the same way (Keras)
};

// The CPU kernel: batch entries and query rows on parallel_for.
Tensor additive_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                          const AdditiveAttentionOptions& options = {});
// The oracle: float64 loops from the definition, one thread.
Tensor additive_attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AdditiveAttentionOptions& options = {});

}  // namespace qkv
