// LSH attention (Kitaev et al. 2020, "Reformer"; seed 002's hashing way to scale), with the
// semantics of Hugging Face transformers' ReformerModel LSHSelfAttention (eval mode):
//
// Shared query-key: one tensor qk [..., L, D] serves as the queries and, length-normalized,
// as the keys: k_j = qk_j / sqrt(mean_d(qk_jd^2) + 1e-6) / sqrt(D). Scores s_ij = qk_i . k_j
// (no further scale).
//
// Hashing: per hash round r, the rotation R_r [D, n/2] (n = the bucket count) maps qk_j to
// x = qk_j R_r and the bucket is argmax([x, -x]) (the first maximum). Several bucket factors
// n_1, n_2, ... (each even) hash with consecutive n_f/2 columns each and combine as
// b = b_1 + n_1 (b_2 + n_2 (b_3 ...)) (Reformer's factorized hash for large n). Padding tokens
// (attention_mask false) go to one extra bucket after the others.
//
// Attention: within each round the positions are sorted stably by (bucket, position); the
// rounds' sorted sequences are concatenated (round 0 first) and cut into chunks of
// chunk_length; each chunk attends to itself and to the num_chunks_before chunks before and
// num_chunks_after after it in that concatenation (circularly: the first chunk of round r looks
// back into the last chunk of round r - 1, and of round 0 into the last round's last chunk). A
// key is masked (its score replaced by -1e9, not -inf: a row with only masked keys averages
// them) when it is padding or, with is_causal (Reformer's is_decoder), when its position is
// after the query's; a key at the query's own position then scores -1e5 (not attending to
// itself unless nothing else is left). Softmax over the chunk's keys gives out_r(i) and
// lse_r(i); the rounds merge as out(i) = sum_r out_r(i) exp(lse_r(i) - logsumexp_r lse_r(i)).
// When L <= chunk_length there is no hashing: every query attends to all L keys, with the same
// masks (Reformer's "standard self-attention" case; n_hashes is then irrelevant).
//
// qk [..., L, D], v [..., L, Dv] with equal leading dims; the heads are dim -3 (1 head when
// qk is 2-D). L must be a multiple of chunk_length when L > chunk_length. f32 (computed in
// float32), f64 (in float64); other floating dtypes compute in float32 and return their dtype.
// Errors (ShapeError, DTypeError, ValueError) name "lsh_attention" and the shapes.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

struct LshAttentionOptions {
  int64_t n_hashes = 1;  // hash rounds, >= 1
  // One even bucket count, or several even factors (the buckets are their product and the
  // rotations have sum(n_f)/2 columns). Empty: Reformer's default for L (its _set_num_buckets
  // with max_position_embeddings = L): n = 2^floor(log2(2 L / chunk_length)), at least 2, and
  // past 2 max(sqrt(L / chunk_length), chunk_length) the factors [2^floor(e/2), 2^ceil(e/2)]
  // of n = 2^e (L = 65536, chunk 64: [32, 64], 48 rotation columns instead of 1024).
  std::vector<int64_t> n_buckets;
  int64_t chunk_length = 64;
  int64_t num_chunks_before = 1;
  int64_t num_chunks_after = 0;
  bool is_causal = false;  // Reformer's is_decoder: keys after the query masked
  // [H, D, n_hashes, sum(n_buckets)/2] (H = qk's heads, or 1 for every head), the layout of
  // Reformer's random_rotations; empty: lsh_random_rotations(H, D, n_hashes, sum/2, seed).
  Tensor rotations;
  uint64_t seed = 0;
  // Empty, or broadcastable to qk's [..., L] (e.g. [B, 1, L] for Reformer's [B, L] on
  // [B, H, L, D]); any dtype, nonzero = a real token, zero = padding.
  Tensor attention_mask;
};

// Random rotations [heads, d, n_hashes, half] (float64 standard normal, from qkv's
// counter-based generator: element i depends only on (seed, i)).
Tensor lsh_random_rotations(int64_t heads, int64_t d, int64_t n_hashes, int64_t half, uint64_t seed);

// The buckets each position falls in, per round: int64 [..., n_hashes, L] in [0, n] (n the
// bucket count; n itself marks padding). Hashing as lsh_attention's kernel does it.
Tensor lsh_buckets(const Tensor& qk, const LshAttentionOptions& options = {});

// The CPU kernel: hashing through qkv::gemm, a counting sort per round, chunks gathered and
// their score and value products through qkv::gemm, (batch, head, chunk) items on parallel_for.
// Memory O(n_hashes L (D + Dv)) besides the inputs: no [L, L] scores.
Tensor lsh_attention(const Tensor& qk, const Tensor& v, const LshAttentionOptions& options = {});

// The oracle: float64 loops, one thread, straight from the definition above.
Tensor lsh_attention_reference(const Tensor& qk, const Tensor& v, const LshAttentionOptions& options = {});

}  // namespace qkv
