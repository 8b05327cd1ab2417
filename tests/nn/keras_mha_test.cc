// qkv::nn::KerasMultiHeadAttention against keras.layers.MultiHeadAttention (Keras 3, JAX).
//
// Fixtures: tests/fixtures/mha_keras/*.safetensors from tests/nn/make_keras_mha_fixtures.py
// (Keras' float64 results on the stored float32 weights and inputs). Tolerance:
// max |qkv - keras| <= 1e-5 * max |keras| for the output and the scores.
#include <gtest/gtest.h>

#include <cstdio>

#include "common/expect.h"
#include "nn/fixtures.h"
#include "qkv/nn/keras_mha.h"

namespace {

using qkv::Tensor;
using qkv::nn::KerasMhaCallOptions;
using qkv::nn::KerasMhaConfig;
using qkv::nn::KerasMultiHeadAttention;
using namespace qkv::nn::testing;

constexpr double kTolerance = 1e-5;

KerasMhaConfig config_of(const nlohmann::json& o) {
  KerasMhaConfig c;
  c.num_heads = o.at("num_heads");
  c.key_dim = o.at("key_dim");
  if (!o.at("value_dim").is_null()) c.value_dim = o.at("value_dim").get<int64_t>();
  c.use_bias = o.at("use_bias");
  if (!o.at("output_shape").is_null()) c.output_shape = o.at("output_shape").get<std::vector<int64_t>>();
  if (!o.at("attention_axes").is_null()) c.attention_axes = o.at("attention_axes").get<std::vector<int64_t>>();
  return c;
}

struct KerasInputs {
  Tensor query, value;
  KerasMhaCallOptions call;
};

KerasInputs inputs_of(const Fixture& fx) {
  KerasInputs r;
  r.query = fx.at("input.query");
  r.value = fx.has("input.value") ? fx.at("input.value") : r.query;
  r.call.key = fx.maybe("input.key");
  r.call.query_mask = fx.maybe("input.query_mask");
  r.call.value_mask = fx.maybe("input.value_mask");
  r.call.key_mask = fx.maybe("input.key_mask");
  r.call.attention_mask = fx.maybe("input.attention_mask");
  r.call.return_attention_scores = fx.options.at("return_attention_scores");
  r.call.use_causal_mask = fx.options.at("use_causal_mask");
  return r;
}

TEST(KerasMha, MatchesEveryKerasFixture) {
  const auto files = fixture_files("mha_keras");
  ASSERT_GE(files.size(), 30u) << "missing fixtures in " << fixture_dir("mha_keras");
  double worst = 0;
  for (const auto& path : files) {
    const Fixture fx = load_fixture(path);
    SCOPED_TRACE(fx.name);
    KerasMultiHeadAttention layer(config_of(fx.options));
    layer.load_weights(fx.with_prefix("mha/"));
    const KerasInputs in = inputs_of(fx);
    const auto r = layer.forward(in.query, in.value, in.call);
    const double e_out = relative_error(r.output, fx.at("expected.output"));
    EXPECT_LE(e_out, kTolerance);
    worst = std::max(worst, e_out);
    ASSERT_EQ(r.scores.has_value(), fx.has("expected.scores"));
    if (r.scores) {
      const double e_s = relative_error(*r.scores, fx.at("expected.scores"));
      EXPECT_LE(e_s, kTolerance);
      worst = std::max(worst, e_s);
    }
  }
  std::printf("[ mha_keras ] %zu fixtures, max relative error %.3g\n", files.size(), worst);
}

TEST(KerasMha, SetWeightsTakesGetWeightsOrder) {
  const Fixture fx = load_fixture(fixture_dir("mha_keras") / "wide.safetensors");
  KerasMultiHeadAttention a(config_of(fx.options));
  a.load_weights(fx.with_prefix("mha/"));
  KerasMultiHeadAttention b(config_of(fx.options));
  b.set_weights(a.get_weights());
  const KerasInputs in = inputs_of(fx);
  EXPECT_EQ(relative_error(a.forward(in.query, in.value, in.call).output, b.forward(in.query, in.value, in.call).output),
            0.0);
}

// The converted weights of Keras' layer in qkv's PyTorch flavour give Keras' numbers.
TEST(KerasMha, ConvertsToPyTorchLayoutWhereTheyCoincide) {
  const Fixture fx = load_fixture(fixture_dir("mha_keras") / "self.safetensors");
  KerasMultiHeadAttention keras(config_of(fx.options));
  keras.load_weights(fx.with_prefix("mha/"));
  qkv::nn::MultiheadAttentionConfig c;
  c.embed_dim = 8;
  c.num_heads = 2;
  c.batch_first = true;
  const auto torch = qkv::nn::MultiheadAttention::from_state_dict(c, qkv::nn::keras_to_torch_state_dict(keras));
  qkv::nn::MhaForwardOptions o;
  o.need_weights = false;
  const Tensor x = fx.at("input.query");
  EXPECT_LE(relative_error(torch.forward(x, x, x, o).output, fx.at("expected.output")), kTolerance);
  // And back: the PyTorch layer's weights as Keras weights.
  KerasMultiHeadAttention back(config_of(fx.options));
  back.set_weights(qkv::nn::torch_to_keras_weights(torch));
  EXPECT_LE(relative_error(back.forward(x, x).output, fx.at("expected.output")), kTolerance);
  KerasMhaConfig wide;
  wide.num_heads = 2;
  wide.key_dim = 3;
  KerasMultiHeadAttention other(wide);
  other.build(8, 8, 8);
  EXPECT_THROW_WITH(qkv::nn::keras_to_torch_state_dict(other), qkv::ValueError, "num_heads * key_dim == dim");
}

TEST(KerasMha, BuildsAtFirstCallAndReportsBadInputs) {
  KerasMhaConfig c;
  c.num_heads = 2;
  c.key_dim = 3;
  c.value_dim = 5;
  c.output_shape = {4, 2};
  KerasMultiHeadAttention layer(c);
  EXPECT_THROW_WITH(layer.forward(Tensor::randn({1, 3, 6}, 1), Tensor::randn({1, 4, 7}, 2)), qkv::ValueError,
                    "has no weights");
  const auto r = layer.call(Tensor::randn({1, 3, 6}, 1), Tensor::randn({1, 4, 7}, 2));
  EXPECT_EQ(r.output.shape(), (qkv::Shape{1, 3, 4, 2}));
  EXPECT_EQ(layer.get_weights().at(6).shape(), (qkv::Shape{2, 5, 4, 2}));
  EXPECT_THROW_WITH(layer.forward(Tensor::randn({1, 3, 6}, 1), Tensor::randn({1, 4}, 2)), qkv::ShapeError,
                    "same rank");
  EXPECT_THROW_WITH(layer.load_weights({}), qkv::ValueError, "no weight named \"query/kernel\"");
  c.attention_axes = {3};
  KerasMultiHeadAttention bad(c);
  EXPECT_THROW_WITH(bad.call(Tensor::randn({1, 3, 6}, 1), Tensor::randn({1, 4, 6}, 2)), qkv::ValueError,
                    "attention axis 3");
}

}  // namespace
