// Ring attention (sequence parallelism; Liu et al. 2023): each rank keeps its block of
// queries while the blocks of keys and values travel around the ring of ranks.
//
// At step s rank r holds the K/V block of rank (r - s) mod P: it posts the non-blocking
// send of that block to rank r+1 and the receive of the next from rank r-1, runs the
// fused attention kernel on the block in hand (the transfer overlaps it), and folds the
// partial output into its running output by logsumexp. After P steps every query has
// seen every key; the result equals scaled_dot_product_attention on the whole sequence.
//
// Causal: pass shards made with SequenceLayout::zigzag (shard_sequence): rank r holds
// chunks r and 2P-1-r of 2P, so every rank does the same work; a (query chunk, key chunk)
// pair above the diagonal is skipped, one below it runs unmasked, the diagonal one runs
// causal. contiguous works too (rank P-1 then does most of the work).
#pragma once

#include <optional>

#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/dist/communicator.h"
#include "qkv/dist/shard.h"

namespace qkv::dist {

struct RingAttentionOptions {
  bool is_causal = false;                              // needs equal query and key lengths
  SequenceLayout layout = SequenceLayout::contiguous;  // how q, k and v were sharded
  std::optional<double> scale;                         // default 1/sqrt(D)
  bool enable_gqa = false;                             // Hq a multiple of Hk, as SDPA
  // This rank's query rows against every key, in global key order: [..., Lq_local, Lk]
  // (bool: True = attend, or additive), broadcast over batch and heads as SDPA's.
  std::optional<Tensor> attn_mask;
  bool return_logsumexp = false;
  MatmulPrecision matmul_precision = MatmulPrecision::highest;
};

// q [..., Hq, Lq_r, D], k [..., Hk, Lk_r, D], v [..., Hk, Lk_r, Dv]: this rank's shards
// (f32) along the sequence axis (-2) in `options.layout`; every rank calls it with the same
// options. Returns this rank's output rows [..., Hq, Lq_r, Dv] (and logsumexp [..., Hq, Lq_r]).
AttentionResult ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Communicator& comm,
                               const RingAttentionOptions& options = {});

// Backward of ring_attention: this rank's dq, dk, dv ([q, k, v]'s shapes) from its shards,
// the forward's `out` and `logsumexp` (return_logsumexp) and grad_out = d loss / d out, with
// the forward's options. The K/V blocks travel the ring as in the forward, each with its
// dK/dV accumulators, which are back with their owner after P steps (2 P - 1 block
// transfers per rank). Equal to scaled_dot_product_attention_backward on the whole sequence.
AttentionGradients ring_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                           const Tensor& grad_out, const Tensor& logsumexp, const Communicator& comm,
                                           const RingAttentionOptions& options = {});

}  // namespace qkv::dist
