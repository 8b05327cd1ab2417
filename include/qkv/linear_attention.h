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

// The feature map phi of linear attention.
//   elu:   phi(x) = elu(x) + 1 (Katharopoulos et al.), D features.
//   favor: Performer's FAVOR+ positive random features (Choromanski et al. 2021), which make
//          phi(q) . phi(k) an unbiased estimate of exp(q . k / sqrt(D)), i.e. of softmax
//          attention: phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m) with x' = x / D^(1/4) and W
//          [m, D] orthogonal Gaussian rows (favor_random_features). For range the kernel
//          shifts the key exponents per feature by their maximum over the keys (causal: the
//          keys up to the chunk's end) and each query row by its largest shifted exponent:
//          shifts the ratio cancels exactly, which keep every exponent <= 0 and each row's
//          largest term at 1 (a causal row whose shift came from a later key of its chunk is
//          recomputed with its own prefix's), so finite inputs give finite outputs at any
//          scale; no epsilon is added to the features (Performer's code adds 1e-6: a bias).
enum class LinearFeatureMap { elu, favor };

// FAVOR+'s W [m, D] (float64) from `seed`: blocks of D Gaussian rows made orthonormal
// (Gram-Schmidt), each row then scaled by the norm of an independent Gaussian D-vector,
// as the Performer paper does; Philox-based, so the same on every machine.
Tensor favor_random_features(int64_t d, int64_t m, uint64_t seed);

struct LinearAttentionOptions {
  bool is_causal = false;
  LinearFeatureMap feature_map = LinearFeatureMap::elu;
  int64_t num_features = 0;  // favor: m (0: 2 D); elu: unused
  uint64_t seed = 0;         // favor: W's seed (redraw by changing it)
  // Causal: rows per chunk. Within a chunk the causal part is a small masked [C, C] product;
  // across chunks a running sum of phi(k) v^T carries the prefix (as chunked prefix sums do,
  // which keeps the sums' rounding like the non-causal one's). >= 1 (ValueError otherwise).
  int64_t chunk = 64;
};

// The fused CPU kernel: per batch entry, qkv::gemm over phi(K)^T V (non-causal), or chunked
// prefix sums (causal); batch entries on parallel_for.
Tensor linear_attention(const Tensor& q, const Tensor& k, const Tensor& v, const LinearAttentionOptions& options = {});

// The oracle: float64 loops, one thread, straight from the formula (every j for each i);
// FAVOR+'s weights phi(q_i) . phi(k_j) in log space (logsumexp over the features), so it
// holds at inputs whose features over- or underflow float64.
Tensor linear_attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                  const LinearAttentionOptions& options = {});

}  // namespace qkv
