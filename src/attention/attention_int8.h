// int8 Q K^T of the fused CPU attention forward (qkv/attention.h, QKQuantization), after
// SageAttention (Zhang et al., "SageAttention: Accurate 8-bit attention for plug-and-play
// inference acceleration", 2024):
//   - K of each (batch, head) the call reads is smoothed once per call: its mean over the
//     keys is subtracted per channel. softmax_j(q . (k_j - m)) = softmax_j(q . k_j), since
//     q . m is the same for every key of a row; it removes the per-channel offset LLM keys
//     carry, which would otherwise set every block's int8 scale and drown the part of the
//     scores that differs between keys. Then K is quantized symmetrically per block of
//     kKeyBlock keys (one scale per block).
//   - The Q rows of a work item (one query tile) are quantized with one scale, and q . m
//     is kept per row.
//   - A score tile is S = scale (s_q s_k[j] (q8 . k8_j) + q . m): the int8 x int8 -> int32
//     qkv::gemm, dequantized and with q . m added back, so that the scores approximate the
//     exact ones and everything after them (score modifiers, masks, the logsumexp, the
//     weights) stays as it is.
// A Q tile or a K (batch, head) with a NaN or Inf is not quantized: those tiles take the
// float path (`ok` false), so that the NaN/Inf rules of qkv/attention.h still hold.
#pragma once

#include <cstdint>
#include <vector>

#include "attention/problem.h"

namespace qkv::attention::int8 {

// Keys per K scale: SageAttention's K block on GPUs. Per-key scales would be as cheap on a
// CPU (the dequantization multiplies by a per-column vector either way); the block keeps
// the published scheme and its error.
constexpr int64_t kKeyBlock = 64;

// K of every distinct (batch, head) of a call (broadcast and GQA heads once), smoothed and
// quantized; read-only once built.
struct QuantizedKeys {
  int64_t lk = 0, dk = 0;
  std::vector<int64_t> entry;  // [batch_size] the K entry of flat batch entry b
  std::vector<int8_t> k8;      // [entries, Lk, Dk]
  std::vector<float> scale;    // [entries, Lk] the scale of each key's block
  std::vector<float> mean;     // [entries, Dk] what was subtracted (0 without smoothing)
  std::vector<char> finite;    // [entries] no NaN or Inf in K: the int8 tiles may run
};

// p.k (float32 rows) quantized; `smooth`: subtract the mean over the keys first.
QuantizedKeys quantize_keys(const Problem& p, bool smooth);

// One worker's int8 state for its current item (reused across items).
struct QuantizedQuery {
  const QuantizedKeys* keys = nullptr;
  int64_t entry = 0;         // of keys
  bool ok = false;           // Q tile and K finite: score tiles run on int8
  float scale = 1.0f;        // s_q of the item's rows
  std::vector<int8_t> q8;    // [Br, Dk]
  std::vector<float> bias;   // [Br] q_x . mean
  std::vector<int32_t> acc;  // [Br, Bc] a tile's int32 products
  QuantizedQuery(int64_t br, int64_t bc, int64_t dk);
};

// The item's Q rows q [rows, Dk] (row stride ld) of flat batch entry b, quantized into out.
void quantize_query(const float* q, int64_t rows, int64_t ld, const QuantizedKeys& keys, int64_t b,
                    QuantizedQuery& out);

// s [rows, cols] (row stride lds) = alpha (s_q s_k[j] (q8 . k8_j) + q . mean) for keys
// j0 .. j0 + cols of the item quantized in q (q.ok).
void quantized_scores(QuantizedQuery& q, int64_t rows, int64_t j0, int64_t cols, float alpha, float* s, int64_t lds);

}  // namespace qkv::attention::int8
