// Keras' attention masks and axis bookkeeping for KerasMultiHeadAttention.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "qkv/nn/keras_mha.h"
#include "qkv/tensor.h"

namespace qkv::nn::detail {

// Which projected axes are batch axes (0, the unattended token axes) and which are attended.
struct KerasAxes {
  std::vector<int64_t> batch;      // input axes, in order, heads excluded
  std::vector<int64_t> attention;  // input axes, in the given order
};

// The combined Keras mask (bool, True = attend), reshaped for scaled_dot_product_attention:
// [mask batch..., 1 (heads), T, S] with the mask batch dims aligned to the left of
// [batch axes..., N] as Keras' expand_dims at the heads axis does. nullopt when no mask.
std::optional<Tensor> keras_attention_mask(const Tensor& query, const Tensor& value,
                                           const KerasMultiHeadAttentionOptions& options, const KerasAxes& axes);

// Rows of `mask` (broadcast to [batch..., N, T, S]) with no key left get Keras' uniform
// softmax: out[.., t, :] = mean over keys of v, scores[.., t, :] = 1/S.
// out [batch..., N, T, Dv] and scores [batch..., N, T, S] are contiguous; v [batch..., N, S, Dv].
void fill_fully_masked_rows(const Tensor& mask, const Tensor& v, const Tensor& out,
                            const std::optional<Tensor>& scores);

}  // namespace qkv::nn::detail
