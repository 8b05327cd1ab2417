// qkv::nn::MultiheadAttention: torch.nn.MultiheadAttention's semantics, forward and backward.
//
// Parameters and their state_dict names are PyTorch's:
//   in_proj_weight [3E, E] (rows q | k | v) and in_proj_bias [3E] when kdim == vdim == E,
//   else q_proj_weight [E, E], k_proj_weight [E, kdim], v_proj_weight [E, vdim] (+ in_proj_bias);
//   bias_k, bias_v [1, 1, E] (add_bias_kv); out_proj.weight [E, E], out_proj.bias [E].
// Inputs: query [L, N, E], key [S, N, kdim], value [S, N, vdim] ([N, L, E] ... with
//   batch_first), or unbatched [L, E], [S, kdim], [S, vdim]; float32, or float64, float16,
//   bfloat16 computed in float32 (DTypeError for integer and bool inputs, as torch refuses them).
// Masks are PyTorch's (the opposite of scaled_dot_product_attention's):
//   key_padding_mask [N, S] (or [S]): bool True = ignore that key, float = added;
//   attn_mask [L, S] or [N * H, L, S]: bool True = not allowed, float = added.
//   add_bias_kv / add_zero_attn append key positions that every mask lets through.
//   is_causal is PyTorch's hint: it needs attn_mask (ValueError otherwise, as torch).
// Output [L, N, E] (or [N, L, E] / [L, E]); with need_weights the weights [N, L, S]
//   averaged over heads, or [N, H, L, S] with average_attn_weights = false.
// Attention runs through qkv::scaled_dot_product_attention; projections through
// nn::Linear (qkv::gemm); self-attention (query, key and value the same tensor) with
// packed weights projects with one GEMM, as PyTorch does. Dropout applies only when
// `training` is set (default: eval). A fully masked row gives zeros, where PyTorch's
// need_weights path gives NaN.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "qkv/attention.h"
#include "qkv/kv_cache.h"
#include "qkv/nn/layer_attention.h"
#include "qkv/nn/linear.h"
#include "qkv/tensor.h"

namespace qkv::nn {

struct MultiheadAttentionConfig {
  int64_t embed_dim = 0;
  int64_t num_heads = 1;
  double dropout = 0.0;
  bool bias = true;
  bool add_bias_kv = false;
  bool add_zero_attn = false;
  std::optional<int64_t> kdim;  // default embed_dim
  std::optional<int64_t> vdim;  // default embed_dim
  bool batch_first = false;
};

struct MultiheadAttentionOptions {
  std::optional<Tensor> key_padding_mask;  // [N, S] (True = ignore) or float
  bool need_weights = true;
  std::optional<Tensor> attn_mask;  // [L, S] or [N*H, L, S]; bool True = not allowed, or float
  bool average_attn_weights = true;
  bool is_causal = false;
  // Mask and score modifiers of the attention (qkv/attention_mods.h: sliding windows, prefix-LM,
  // global tokens, BigBird blocks, documents, ALiBi, softcap, ...) over query positions [0, L)
  // and key positions [0, S), AND-ed with the masks above; empty tiles are skipped. ValueError
  // with add_bias_kv / add_zero_attn (their appended keys have no position).
  AttentionMods mods;
  // The attention between the projections (qkv/nn/layer_attention.h): softmax (default), linear
  // (elu + 1 or Performer FAVOR+) or lsh (Reformer: the query projection is the shared
  // query-key, so query must be key). linear and lsh: forward only, need_weights = false, no
  // masks, is_causal hint, mods, dropout or bias_kv / zero_attn (ValueError); causality from the
  // choice's own is_causal.
  LayerAttention attention;
};

// quantize_static's observers of the projections' inputs.
struct CalibrationOptions {
  ActivationObserver::Kind observer = ActivationObserver::Kind::min_max;
  double percentile = 99.99;  // for Kind::percentile
  int weight_bits = 0;        // as MultiheadAttention::quantize_dynamic's
};

// Gradients of a loss through MultiheadAttention::forward (MultiheadAttention::backward).
struct MultiheadAttentionGradients {
  Tensor query, key, value;              // d loss / d input, the inputs' shapes (f32)
  std::map<std::string, Tensor> params;  // d loss / d parameter, by state_dict name and shape
};

struct MultiheadAttentionResult {
  Tensor output;                  // [L, N, E] / [N, L, E] / [L, E]
  std::optional<Tensor> weights;  // [N, L, S] or [N, H, L, S] (no N when unbatched)
};

class MultiheadAttention {
 public:
  // Parameters initialised as PyTorch's _reset_parameters does (xavier-uniform
  // projections, zero biases), from `seed`. ValueError for embed_dim % num_heads != 0.
  explicit MultiheadAttention(const MultiheadAttentionConfig& config, uint64_t seed = 0);
  // A layer with the given state_dict (see load_state_dict), or with one layer's out of a
  // larger one (mha_state_dict: "<prefix>.in_proj_weight", ...; the prefix is found when
  // there is one MultiheadAttention layer).
  static MultiheadAttention from_state_dict(const MultiheadAttentionConfig& config,
                                            const std::map<std::string, Tensor>& state_dict,
                                            const std::string& prefix = "");

  // PyTorch's key names (above). strict: every expected key present and no unknown
  // key (ValueError naming them); shapes checked (ShapeError). A dynamically quantized layer
  // re-quantizes the new weights; a statically quantized one refuses (ValueError: its activation
  // scales were calibrated with its own weights, as torch.ao's converted modules refuse float
  // weights): load into a float32 layer and quantize_static again.
  void load_state_dict(const std::map<std::string, Tensor>& state_dict, bool strict = true);
  std::map<std::string, Tensor> state_dict() const;

  MultiheadAttentionResult forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const MultiheadAttentionOptions& options = {}) const;

  // Self-attention of new tokens x ([L, N, E], [N, L, E] with batch_first, or [L, E]) against
  // `cache` (qkv/kv_cache.h; [N, H, capacity, E/H]): their keys and values are appended, then
  // each new token attends every cached position up to its own (causal, offset by what the
  // cache held: prefill with L tokens, then decode one at a time). Equal to forward(x, x, x)
  // with a causal attn_mask over the whole sequence so far. Eval only; ValueError for
  // add_bias_kv / add_zero_attn / quantized layers, ShapeError for a cache of other sizes.
  // Output as forward's (no weights). mha_cached.cc.
  MultiheadAttentionResult forward(const Tensor& x, KVCache& cache) const;

  // Backward of forward(query, key, value, options): given grad_output = d loss / d output
  // (the output's shape), the gradients of the inputs and of every parameter, named as
  // torch.nn.MultiheadAttention's state_dict (in_proj_weight / q_proj_weight, k_proj_weight,
  // v_proj_weight, in_proj_bias, bias_k, bias_v [1, 1, E], out_proj.weight, out_proj.bias).
  // Every option of the forward: masks and is_causal are constants, dropout (training) is
  // redrawn from dropout_seed; add_bias_kv's bias_k/bias_v get the sum over the batch of
  // their appended key/value row's gradient; add_zero_attn's zero row is a constant (no
  // parameter) that takes part in every softmax. When query, key and value are one tensor
  // (self-attention), its gradient is the sum of the three. Float32 layers only
  // (ValueError when quantized). mha_backward.cc.
  MultiheadAttentionGradients backward(const Tensor& query, const Tensor& key, const Tensor& value,
                                       const Tensor& grad_output, const MultiheadAttentionOptions& options = {}) const;

  // Dynamic int8 quantization of every projection (Linear::quantize_dynamic: int8 weights
  // per output channel, activations per token at run time, int8 GEMMs with int32
  // accumulation); attention itself stays float32. The float32 parameters are kept
  // (state_dict() returns them; load_state_dict re-quantizes). As
  // torch.ao.quantization.quantize_dynamic on a model whose projections are nn.Linear.
  // weight_bits: 8, 7 or 0 for this CPU's choice (Linear::quantize_dynamic: 7-bit weights
  // where the CPU has no VNNI, so that its int8 GEMMs run at int8 speed).
  // On a statically quantized layer: the dynamic one (its activation scales dropped).
  MultiheadAttention quantize_dynamic(int weight_bits = 0) const;
  // Static int8 quantization (seed 002): runs the float32 layer on the calibration
  // `batches` ({query, key, value} each, the forward's layouts; default options),
  // observing the inputs of the query, key and value projections and of the output
  // projection, then quantizes as quantize_dynamic but with one fixed activation scale
  // per projection from those observers (torch.ao's static quantization, symmetric).
  // ValueError for no batches; the forward's errors for bad ones.
  MultiheadAttention quantize_static(const std::vector<std::array<Tensor, 3>>& batches,
                                     const CalibrationOptions& options = {}) const;
  bool quantized() const { return quantized_; }
  int weight_bits() const { return quantized_ ? weight_bits_ : 0; }  // 8 or 7; 0 when not quantized
  // A quantized layer as a file can hold it (safetensors through qkv::io::save): each projection
  // weight as int8 [out, in] ("in_proj_weight", "out_proj.weight", ...) with "<name>.scale" f32
  // [out] (its per-channel scales), biases float32, and for static quantization
  // "activation_scales" [4] (query, key, value, output inputs). ValueError unless quantized().
  // from_quantized_state_dict gives back a layer with exactly those int8 weights and scales
  // (7-bit when every weight lies in [-63, 63], as quantize_dynamic(7) makes them).
  std::map<std::string, Tensor> quantized_state_dict() const;
  static MultiheadAttention from_quantized_state_dict(const MultiheadAttentionConfig& config,
                                                      const std::map<std::string, Tensor>& state_dict);

  const MultiheadAttentionConfig& config() const { return config_; }
  int64_t head_dim() const { return config_.embed_dim / config_.num_heads; }
  bool training = false;      // dropout only when set
  uint64_t dropout_seed = 0;  // seed of scaled_dot_product_attention's dropout

 private:
  // The checked inputs of a call in the sequence-first (or batch-first) batched layout.
  struct Prepared {
    bool batched = true, bf = false, self = false, kv_shared = false;
    int64_t n = 0, l = 0, s = 0;  // batch, query length, key length
    Tensor qi, ki, vi;            // [L, N, E] (or [N, L, E])
  };
  Prepared prepare(const Tensor& query, const Tensor& key, const Tensor& value) const;
  // scaled_dot_product_attention's mask, causal flag and dropout for the call (`extra`
  // appended key rows: bias_kv, zero_attn).
  AttentionOptions attention_options(const MultiheadAttentionOptions& o, const Prepared& in, int64_t extra) const;

  void rebuild();  // Linear views over the parameters
  bool packed() const;
  // q/k/v projections [L, N, E]: one GEMM for self-attention, one for k and v when shared.
  void project(const Tensor& q, const Tensor& k, const Tensor& v, bool self, bool kv_shared, Tensor& qp, Tensor& kp,
               Tensor& vp) const;

  struct Calibration;  // quantize_static's observers (mha.cc)

  MultiheadAttentionConfig config_;
  bool quantized_ = false;                             // projections int8 (quantize_dynamic / quantize_static)
  int weight_bits_ = 8;                                // of the int8 projections: 8 or 7
  std::optional<std::array<float, 4>> static_scales_;  // query, key, value, attention output
  std::shared_ptr<Calibration> calibrating_;           // set while quantize_static runs batches
  std::map<std::string, Tensor> params_;               // PyTorch names -> f32 tensors
  Linear q_, k_, v_, qkv_, kv_, out_;                  // kv_/qkv_: packed rows for self/kv-shared attention
};

// One MultiheadAttention's state_dict out of a model's (or of what qkv::io::load returns for
// `qkv convert --to torch`'s file: "multi_head_attention.in_proj_weight", ...): the keys
// under `prefix` ("multi_head_attention" or "multi_head_attention.", or the end of a dotted
// path), prefix removed. Empty prefix: the only layer with an out_proj.weight (unprefixed keys
// included). ValueError naming the layers and listing the keys found when there is none, or
// several and no prefix.
// layer.quantize_dynamic(), as torch.ao.quantization.quantize_dynamic(model) is called.
inline MultiheadAttention quantize_dynamic(const MultiheadAttention& layer, int weight_bits = 0) {
  return layer.quantize_dynamic(weight_bits);
}

std::map<std::string, Tensor> mha_state_dict(const std::map<std::string, Tensor>& tensors,
                                             const std::string& prefix = "");

}  // namespace qkv::nn
