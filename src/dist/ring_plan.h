// The geometry that ring attention's forward and backward share (qkv/dist/ring_attention.h).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "qkv/attention.h"
#include "qkv/dist/communicator.h"
#include "qkv/dist/ring_attention.h"
#include "qkv/dist/shard.h"

namespace qkv::dist {

// What a (query chunk, key chunk) pair runs: nothing (every key after every query of a
// causal pair), the plain kernel (every key at or before every query, or not causal), or
// the causal kernel (the diagonal chunk of a causal sequence).
enum class Pair { skip, full, causal };

struct QueryChunk {
  Chunk chunk;              // global positions
  int64_t local_start = 0;  // first row in this rank's shard
};

struct KeyChunk {
  Chunk chunk;              // global positions
  int64_t block_start = 0;  // first row in its rank's K/V block
};

struct RingPlan {
  int size = 1;
  int64_t lq = 0, lk = 0;           // every rank's queries and keys
  std::vector<int64_t> kv_lengths;  // keys per rank
  std::vector<QueryChunk> queries;  // this rank's
  const RingAttentionOptions* options = nullptr;

  // The key chunks of rank `src`'s K/V block.
  std::vector<KeyChunk> key_chunks(int src) const;
  Pair pair(const Chunk& q, const Chunk& k) const;
  // SDPA's options for one pair (this rank's mask rows and the key chunk's columns).
  AttentionOptions block_options(const QueryChunk& q, const KeyChunk& k, Pair kind) const;
};

// Checks the shards (f32, the layout's sizes on every rank; `op` names the errors) and
// gathers every rank's lengths (collective: every rank calls it). `more_checks` (the
// backward's saved tensors) run with the others, so that a refusal on one rank stops every rank
// at once and ranks called differently fail (agree_on_call).
RingPlan make_ring_plan(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Communicator& comm,
                        const RingAttentionOptions& options, const std::function<void()>& more_checks = {});

// `like`'s shape with its last two dimensions replaced.
Shape with_last2(const Tensor& like, int64_t rows, int64_t cols);

}  // namespace qkv::dist
