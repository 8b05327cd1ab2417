// Rotary position embeddings (RoPE; Su et al. 2021), as Llama / GPT-NeoX and GPT-J apply them
// to queries and keys before attention (issue 17).
//
// For the first rotary_dim features (even; 0 = all D), pair i < rotary_dim / 2 of a row at
// position p turns by the angle p * base^(-2i / rotary_dim):
//   neox (GPT-NeoX, Llama, Hugging Face's rotate_half): the pair is (x[i], x[i + rotary_dim/2]);
//   gptj (GPT-J, interleaved):                           the pair is (x[2i], x[2i + 1]);
//   (a, b) -> (a cos - b sin, b cos + a sin). Features past rotary_dim are copied unchanged.
// x is [..., T, D] (any float dtype; the result has x's dtype, computed in float32 with the angles
// in float64, or float64 for f64 x); positions are offset + t, or given: an integer tensor [T]
// for every row, or [B, T] for x [B, H, T, D] (ragged batches: each sequence its own positions).
// q.k of two rotated rows depends only on the difference of their positions.
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/tensor.h"

namespace qkv {

enum class RotaryLayout { neox, gptj };

struct RotaryOptions {
  double base = 10000.0;
  RotaryLayout layout = RotaryLayout::neox;
  int64_t rotary_dim = 0;           // even, <= D; 0: D
  int64_t offset = 0;               // positions offset + t when `positions` is not given
  std::optional<Tensor> positions;  // integer [T] or [B, T]
};

Tensor apply_rotary(const Tensor& x, const RotaryOptions& options = {});
// The oracle: float64 loops, one thread.
Tensor apply_rotary_reference(const Tensor& x, const RotaryOptions& options = {});

}  // namespace qkv
