// Internal to LSH attention (qkv/lsh_attention.h): the checked problem shared by the
// dispatcher (lsh_attention.cc), the CPU kernel (lsh_attention_cpu.cc) and the reference
// (lsh_attention_reference.cc).
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/lsh_attention.h"

namespace qkv::attention {

struct LshProblem {
  int64_t batch = 1;  // entries: the product of the leading dims (heads included)
  int64_t heads = 1;  // qk's dim -3 (1 for a 2-D qk): entry e is head e % heads
  int64_t l = 0, d = 0, dv = 0;
  Shape lead;       // the leading dims
  Shape out_shape;  // [..., L, Dv]
  DType out_dtype;  // qk's
  int64_t n_hashes = 1;
  std::vector<int64_t> factors;  // the bucket factors (one for a plain count), each even
  int64_t n_buckets = 2;         // their product; bucket n_buckets holds the padding
  int64_t half = 1;              // sum(factors) / 2: the rotations' last dim
  int64_t chunk = 64, before = 1, after = 0;
  bool causal = false;
  // L <= chunk_length: no hashing, every query sees all L keys (Reformer's standard case).
  bool standard = false;
  Tensor qk, v;               // contiguous [batch, L, D|Dv] in the compute dtype (f32 or f64)
  Tensor rotations;           // contiguous [1 or heads, D, n_hashes, half] in the compute dtype
  std::vector<uint8_t> mask;  // [batch * L], 1 = a token, 0 = padding; empty = no mask

  // The rounds and chunk geometry attention runs with (one round of one chunk when standard).
  int64_t rounds() const { return standard ? 1 : n_hashes; }
  int64_t chunk_rows() const { return standard ? l : chunk; }
  int64_t chunks_before() const { return standard ? 0 : before; }
  int64_t chunks_after() const { return standard ? 0 : after; }
  bool is_padding(int64_t e, int64_t pos) const { return !mask.empty() && mask[static_cast<size_t>(e * l + pos)] == 0; }
};

// The score of a masked key and of the query's own position (Reformer's float32 values).
inline constexpr double kLshMaskValue = -1e9;
inline constexpr double kLshSelfValue = -1e5;

// Checks qk, v and the options (errors name `op` and the shapes), lays the operands out in
// `compute` (f32 or f64) and draws the rotations when none are given.
LshProblem make_lsh_problem(const Tensor& qk, const Tensor& v, const LshAttentionOptions& options, const char* op,
                            DType compute);

// The kernel: [batch, L, Dv] in the problem's compute dtype.
Tensor lsh_attention_cpu(const LshProblem& p);
// The kernel's hashing: int64 [batch, n_hashes, L].
Tensor lsh_buckets_cpu(const LshProblem& p);

}  // namespace qkv::attention
