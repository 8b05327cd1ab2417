// The seed layers' forward against a KV cache (issue 17 item 3): 64 tokens generated one by one
// (each step's output, plus a fresh input, is the next token) match the full-sequence causal
// forward over the generated sequence at every step; a prefill of several tokens too; errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <vector>

#include "attention/attention_test_configs.h"
#include "common/expect.h"
#include "qkv/kv_cache.h"
#include "qkv/nn/seed_layers.h"

namespace qkv::nn {
namespace {

using test::max_abs_diff;  // NaN-aware, shapes checked (attention_test_configs.h)

Tensor causal_mask(int64_t l) {  // the seed layers' convention: True = masked
  Tensor t = Tensor::empty({l, l}, DType::b8);
  for (int64_t i = 0; i < l; ++i) {
    for (int64_t j = 0; j < l; ++j) t.data<bool>()[i * l + j] = j > i;
  }
  return t;
}

// Generates `steps` tokens [B, 1, E] one by one (after `prefill` random tokens): token t + 1 is
// step t's output plus a fresh random input. Returns the worst difference between each step's
// output and the full causal forward over the whole generated sequence at that position.
double generate_and_compare(int64_t b, int64_t e, int64_t prefill, int64_t steps,
                            const std::function<Tensor(const Tensor&)>& cached,
                            const std::function<Tensor(const Tensor&)>& full_causal) {
  const int64_t l = prefill + steps;
  Tensor seq = Tensor::zeros({b, l, e});  // [B, L, E], filled as generated
  seq.slice(1, 0, prefill).copy_from(Tensor::randn({b, prefill, e}, 1));
  std::vector<Tensor> outputs{cached(seq.slice(1, 0, prefill))};  // [B, prefill, E]
  for (int64_t t = prefill; t < l; ++t) {
    const Tensor& prev = outputs.back();
    const Tensor last = prev.slice(1, prev.size(1) - 1, prev.size(1)).contiguous();  // [B, 1, E]
    const Tensor fresh = Tensor::randn({b, 1, e}, 100 + static_cast<uint64_t>(t));
    Tensor next = Tensor::empty({b, 1, e});
    const float *a = last.data<float>(), *f = fresh.data<float>();
    for (int64_t i = 0; i < b * e; ++i) next.data<float>()[i] = a[i] + f[i];
    seq.slice(1, t, t + 1).copy_from(next);
    outputs.push_back(cached(next));
  }
  const Tensor full = full_causal(seq);  // [B, L, E]
  double worst = max_abs_diff(outputs.front(), full.slice(1, 0, prefill));
  for (int64_t t = prefill; t < l; ++t) {
    worst = std::max(worst, max_abs_diff(outputs[static_cast<size_t>(t - prefill + 1)], full.slice(1, t, t + 1)));
  }
  return worst;
}

TEST(SeedLayersCached, GeneratingTokenByTokenEqualsTheFullCausalForward) {
  const int64_t b = 2, steps = 64;
  for (int64_t prefill : {1, 10}) {
    const int64_t l = prefill + steps;
    {
      const SelfAttention layer(8, 3);
      KVCache cache({b, 1, 8, l});
      const double worst = generate_and_compare(
          b, 8, prefill, steps, [&](const Tensor& x) { return layer.forward(x, cache); },
          [&](const Tensor& x) { return layer.forward(x, causal_mask(x.size(1))); });
      EXPECT_LE(worst, 1e-6) << "SelfAttention, prefill " << prefill;
      EXPECT_EQ(cache.lengths(), (std::vector<int64_t>{l, l}));
    }
    {
      const MultiHeadSelfAttention layer(12, 3, 5, 4);  // dim_head 5 != dim / heads
      KVCache cache({b, 3, 5, l});
      const double worst = generate_and_compare(
          b, 12, prefill, steps, [&](const Tensor& x) { return layer.forward(x, cache); },
          [&](const Tensor& x) { return layer.forward(x, causal_mask(x.size(1))); });
      EXPECT_LE(worst, 1e-6) << "MultiHeadSelfAttention, prefill " << prefill;
    }
    {
      const SeparateHeadsAttention layer(6, 4, 5, 3, 0.3, true, 5);  // Dkq 5, Dv 3, scale 0.3
      KVCacheConfig c{b, 4, 5, l};
      c.value_dim = 3;
      KVCache cache(c);
      const double worst = generate_and_compare(
          b, 6, prefill, steps, [&](const Tensor& x) { return layer.forward(x, cache); },
          [&](const Tensor& x) { return layer.forward(x, x, x).output; });
      EXPECT_LE(worst, 1e-6) << "SeparateHeadsAttention, prefill " << prefill;
    }
  }
}

TEST(SeedLayersCached, Errors) {
  const Tensor x = Tensor::randn({1, 4, 8}, 2);
  KVCache wrong({1, 2, 8, 16});
  EXPECT_THROW_WITH(SelfAttention(8).forward(x, wrong), ShapeError,
                    "SelfAttention.forward (cache): the cache must be [N = 1, H = 1, capacity, 8], got [1, 2, 16, 8]");
  EXPECT_THROW_WITH(MultiHeadSelfAttention(8, 2).forward(x, wrong), ShapeError,
                    "the cache must be [N = 1, H = 2, capacity, 4], got [1, 2, 16, 8]");
  KVCache ok({1, 2, 4, 16});
  EXPECT_THROW_WITH(SeparateHeadsAttention(8, 2).forward(x, ok), ValueError,
                    "SeparateHeadsAttention.forward (cache): the layer is not causal");
  EXPECT_THROW_WITH(SelfAttention(8).forward(Tensor::randn({1, 4, 6}, 3), wrong), ShapeError,
                    "SelfAttention.forward (cache): x must be [B, T, 8], got [1, 4, 6]");
  KVCache small({1, 1, 8, 3});
  EXPECT_THROW_WITH(SelfAttention(8).forward(x, small), ValueError,
                    "KVCache.append: sequence 0 would hold 4 positions");
}

}  // namespace
}  // namespace qkv::nn
