// Linear attention (Katharopoulos et al. 2020, "Transformers are RNNs"; seed 002's kernel
// trick): with the feature map phi(x) = elu(x) + 1 (positive, so no denominator vanishes),
//   out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T sum_j phi(k_j))
// over every key (non-causal) or over keys j <= i (causal: Lq == Lk). O(L D Dv) time and
// O(D Dv) state per head instead of O(L^2): the [Lq, Lk] scores never exist.
//
// q [..., Lq, D], k [..., Lk, D], v [..., Lk, Dv] with equal leading dims (no broadcasting);
// f32 (computed in float32) or f64 (in float64; other floating dtypes are computed in float32
// and returned in their dtype). Errors (ShapeError, DTypeError, ValueError) name
// "linear_attention" and the shapes.
#pragma once

#include <cstdint>

#include "qkv/tensor.h"

namespace qkv {

struct LinearAttentionOptions {
  bool is_causal = false;
  // Causal: rows per chunk. Within a chunk the causal part is a small masked [C, C] product;
  // across chunks a running sum of phi(k) v^T carries the prefix (as chunked prefix sums do,
  // which keeps the sums' rounding like the non-causal one's). >= 1 (ValueError otherwise).
  int64_t chunk = 64;
};

// The fused CPU kernel: per batch entry, qkv::gemm over phi(K)^T V (non-causal), or chunked
// prefix sums (causal); batch entries on parallel_for.
Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v, const LinearAttentionOptions& options = {});

// The oracle: float64 loops, one thread, straight from the formula (every j for each i).
Tensor linear_attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const LinearAttentionOptions& options = {});

}  // namespace qkv
