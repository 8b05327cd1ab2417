// MultiheadAttention::forward(x, cache): prefill then token-by-token decoding against a KV cache
// equals the full-sequence forward with a causal mask, at every step (issue 17 item 3).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "attention/attention_test_configs.h"
#include "common/expect.h"
#include "qkv/kv_cache.h"
#include "qkv/nn/mha.h"

namespace qkv::nn {
namespace {

using test::max_abs_diff;  // NaN-aware, shapes checked (attention_test_configs.h)

Tensor causal_mask(int64_t l) {  // torch's convention: True = not allowed
  std::vector<uint8_t> m(static_cast<size_t>(l * l));
  for (int64_t i = 0; i < l; ++i) {
    for (int64_t j = 0; j < l; ++j) m[static_cast<size_t>(i * l + j)] = j > i;
  }
  Tensor t = Tensor::empty({l, l}, DType::b8);
  std::copy(m.begin(), m.end(), t.data<bool>());
  return t;
}

TEST(MultiheadAttentionCached, PrefillThenDecodeEqualsTheFullCausalForward) {
  for (bool bf : {true, false}) {
    MultiheadAttentionConfig c;
    c.embed_dim = 16, c.num_heads = 4, c.batch_first = bf;
    const MultiheadAttention mha(c, 3);
    const int64_t n = 2, l = 64, prefill = 10;
    const Tensor x = bf ? Tensor::randn({n, l, 16}, 1) : Tensor::randn({l, n, 16}, 1);  // [N, L, E] / [L, N, E]
    MultiheadAttentionOptions o;
    o.attn_mask = causal_mask(l);
    o.need_weights = false;
    const Tensor full = mha.forward(x, x, x, o).output;
    const int64_t seq = bf ? 1 : 0;  // the sequence dim
    KVCache cache({n, 4, 4, l});
    double worst = max_abs_diff(mha.forward(x.slice(seq, 0, prefill), cache).output, full.slice(seq, 0, prefill));
    for (int64_t t = prefill; t < l; ++t) {
      const Tensor step = mha.forward(x.slice(seq, t, t + 1), cache).output;
      worst = std::max(worst, max_abs_diff(step, full.slice(seq, t, t + 1)));
    }
    EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{l, l}));
    EXPECT_LE(worst, 2e-6) << (bf ? "batch_first" : "sequence first");
  }
}

TEST(MultiheadAttentionCached, UnbatchedAndErrors) {
  MultiheadAttentionConfig c;
  c.embed_dim = 8, c.num_heads = 2;
  const MultiheadAttention mha(c, 4);
  const Tensor x = Tensor::randn({5, 8}, 2);  // [L, E]
  MultiheadAttentionOptions o;
  o.attn_mask = causal_mask(5);
  o.need_weights = false;
  KVCache cache({1, 2, 4, 8});
  EXPECT_LE(max_abs_diff(mha.forward(x, cache).output, mha.forward(x, x, x, o).output), 2e-6);
  KVCache wrong({1, 1, 8, 8});
  EXPECT_THROW_WITH(
      mha.forward(x, wrong), ShapeError,
      "MultiheadAttention.forward (cache): the cache must be [N = 1, H = 2, capacity, 4], got [1, 1, 8, 8]");
  c.add_bias_kv = true;
  EXPECT_THROW_WITH(MultiheadAttention(c, 4).forward(x, cache), ValueError, "add_bias_kv and add_zero_attn layers");
  KVCache small({1, 2, 4, 3});
  EXPECT_THROW_WITH(mha.forward(x, small), ValueError, "KVCache.append: sequence 0 would hold 5 positions");
}

}  // namespace
}  // namespace qkv::nn

namespace qkv::nn {
namespace {

// MultiheadAttentionOptions::mods: a sliding window with ALiBi through the layer equals the same
// bias as a dense float attn_mask, forward and backward; refused with add_bias_kv.
TEST(MultiheadAttentionMods, EqualTheDenseMaskForwardAndBackward) {
  MultiheadAttentionConfig c;
  c.embed_dim = 16, c.num_heads = 2, c.batch_first = true;
  const MultiheadAttention mha(c, 5);
  const Tensor x = Tensor::randn({2, 12, 16}, 6), g = Tensor::randn({2, 12, 16}, 7);
  MultiheadAttentionOptions with_mods;
  with_mods.need_weights = false;
  with_mods.mods = AttentionMods::sliding_window(3, 1);
  with_mods.mods.alibi_slopes = Tensor::from_vector<float>({0.5f, 0.25f}, {2});
  std::vector<float> dense(2 * 2 * 12 * 12);  // [N*H, L, S] float mask (added): -inf outside, slope (j - i)
  for (int64_t n = 0; n < 2; ++n) {
    for (int64_t h = 0; h < 2; ++h) {
      for (int64_t i = 0; i < 12; ++i) {
        for (int64_t j = 0; j < 12; ++j) {
          const bool in = j >= i - 3 && j <= i + 1;
          dense[((n * 2 + h) * 12 + i) * 12 + j] = in ? (h == 0 ? 0.5f : 0.25f) * float(j - i) : -INFINITY;
        }
      }
    }
  }
  MultiheadAttentionOptions with_mask;
  with_mask.need_weights = false;
  with_mask.attn_mask = Tensor::from_vector(dense, {4, 12, 12});
  EXPECT_LE(max_abs_diff(mha.forward(x, x, x, with_mods).output, mha.forward(x, x, x, with_mask).output), 2e-6);
  const MultiheadAttentionGradients a = mha.backward(x, x, x, g, with_mods), b = mha.backward(x, x, x, g, with_mask);
  EXPECT_LE(max_abs_diff(a.query, b.query), 1e-5);
  for (const auto& [name, t] : a.params) EXPECT_LE(max_abs_diff(t, b.params.at(name)), 1e-5) << name;
  c.add_bias_kv = true;
  EXPECT_THROW_WITH(MultiheadAttention(c, 5).forward(x, x, x, with_mods), ValueError,
                    "MultiheadAttention: mods cannot be combined with add_bias_kv / add_zero_attn");
}

}  // namespace
}  // namespace qkv::nn
