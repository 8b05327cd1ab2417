// Scaled dot-product attention.
//
// Conventions (those of torch.nn.functional.scaled_dot_product_attention):
//   q [..., Hq, Lq, Dk], k [..., Hk, Lk, Dk], v [..., Hk, Lk, Dv]; Dk != Dv and
//   Lq != Lk are allowed. Leading dims broadcast (numpy rules) between q, k and v.
//   scores = q @ k^T * scale, scale defaults to 1/sqrt(Dk).
//   attn_mask broadcasts to [..., Lq, Lk]: boolean True = take part (False -> -inf),
//     or floating = added to the scaled scores.
//   is_causal: position i attends to j <= i (top-left aligned, as torch.tril);
//     ValueError together with attn_mask, as PyTorch.
//   enable_gqa: k/v heads (dim -3) may divide q heads; q head h uses k/v head
//     h / (Hq / Hk) (torch's repeat_interleave). Without it heads must broadcast.
//     Hq = 0 gives an empty [..., 0, Lq, Dv] for any Hk > 0, as torch (Hk = 0: ShapeError).
//   weights = softmax(scores, -1); a row with every key masked gives weights 0
//     and output 0 (PyTorch >= 2.5 _safe_softmax), not NaN.
//   Dk == 0: every score is 0 (the empty dot product, whatever the scale).
//   dropout_p > 0: weights[idx] is zeroed with probability dropout_p and the
//     survivors scaled by 1/(1-dropout_p); idx is the row-major index into the
//     broadcast [..., Hq, Lq, Lk] weights, drawn by random::dropout_keep(seed, idx).
//     dropout_p == 1 gives zeros.
//   return_weights: also returns the weights actually applied to v (after dropout).
//   output [..., Hq, Lq, Dv] in q's dtype (f16/bf16 inputs are computed in f32/f64).
//   return_logsumexp: also returns lse[..., Hq, Lq] = log sum_j exp(score_ij)
//     over the scaled, masked scores before dropout (-inf for a fully masked row),
//     what a backward pass needs to recompute the weights as exp(score - lse);
//     f32, or f64 for f64 inputs (PyTorch's CPU kernel: its accumulation type).
//
// NaN and Inf (PyTorch's math backend, checked against it by
// tests/attention/nonfinite_test.cc; the reference and every kernel agree):
//   - A row's keys are j < Lk, or j <= i with is_causal. Causal masking removes
//     the keys after the diagonal, whatever q_i . k_j is (PyTorch's CPU flash
//     kernel; its math backend adds -inf there instead, so a NaN or +inf
//     q_i . k_j after the diagonal turns the row NaN in it, not in qkv).
//   - A mask adds to the score: bool False adds -inf, as PyTorch converts it, so
//     a NaN or +inf score stays NaN under a False entry; NaN in a float mask is a
//     NaN score.
//   - A row with a NaN score, or a +inf score (inf - inf = NaN in the softmax),
//     is NaN: every weight of its keys, its output and its lse. This includes
//     NaN or Inf in q_i, a NaN in any k_j of the row, and +-Inf in k_j that meets
//     a non-zero q_i.
//   - A row whose every score is -inf (bool False, -inf in a float mask, or
//     -inf from q_i . k_j) gives weights 0, lse -inf (PyTorch's CPU kernel
//     writes 0 there, CUDA FlashAttention +inf: sentinels for their backward
//     passes; qkv gives log 0) and output sum_j 0 * v_j: 0, or NaN in the
//     columns where a v_j of the row is NaN or Inf, as in PyTorch.
//   - output_i = sum_j w_ij v_j over the row's keys, zero weights included: a
//     NaN or Inf in v_j makes column d NaN (or +-Inf) in every row that has key j.
//     Under is_causal, whether it also reaches rows i < j is unspecified: the
//     fused kernel's diagonal tile may multiply it by 0, the reference does not
//     (PyTorch's math backend always does, its flash kernel within a 512-key block).
//   PyTorch's CPU flash kernel (its default backend here) gives 0 instead of NaN
//   for f32, f16 and bf16 rows whose every score is NaN (a NaN or an all-Inf
//   q_i; torch 2.15); qkv follows the math backend and float64 there.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

#include "qkv/attention_mods.h"
#include "qkv/tensor.h"

namespace qkv {

// Tiles of the fused CPU kernel (src/attention/attention_cpu.cc): query rows and
// key/value rows per tile. They change speed and float rounding (the order of
// the sums), never the contract. Both 0 (the default) = automatic: chosen from
// the L2 cache size and the shapes (src/attention/flash_tiles.h), unless the
// environment variable QKV_FLASH_TILES=BRxBC (e.g. "64x256"; read once, at the
// first call) overrides that choice for tuning runs. Tiles set here win over
// both. Either both positive or both 0 (ValueError otherwise); tiles larger than
// Lq or Lk are cut to them. Other kernels (the reference, float64) ignore them.
struct FlashTiles {
  int64_t br = 0;  // query rows per tile
  int64_t bc = 0;  // key/value rows per tile
  bool is_auto() const { return br == 0 && bc == 0; }
};

// Reduced precision for float32 inputs, by torch.set_float32_matmul_precision's names.
//   highest  (default) float32 products, float32 accumulation: exact f32.
//   high     the same on CPUs: PyTorch's "high" means TF32 or bf16x3 where the hardware
//            has a fast path for them, and no CPU qkv runs on has TF32.
//   medium   the fused kernel's tile products on bfloat16 operands (Q rows, K and V tiles
//            and P rounded to bf16 per tile, float32 accumulation; softmax and the
//            output stay float32) where qkv::gemm has a native bf16 kernel
//            (gemm_has_native: AVX512-BF16, AMX); elsewhere exact f32, since emulated
//            bf16 would only be slower. The error it costs: docs/performance-precision.md.
// Other dtypes ignore it (bf16/f16 already compute in their type, f64 in float64), as
// do the reference and the backward.
enum class MatmulPrecision { highest, high, medium };

// "highest", "high", "medium"; anything else is a ValueError "<what> must be 'highest', 'high'
// or 'medium', got '<name>'" (`what` names the caller's option: a layer's
// attention_options['matmul_precision'], by default scaled_dot_product_attention's).
MatmulPrecision matmul_precision_from_name(std::string_view name,
                                           std::string_view what = "scaled_dot_product_attention: matmul_precision");
std::string_view matmul_precision_name(MatmulPrecision precision);

// Opt-in int8 Q K^T in the fused kernel (SageAttention, Zhang et al. 2024), float32
// inputs only (ValueError for other dtypes, and from the backward):
//   none            (default) Q K^T as matmul_precision says.
//   int8            K smoothed (its mean over the keys of each (batch, head) subtracted per
//                   channel), then quantized symmetrically per block of 64 keys; Q quantized
//                   per query tile of the kernel; S = s_q s_k (q8 . k8) on an int8 x int8 ->
//                   int32 qkv::gemm, plus q . mean(k) added back per row, so that the scores
//                   (and the logsumexp, weights and score modifiers) approximate the exact
//                   ones; softmax float32; P V as matmul_precision says (float32, or bf16 tiles
//                   with "medium"). Masks, causal, GQA, dropout and return_weights keep working.
//   int8_unsmoothed the same without the smoothing (SageAttention's smooth_k=False): keys
//                   with a large per-channel offset, as LLMs' have, then lose their precision.
// A Q tile or a (batch, head) of K with a NaN or Inf uses the float tiles instead, so the
// NaN and Inf rules above still hold. The error it costs: docs/performance-precision.md.
enum class QKQuantization { none, int8, int8_unsmoothed };

// "none", "int8", "int8_unsmoothed" (ValueError naming the op for anything else).
QKQuantization qk_quantization_from_name(std::string_view name);
std::string_view qk_quantization_name(QKQuantization quantization);

// Kernel knobs: they choose how the result is computed, not what it is.
struct AttentionTuning {
  FlashTiles flash_tiles;  // default: automatic (see above)
  // bf16/f16 operands on float32 tiles (no native 16-bit GEMM: bf16 on AVX2, f16 without
  // AVX512-FP16): each worker widens a head's whole K and V once where they take at most this
  // many bytes as float32, else every tile where it is used. -1: automatic (8 MiB); 0: per tile.
  int64_t widen_head_bytes = -1;
};

struct AttentionOptions {
  std::optional<Tensor> attn_mask;
  double dropout_p = 0.0;
  bool is_causal = false;
  std::optional<double> scale;
  bool enable_gqa = false;
  bool return_weights = false;
  uint64_t seed = 0;                                            // dropout generator seed
  bool return_logsumexp = false;                                // also return the row logsumexp (see above)
  AttentionTuning tuning;                                       // kernel knobs (default: automatic)
  MatmulPrecision matmul_precision = MatmulPrecision::highest;  // f32 inputs only (see above)
  QKQuantization qk_quantization = QKQuantization::none;        // int8 Q K^T, f32 inputs only (see above)
  AttentionMods mods;  // score and mask modifiers (qkv/attention_mods.h); default: none
};

struct AttentionResult {
  Tensor output;                    // [..., Hq, Lq, Dv]
  std::optional<Tensor> weights;    // [..., Hq, Lq, Lk] when return_weights
  std::optional<Tensor> logsumexp;  // [..., Hq, Lq] f32 when return_logsumexp
};

// The oracle: plain loops with float64 accumulation, single-threaded. Every
// fast attention kernel is tested against it.
AttentionResult attention_reference(const Tensor& q, const Tensor& k, const Tensor& v,
                                    const AttentionOptions& options = {});

// The attention users call: the fused CPU kernel (FlashAttention-2 schedule,
// never materialising the [Lq, Lk] scores; weights, when asked for, come from a
// second fused pass), in float32 for f32/f16/bf16 inputs and in float64 for f64
// inputs; Dk == 0 runs it on one zero column of q and k (every score exactly 0).
// Errors name "scaled_dot_product_attention".
AttentionResult scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttentionOptions& options = {});

// Variable-length batches (FlashAttention's varlen layout): N sequences of different
// lengths packed along dim 0, no padding.
//   q [Tq, Hq, Dk], k [Tk, Hk, Dk], v [Tk, Hk, Dv]; sequence s is rows
//   cu_seqlens_q[s] .. cu_seqlens_q[s+1] of q and cu_seqlens_k[s] .. cu_seqlens_k[s+1]
//   of k and v (int32 or int64, [N + 1], starting at 0, non-decreasing, ending at Tq
//   and Tk; on the CPU or the tensors' device). Each sequence attends only to itself.
//   options: is_causal (per sequence, top-left), scale, enable_gqa (Hk divides Hq),
//   return_logsumexp; attn_mask, dropout, return_weights and mods are a ValueError.
//   output [Tq, Hq, Dv] in q's dtype; logsumexp [Hq, Tq] float32 (float64 for f64).
// On the CPU each sequence runs scaled_dot_product_attention on views; on a GPU one
// launch covers every sequence (docs/cuda.md). Errors name
// "scaled_dot_product_attention_varlen".
AttentionResult scaled_dot_product_attention_varlen(const Tensor& q, const Tensor& k, const Tensor& v,
                                                    const Tensor& cu_seqlens_q, const Tensor& cu_seqlens_k,
                                                    const AttentionOptions& options = {});

}  // namespace qkv
