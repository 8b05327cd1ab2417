// additive_attention against Keras 3's AdditiveAttention (tests/fixtures/keras_attention, from
// tests/nn/make_keras_attention_fixtures.py: set scales, value masks, causal masks, a fully
// masked row that Keras averages), against additive_attention_reference (float64, written
// apart from the kernel), and Luong's dot-product attention (Keras Attention(score_mode="dot",
// use_scale=True)) as scaled_dot_product_attention with the learned scale; Keras'
// score_mode="concat" as additive attention of the scaled inputs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>

#include "common/expect.h"
#include "common/sdpa_fixtures.h"
#include "qkv/additive_attention.h"
#include "qkv/attention.h"
#include "qkv/io_tensor_files.h"

#include <nlohmann/json.hpp>

namespace qkv {
namespace {

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

TEST(AdditiveAttention, MatchesKeras) {
  const auto files = sdpa_fixtures::fixture_files(sdpa_fixtures::fixture_dir("keras_attention"));
  ASSERT_EQ(files.size(), 6u);
  for (const auto& path : files) {
    SCOPED_TRACE(path.stem().string());
    const io::SafetensorsFile f = io::load_safetensors(path);
    const nlohmann::json o = nlohmann::json::parse(f.metadata.at("options"));
    const Tensor &q = f.tensors.at("query"), &v = f.tensors.at("value"), &k = f.tensors.at("key");
    const auto mask = f.tensors.find("value_mask");
    const Tensor& want = f.tensors.at("out");
    if (o.at("layer") == "AdditiveAttention") {
      AdditiveAttentionOptions a;
      a.scale = f.tensors.at("scale");
      if (mask != f.tensors.end()) a.value_mask = mask->second;
      a.use_causal_mask = o.at("use_causal_mask").get<bool>();
      EXPECT_LE(max_diff(additive_attention(q, k, v, a), want), 2e-6);
      EXPECT_LE(max_diff(additive_attention_reference(q, k, v, a), want), 2e-6);
    } else if (o.at("kwargs").value("score_mode", "dot") == "concat") {
      // Keras Attention(score_mode="concat"): w sum_d tanh(s (q_d + k_d)) is additive attention of
      // s q and s k with every scale_d = w.
      const double s = f.tensors.at("scale").to_vector<double>()[0];
      const double w = f.tensors.at("concat_score_weight").to_vector<double>()[0];
      auto times = [](const Tensor& t, double x) {
        std::vector<float> e = t.to_vector<float>();
        for (float& y : e) y = static_cast<float>(y * x);
        return Tensor::from_vector(e, t.shape());
      };
      AdditiveAttentionOptions a;
      a.scale =
          Tensor::from_vector(std::vector<float>(static_cast<size_t>(q.size(-1)), static_cast<float>(w)), {q.size(-1)});
      if (mask != f.tensors.end()) a.value_mask = mask->second;
      EXPECT_LE(max_diff(additive_attention(times(q, s), times(k, s), v, a), want), 2e-6);
    } else {  // Luong: scores = scale * q . k, a masked key's weight 0 (no row is fully masked here)
      AttentionOptions a;
      a.scale = f.tensors.at("scale").to_vector<double>()[0];
      if (mask != f.tensors.end()) a.attn_mask = mask->second.unsqueeze(-2);  // [B, 1, Tk]
      EXPECT_LE(max_diff(scaled_dot_product_attention(q, k, v, a).output, want), 2e-6);
    }
  }
}

TEST(AdditiveAttention, KernelMatchesTheReference) {
  std::mt19937_64 rng(2);
  for (int i = 0; i < 20; ++i) {
    const int64_t b = 1 + static_cast<int64_t>(rng() % 3), tq = static_cast<int64_t>(rng() % 9);
    const int64_t tk = 1 + static_cast<int64_t>(rng() % 9), d = 1 + static_cast<int64_t>(rng() % 7);
    const int64_t dv = 1 + static_cast<int64_t>(rng() % 5);
    const Tensor q = Tensor::randn({b, tq, d}, rng()), k = Tensor::randn({b, tk, d}, rng());
    const Tensor v = Tensor::randn({b, tk, dv}, rng());
    AdditiveAttentionOptions o;
    o.scale = Tensor::randn({d}, rng());
    std::vector<bool> m(static_cast<size_t>(b * tk));
    for (size_t j = 0; j < m.size(); ++j) m[j] = rng() % 4 != 0;
    if (i % 2) o.value_mask = Tensor::from_vector(m, {b, tk});
    o.use_causal_mask = i % 3 == 0;
    EXPECT_LE(max_diff(additive_attention(q, k, v, o), additive_attention_reference(q, k, v, o)), 2e-6) << i;
  }
}

TEST(AdditiveAttention, ErrorsNameTheOpAndShapes) {
  const Tensor q = Tensor::randn({2, 3, 4}, 1), k = Tensor::randn({2, 5, 4}, 2), v = Tensor::randn({2, 5, 6}, 3);
  EXPECT_THROW_WITH(additive_attention(q, Tensor::randn({2, 5, 3}, 4), v), ShapeError,
                    "additive_attention: k must be [..., Lk, D] with q's D and v [..., Lk, Dv]");
  AdditiveAttentionOptions o;
  o.scale = Tensor::randn({3}, 5);
  EXPECT_THROW_WITH(additive_attention(q, k, v, o), ShapeError, "additive_attention: scale must be [4], got [3]");
  o.scale.reset();
  o.value_mask = Tensor::randn({2, 5}, 6);
  // The right shape in another dtype: the message names the dtype (it read "bool [2, 5], got [2, 5]").
  EXPECT_THROW_WITH(additive_attention(q, k, v, o), ShapeError,
                    "additive_attention: value_mask must be bool [2, 5], got [2, 5] float32");
}

}  // namespace
}  // namespace qkv
