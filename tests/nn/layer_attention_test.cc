// The layers' attention= choice (qkv/nn/layer_attention.h, issue 16 item 7): each choice through
// MultiheadAttention and KerasMultiHeadAttention equals the layer's own projections composed by
// hand with the standalone linear_attention / lsh_attention; what a choice cannot do is a
// ValueError; Keras' mods equal the same mask given densely, forward and backward.
#include <gtest/gtest.h>

#include <optional>
#include <utility>
#include <vector>

#include "attention/attention_test_configs.h"
#include "common/expect.h"
#include "qkv/attention.h"
#include "qkv/gemm.h"
#include "qkv/linear_attention.h"
#include "qkv/lsh_attention.h"
#include "qkv/nn/keras_mha.h"
#include "qkv/nn/layer_attention.h"
#include "qkv/nn/mha.h"

namespace qkv::nn {
namespace {

using test::max_abs_diff;  // NaN-aware, shapes checked (attention_test_configs.h)

// The choice applied to heads by the standalone functions (lsh: q is the shared query-key).
Tensor standalone(const LayerAttention& a, const Tensor& q, const Tensor& k, const Tensor& v) {
  if (a.kind == AttentionKind::softmax) {
    AttentionOptions o;
    o.matmul_precision = a.matmul_precision;
    return scaled_dot_product_attention(q, k, v, o).output;
  }
  return a.kind == AttentionKind::linear ? linear_attention(q, k, v, a.linear) : lsh_attention(q, v, a.lsh);
}

LayerAttention lsh_choice(bool causal) {
  LshAttentionOptions o;
  o.n_hashes = 2, o.n_buckets = {4}, o.chunk_length = 8, o.seed = 11, o.is_causal = causal;
  return LayerAttention::lsh_attention(o);
}

// torch.nn.MultiheadAttention by hand: in_proj rows q | k | v, heads split, the choice, out_proj.
Tensor torch_by_hand(const MultiheadAttention& m, const Tensor& xq, const Tensor& xkv, const LayerAttention& a) {
  const auto sd = m.state_dict();
  const int64_t e = m.config().embed_dim, h = m.config().num_heads, d = e / h;
  const bool bf = m.config().batch_first;
  const Tensor& w = sd.at("in_proj_weight");         // [3E, E]
  const Tensor& b = sd.at("in_proj_bias");           // [3E]
  auto heads = [&](int64_t part, const Tensor& x) {  // [L, N, E] / [N, L, E] -> [N, H, L, D]
    const Tensor p =
        Linear::torch(w.slice(0, part * e, (part + 1) * e), b.slice(0, part * e, (part + 1) * e)).forward(x);
    const Tensor v = p.view({p.size(0), p.size(1), h, d});
    return bf ? v.permute({0, 2, 1, 3}) : v.permute({1, 2, 0, 3});
  };
  const Tensor o = standalone(a, heads(0, xq), heads(1, xkv), heads(2, xkv));  // [N, H, L, D]
  const Tensor merged = (bf ? o.permute({0, 2, 1, 3}) : o.permute({2, 0, 1, 3})).reshape(xq.shape());
  return Linear::torch(sd.at("out_proj.weight"), sd.at("out_proj.bias")).forward(merged);
}

TEST(LayerAttention, TorchLayerEqualsItsProjectionsWithTheStandaloneFunction) {
  LinearAttentionOptions causal_elu;
  causal_elu.is_causal = true, causal_elu.chunk = 5;
  struct Case {
    LayerAttention a;
    bool bf, self;
  };
  const std::vector<Case> cases{{LayerAttention::linear_attention(), false, false},
                                {LayerAttention::linear_attention(causal_elu), true, true},
                                {LayerAttention::performer(32, 7), true, false},
                                {LayerAttention::performer(32, 7, true), false, true},
                                {lsh_choice(false), true, true},
                                {lsh_choice(true), false, true},
                                {LayerAttention::softmax(MatmulPrecision::medium), true, false},
                                {LayerAttention::softmax(MatmulPrecision::medium), false, true}};
  for (const Case& c : cases) {
    MultiheadAttentionConfig cfg;
    cfg.embed_dim = 16, cfg.num_heads = 4, cfg.batch_first = c.bf;
    MultiheadAttention m(cfg, 3);
    auto sd = m.state_dict();
    sd["in_proj_bias"] = Tensor::randn({48}, 4);  // nonzero biases: the projections are really composed
    sd["out_proj.bias"] = Tensor::randn({16}, 5);
    m.load_state_dict(sd);
    const Shape shape = c.bf ? Shape{2, 32, 16} : Shape{32, 2, 16};
    const Tensor xq = Tensor::randn(shape, 1), xkv = c.self ? xq : Tensor::randn(shape, 2);
    MultiheadAttentionOptions o;
    o.need_weights = false;
    o.attention = c.a;
    const MultiheadAttentionResult r = m.forward(xq, xkv, xkv, o);
    EXPECT_FALSE(r.weights.has_value());
    EXPECT_LE(max_abs_diff(r.output, torch_by_hand(m, xq, xkv, c.a)), 2e-6)
        << attention_kind_name(c.a.kind) << (c.bf ? " batch_first" : "") << (c.self ? " self" : " cross");
  }
}

// matmul_precision "medium" on the softmax attention (the int8 layer's companion): bf16 tiles
// where the CPU has a native bf16 GEMM (the output then differs from float32's), within bf16's
// error of the float32 layer everywhere; the backward stays float32.
TEST(LayerAttention, SoftmaxMatmulPrecisionReachesTheKernel) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 64, cfg.num_heads = 4, cfg.batch_first = true;
  const MultiheadAttention m(cfg, 9);
  const Tensor x = Tensor::randn({2, 100, 64}, 3);
  MultiheadAttentionOptions o;
  o.need_weights = false;
  const Tensor exact = m.forward(x, x, x, o).output;
  o.attention = LayerAttention::softmax(MatmulPrecision::medium);
  const Tensor medium = m.forward(x, x, x, o).output;
  const double scale = max_abs_diff(exact, Tensor::zeros(exact.shape()));
  const double diff = max_abs_diff(medium, exact);
  EXPECT_LE(diff, 2e-2 * scale);
  if (gemm_has_native(DType::bf16)) {
    EXPECT_GT(diff, 0.0);
  } else {
    EXPECT_EQ(diff, 0.0);
  }
}

TEST(LayerAttention, TorchLayerRefusesWhatAChoiceCannotDo) {
  MultiheadAttentionConfig cfg;
  cfg.embed_dim = 8, cfg.num_heads = 2;
  const MultiheadAttention m(cfg, 1);
  const Tensor x = Tensor::randn({16, 2, 8}, 1), y = Tensor::randn({16, 2, 8}, 2);
  MultiheadAttentionOptions o;
  o.attention = LayerAttention::linear_attention();
  EXPECT_THROW_WITH(m.forward(x, x, x, o), ValueError,
                    "MultiheadAttention: attention=linear does not support need_weights (it has no [L, S] weights");
  o.need_weights = false;
  o.attn_mask = Tensor::zeros({16, 16});
  EXPECT_THROW_WITH(m.forward(x, x, x, o), ValueError, "attention=linear does not support attn_mask");
  o.attn_mask.reset();
  o.mods = AttentionMods::sliding_window(2, 0);
  EXPECT_THROW_WITH(m.forward(x, x, x, o), ValueError, "attention=linear does not support mods");
  o.mods = {};
  MultiheadAttentionConfig dropout_cfg = cfg;
  dropout_cfg.dropout = 0.1;
  MultiheadAttention dropped(dropout_cfg, 1);
  dropped.training = true;
  EXPECT_THROW_WITH(dropped.forward(x, x, x, o), ValueError,
                    "attention=linear does not support dropout while training");
  EXPECT_THROW_WITH(m.backward(x, x, x, x, o), ValueError,
                    "MultiheadAttention.backward: attention=linear is forward-only (no backward)");
  o.attention = lsh_choice(false);
  EXPECT_THROW_WITH(m.forward(x, y, y, o), ValueError,
                    "attention=lsh uses the query projection as Reformer's shared query-key");
  cfg.add_zero_attn = true;
  EXPECT_THROW_WITH(MultiheadAttention(cfg, 1).forward(x, x, x, o), ValueError,
                    "attention=lsh does not support add_bias_kv / add_zero_attn");
}

// A built Keras layer: 2 heads of key_dim 4 over inputs of `dim` features.
KerasMultiHeadAttention small_keras(int64_t dim, uint64_t seed, std::optional<int64_t> sliding_window = std::nullopt) {
  KerasMultiHeadAttentionConfig cfg;
  cfg.num_heads = 2, cfg.key_dim = 4, cfg.sliding_window = sliding_window;
  KerasMultiHeadAttention m(cfg);
  m.build(dim, dim, dim, seed);
  return m;
}

// keras.layers.MultiHeadAttention by hand: EinsumDense projections, heads, the choice, output dense.
Tensor keras_by_hand(const KerasMultiHeadAttention& m, const Tensor& q_in, const Tensor& v_in,
                     const LayerAttention& a) {
  const std::vector<Tensor> w = m.get_weights();  // query, key, value, attention_output (kernel, bias)
  const int64_t n = m.config().num_heads;
  auto heads = [&](int64_t part, const Tensor& x) {  // [B, T, dim] -> [B, N, T, d]
    const Tensor p = Linear::keras(w[2 * part], w[2 * part + 1]).forward(x);
    return p.view({p.size(0), p.size(1), n, p.size(2) / n}).permute({0, 2, 1, 3});
  };
  const Tensor o = standalone(a, heads(0, q_in), heads(1, v_in), heads(2, v_in));  // [B, N, T, vd]
  const Tensor merged = o.permute({0, 2, 1, 3}).reshape({q_in.size(0), q_in.size(1), -1});
  return Linear::keras(w[6], w[7], 2).forward(merged);
}

TEST(LayerAttention, KerasLayerEqualsItsProjectionsWithTheStandaloneFunction) {
  LinearAttentionOptions causal;
  causal.is_causal = true;
  for (const auto& [a, self] :
       std::vector<std::pair<LayerAttention, bool>>{{LayerAttention::linear_attention(), false},
                                                    {LayerAttention::linear_attention(causal), true},
                                                    {LayerAttention::performer(24, 3), true},
                                                    {lsh_choice(false), true},
                                                    {lsh_choice(true), true},
                                                    {LayerAttention::softmax(MatmulPrecision::medium), false}}) {
    KerasMultiHeadAttention m = small_keras(12, 5);
    std::vector<Tensor> w = m.get_weights();
    for (size_t i = 1; i < w.size(); i += 2) w[i] = Tensor::randn(w[i].shape(), 20 + i);  // nonzero biases
    m.set_weights(w);
    const Tensor q = Tensor::randn({2, 16, 12}, 6), v = self ? q : Tensor::randn({2, 16, 12}, 7);
    KerasMultiHeadAttentionOptions o;
    o.attention = a;
    EXPECT_LE(max_abs_diff(std::as_const(m).forward(q, v, o).output, keras_by_hand(m, q, v, a)), 2e-6)
        << attention_kind_name(a.kind) << (self ? " self" : " cross");
  }
}

TEST(LayerAttention, KerasUseCausalMaskMakesTheChoiceCausalAndErrors) {
  KerasMultiHeadAttention m = small_keras(8, 1);
  const Tensor x = Tensor::randn({2, 16, 8}, 2), y = Tensor::randn({2, 16, 8}, 3);
  LinearAttentionOptions causal;
  causal.is_causal = true;
  KerasMultiHeadAttentionOptions o, by_choice;
  o.attention = LayerAttention::linear_attention();
  o.use_causal_mask = true;
  by_choice.attention = LayerAttention::linear_attention(causal);
  EXPECT_LE(max_abs_diff(m.forward(x, x, o).output, m.forward(x, x, by_choice).output), 0.0);
  o.return_attention_scores = true;
  EXPECT_THROW_WITH(m.forward(x, x, o), ValueError,
                    "KerasMultiHeadAttention: attention=linear does not support return_attention_scores");
  o.return_attention_scores = false;
  o.value_mask = Tensor::ones({2, 16}, DType::b8);
  EXPECT_THROW_WITH(m.forward(x, x, o), ValueError, "attention=linear does not support value_mask");
  o.value_mask.reset();
  EXPECT_THROW_WITH(m.backward(x, x, x, o), ValueError,
                    "KerasMultiHeadAttention.backward: attention=linear is forward-only");
  o.attention = lsh_choice(false);
  EXPECT_THROW_WITH(m.forward(x, y, o), ValueError, "the call must be self-attention");
  EXPECT_THROW_WITH(small_keras(8, 1, 3).forward(x, x, o), ValueError, "attention=lsh does not support sliding_window");
}

// KerasMultiHeadAttentionOptions::mods: a window of keys i-2 .. i+1 equals the same window given as
// a bool attention_mask, forward and backward.
TEST(LayerAttention, KerasModsEqualTheDenseMaskForwardAndBackward) {
  KerasMultiHeadAttention m = small_keras(8, 4);
  const Tensor x = Tensor::randn({2, 12, 8}, 5), g = Tensor::randn({2, 12, 8}, 6);
  KerasMultiHeadAttentionOptions with_mods, with_mask;
  with_mods.mods = AttentionMods::sliding_window(2, 1);
  Tensor mask = Tensor::empty({2, 12, 12}, DType::b8);  // [B, T, S], True = attend
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t i = 0; i < 12; ++i) {
      for (int64_t j = 0; j < 12; ++j) mask.data<bool>()[(b * 12 + i) * 12 + j] = j >= i - 2 && j <= i + 1;
    }
  }
  with_mask.attention_mask = mask;
  EXPECT_LE(max_abs_diff(m.forward(x, x, with_mods).output, m.forward(x, x, with_mask).output), 2e-6);
  const KerasMultiHeadAttentionGradients a = m.backward(x, x, g, with_mods), b = m.backward(x, x, g, with_mask);
  EXPECT_LE(max_abs_diff(a.query, b.query), 1e-5);
  EXPECT_LE(max_abs_diff(a.value, b.value), 1e-5);
  for (const auto& [name, t] : a.weights) EXPECT_LE(max_abs_diff(t, b.weights.at(name)), 1e-5) << name;
  // and the mods really act: without them the output differs
  EXPECT_GT(max_abs_diff(m.forward(x, x, with_mods).output, m.forward(x, x).output), 1e-3);
}

}  // namespace
}  // namespace qkv::nn
