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

// The checked axes of a call (keras_mha.cc): `given` is the config's attention_axes (empty:
// Keras' default); ShapeError (naming `op`) for unequal ranks or batch axes, ValueError for
// an axis that is not a token axis.
KerasAxes keras_axes(const std::vector<int64_t>& given, const Tensor& query, const Tensor& value, const Tensor& key,
                     const char* op);
// x [B, A.., N*D] (projected) -> [batch axes..., N, T, D], the attended axes flattened into T.
Tensor to_attention_layout(const Tensor& x, int64_t heads, const KerasAxes& axes);
// Its inverse: x [batch axes..., N, T, D] -> [B, A.., N*D], `input` the shape of the input
// whose axes T flattens (its last size is ignored).
Tensor from_attention_layout(const Tensor& x, const Shape& input, const KerasAxes& axes);

// The combined Keras mask (bool, True = attend), reshaped for scaled_dot_product_attention:
// [mask batch..., 1 (heads), T, S] with the mask batch dims aligned to the left of
// [batch axes..., N] as Keras' expand_dims at the heads axis does. nullopt when no mask.
// sliding_window w adds Keras' band [1, T, S] |row - col| < w over axis 1 (ValueError unless
// axis 1 is the only attention axis).
std::optional<Tensor> keras_attention_mask(const Tensor& query, const Tensor& value,
                                           const KerasMultiHeadAttentionOptions& options, const KerasAxes& axes,
                                           std::optional<int64_t> sliding_window = std::nullopt);

// use_gate: sigmoid(gate.forward(query)) [B, A.., N*vd], f32 contiguous.
Tensor keras_gate(const Linear& gate, const Tensor& query);
// a * b elementwise (one shape), f32 contiguous.
Tensor multiply(const Tensor& a, const Tensor& b);

// Rows of `mask` (broadcast to [batch..., N, T, S]) with no key left get Keras' uniform
// softmax: out[.., t, :] = mean over keys of v, scores[.., t, :] = 1/S.
// out [batch..., N, T, Dv] and scores [batch..., N, T, S] are contiguous; v [batch..., N, S, Dv].
void fill_fully_masked_rows(const Tensor& mask, const Tensor& v, const Tensor& out,
                            const std::optional<Tensor>& scores);

}  // namespace qkv::nn::detail
