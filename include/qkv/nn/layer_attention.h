// The attention a layer runs between its projections (issue 16 item 7): the attention= choice
// of nn::MultiheadAttention (MultiheadAttentionOptions::attention) and
// nn::KerasMultiHeadAttention (KerasMultiHeadAttentionOptions::attention).
//
//   softmax (default): scaled_dot_product_attention with the layer's masks, dropout and
//            modifiers (the options' `mods`: sliding windows, BigBird, ALiBi, ...), at
//            `matmul_precision` (AttentionOptions::matmul_precision: "medium" runs the float32
//            heads through bf16 tiles where the CPU has a native bf16 GEMM, e.g. beside an int8
//            quantized layer's projections; the forward only: the backward stays float32).
//   linear:  qkv::linear_attention on the projected heads, with `linear`'s feature map (elu + 1,
//            or Performer FAVOR+, whose phi(q) . phi(k) estimates exp(q . k / sqrt(D)): the
//            layers' own softmax scale, D = the head size) and is_causal (top-left: query i sees
//            keys j <= i; needs as many queries as keys). elu + 1 has no scale.
//   lsh:     qkv::lsh_attention (Reformer's shared query-key): the query projection of the
//            input is the shared qk (Reformer's query_key projection), the value projection
//            gives v, the key projection is not used; so the call must be self-attention (the
//            key input the query input itself, ValueError otherwise). Scores are Reformer's
//            (qk_i . k_j with the keys length-normalized, /sqrt(D)), not the layer's scale.
//
// linear and lsh are forward-only (no backward exists: the layers' backward raises ValueError)
// and have no [L, S] weights; they take no masks (attn_mask, key_padding_mask, Keras' masks,
// sliding_window), no mods, no dropout while training, no add_bias_kv / add_zero_attn: each is a
// ValueError naming the layer and the choice. Causality comes from the choice's is_causal (or
// Keras' use_causal_mask, which sets it). The result equals composing the layer's projections
// with the standalone function (tests/nn/layer_attention_test.cc).
#pragma once

#include "qkv/attention.h"
#include "qkv/linear_attention.h"
#include "qkv/lsh_attention.h"

namespace qkv::nn {

enum class AttentionKind { softmax, linear, lsh };

struct LayerAttention {
  AttentionKind kind = AttentionKind::softmax;
  LinearAttentionOptions linear;                                // kind == linear
  LshAttentionOptions lsh;                                      // kind == lsh (attention_mask must stay empty)
  MatmulPrecision matmul_precision = MatmulPrecision::highest;  // kind == softmax

  static LayerAttention softmax(MatmulPrecision precision = MatmulPrecision::highest) {
    LayerAttention a;
    a.matmul_precision = precision;
    return a;
  }
  static LayerAttention linear_attention(const LinearAttentionOptions& options = {}) {
    LayerAttention a;
    a.kind = AttentionKind::linear;
    a.linear = options;
    return a;
  }
  // Performer FAVOR+: linear attention with LinearFeatureMap::favor (num_features 0: 2 D).
  static LayerAttention performer(int64_t num_features = 0, uint64_t seed = 0, bool is_causal = false) {
    LinearAttentionOptions o;
    o.feature_map = LinearFeatureMap::favor;
    o.num_features = num_features;
    o.seed = seed;
    o.is_causal = is_causal;
    return linear_attention(o);
  }
  static LayerAttention lsh_attention(const LshAttentionOptions& options = {}) {
    LayerAttention a;
    a.kind = AttentionKind::lsh;
    a.lsh = options;
    return a;
  }
};

// "softmax", "linear", "lsh".
const char* attention_kind_name(AttentionKind kind);

}  // namespace qkv::nn
