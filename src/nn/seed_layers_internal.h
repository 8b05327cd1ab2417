// Checks and weight-row orders shared by the seed layers' forward (seed_layers.cc) and
// backward (seed_layers_backward.cc).
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/tensor.h"

namespace qkv::nn::detail {

// x [B, T, dim] must be 3-D with `dim` features: ShapeError naming layer and `what`.
void check_3d(const Tensor& x, int64_t dim, const char* layer, const char* what);
// q [B, Lq, .], k [B, Lk, .], v [B, Lk, .] must agree in batch and key length.
void check_qkv_agree(const Tensor& q, const Tensor& k, const Tensor& v, const char* layer);
// mask [T, T], True = masked (masked_fill(mask, -inf)) -> additive f32.
std::optional<Tensor> seed_mask(const std::optional<Tensor>& mask, int64_t t, const char* layer);
// Rows of a [d*k, in] weight ordered (d k) -> ordered (k d) (einops 'b t (d k) -> k b t d').
Tensor rows_dk_to_kd(const Tensor& w, int64_t d, int64_t k);
// The inverse permutation: rows ordered (k d) -> (d k). A permutation's gradient is its
// inverse, so this maps a gradient of the reordered weight back to the state_dict's rows.
Tensor rows_kd_to_dk(const Tensor& w, int64_t d, int64_t k);

}  // namespace qkv::nn::detail
