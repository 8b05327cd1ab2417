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
//
// Positions must lie within +-kMaxRotaryPosition = 2^53 (ValueError naming the position, and the
// offset and T that made it): float64, in which the angles are taken, holds every integer only up
// to 2^53 (past it a row would turn at a neighbouring position), and offset + t is checked before
// it is added (it overflowed int64 near INT64_MAX). Below 2^53 an angle p theta_i is still off by up
// to |p| 2^-53 rad (theta_i is a rounded float64; theta_0 = 1 is exact): under float32's 2^-24 for
// |p| < 2^29. Hugging Face's Llama rotary takes inv_freq x position_ids in float32 (positions exact
// only to 2^24, angles off by up to |p| 2^-24 rad); ONNX Runtime's RotaryEmbedding and
// GroupQueryAttention look positions up as int32 rows of cos/sin tables the caller computed.
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/tensor.h"

namespace qkv {

enum class RotaryLayout { neox, gptj };

// The largest |position| (2^53, the end of float64's exact integers).
inline constexpr int64_t kMaxRotaryPosition = int64_t{1} << 53;

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
