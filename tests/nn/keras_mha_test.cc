// qkv::nn::KerasMultiHeadAttention against keras.layers.MultiHeadAttention (Keras 3, JAX).
//
// Fixtures: tests/fixtures/mha_keras/*.safetensors from tests/nn/make_keras_mha_fixtures.py
// (Keras' float64 results on the stored float32 weights and inputs). Tolerance:
// max |qkv - keras| <= 1e-5 * max |keras| for the output and the scores.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>
#include <utility>

#include "common/expect.h"
#include "nn/keras_mha_fixtures.h"
#include "qkv/nn/keras_mha.h"

namespace {

using qkv::Tensor;
using qkv::nn::KerasMultiHeadAttention;
using qkv::nn::KerasMultiHeadAttentionConfig;
using qkv::nn::KerasMultiHeadAttentionOptions;
using namespace qkv::nn::testing;

constexpr double kTolerance = 1e-5;

// The worst relative error of qkv's output and scores against a Keras fixture.
double keras_fixture_error(const Fixture& fx) {
  KerasMultiHeadAttention layer(keras_config_of(fx.options));
  layer.load_weights(fx.with_prefix("mha/"));
  const KerasInputs in = keras_inputs_of(fx);
  const auto r = layer.forward(in.query, in.value, in.call);
  double worst = relative_error(r.output, fx.at("expected.output"));
  EXPECT_EQ(r.scores.has_value(), fx.has("expected.scores"));
  if (r.scores && fx.has("expected.scores"))
    worst = std::max(worst, relative_error(*r.scores, fx.at("expected.scores")));
  return worst;
}

void expect_every_fixture(const std::string& dir, size_t at_least) {
  const auto files = fixture_files(dir);
  ASSERT_GE(files.size(), at_least) << "missing fixtures in " << fixture_dir(dir);
  double worst = 0;
  for (const auto& path : files) {
    const Fixture fx = load_fixture(path);
    SCOPED_TRACE(fx.name);
    const double e = keras_fixture_error(fx);
    EXPECT_LE(e, kTolerance);
    worst = std::max(worst, e);
  }
  std::printf("[ %s ] %zu fixtures, max relative error %.3g\n", dir.c_str(), files.size(), worst);
}

TEST(KerasMha, MatchesEveryKerasFixture) { expect_every_fixture("mha_keras", 30); }

// Keras reads a negative attention axis a as rank + a (input rank): every spelling of the
// token axes of rank-3, -4 and -5 inputs, alone and in pairs, gives Keras' output and scores.
TEST(KerasMha, AttentionAxesAsKerasReadsThem) { expect_every_fixture("mha_keras_axes", 19); }

// Why qkv refuses `axes` on rank-`rank` inputs.
std::string axis_fault(int64_t rank, const std::vector<int64_t>& axes) {
  std::vector<int64_t> seen;
  for (int64_t a : axes) {
    const int64_t n = a < 0 ? rank + a : a;
    if (n == 0) return "is the batch axis";
    if (n == rank - 1) return "is the feature axis";
    if (n < 0 || n >= rank) return "is out of range";
    if (std::count(seen.begin(), seen.end(), n)) return "names an axis twice";
    seen.push_back(n);
  }
  ADD_FAILURE() << "token axes";
  return "";
}

// Every axis Keras 3 rejects, or reads as something other than a token axis (the batch, the
// heads of the projection, an index wrapped twice), is a ValueError saying which.
TEST(KerasMha, AttentionAxesKerasRejectsOrReadsOtherwiseAreErrors) {
  std::ifstream f(fixture_dir("mha_keras_axes") / "keras_axes_errors.json");
  ASSERT_TRUE(f) << "missing keras_axes_errors.json";
  const nlohmann::json cases = nlohmann::json::parse(f).at("cases");
  ASSERT_GE(cases.size(), 40u);
  for (const auto& c : cases) {
    const int64_t rank = c.at("rank");
    const auto axes = c.at("attention_axes").get<std::vector<int64_t>>();
    SCOPED_TRACE(c.dump());
    if (c.at("keras") == "accepts") {
      const auto over = c.at("attends_over").get<std::vector<int64_t>>();
      EXPECT_TRUE(std::any_of(over.begin(), over.end(), [&](int64_t a) { return a <= 0 || a >= rank - 1; }));
    }
    KerasMultiHeadAttentionConfig cfg;
    cfg.num_heads = 2;
    cfg.key_dim = 2;
    cfg.attention_axes = axes;
    KerasMultiHeadAttention layer(cfg);
    qkv::Shape shape(static_cast<size_t>(rank), 3);
    shape.front() = 2;
    shape.back() = 4;
    const Tensor q = Tensor::randn(shape, 1);
    EXPECT_THROW_WITH(layer.forward(q, q), qkv::ValueError, "attention axis " + std::to_string(axes.back()));
    EXPECT_THROW_WITH(layer.forward(q, q), qkv::ValueError, axis_fault(rank, axes));
  }
}

TEST(KerasMha, SetWeightsTakesGetWeightsOrder) {
  const Fixture fx = load_fixture(fixture_dir("mha_keras") / "wide.safetensors");
  KerasMultiHeadAttention a(keras_config_of(fx.options));
  a.load_weights(fx.with_prefix("mha/"));
  KerasMultiHeadAttention b(keras_config_of(fx.options));
  b.set_weights(a.get_weights());
  const KerasInputs in = keras_inputs_of(fx);
  EXPECT_EQ(
      relative_error(a.forward(in.query, in.value, in.call).output, b.forward(in.query, in.value, in.call).output),
      0.0);
}

// The converted weights of Keras' layer in qkv's PyTorch flavour give Keras' numbers.
TEST(KerasMha, ConvertsToPyTorchLayoutWhereTheyCoincide) {
  const Fixture fx = load_fixture(fixture_dir("mha_keras") / "self.safetensors");
  KerasMultiHeadAttention keras(keras_config_of(fx.options));
  keras.load_weights(fx.with_prefix("mha/"));
  qkv::nn::MultiheadAttentionConfig c;
  c.embed_dim = 8;
  c.num_heads = 2;
  c.batch_first = true;
  const auto torch = qkv::nn::MultiheadAttention::from_state_dict(c, qkv::nn::keras_to_torch_state_dict(keras));
  qkv::nn::MultiheadAttentionOptions o;
  o.need_weights = false;
  const Tensor x = fx.at("input.query");
  EXPECT_LE(relative_error(torch.forward(x, x, x, o).output, fx.at("expected.output")), kTolerance);
  // And back: the PyTorch layer's weights as Keras weights.
  KerasMultiHeadAttention back(keras_config_of(fx.options));
  back.set_weights(qkv::nn::torch_to_keras_weights(torch));
  EXPECT_LE(relative_error(back.forward(x, x).output, fx.at("expected.output")), kTolerance);
  KerasMultiHeadAttentionConfig wide;
  wide.num_heads = 2;
  wide.key_dim = 3;
  KerasMultiHeadAttention other(wide);
  other.build(8, 8, 8);
  EXPECT_THROW_WITH(qkv::nn::keras_to_torch_state_dict(other), qkv::ValueError, "num_heads * key_dim == dim");
}

TEST(KerasMha, BuildsAtFirstCallAndReportsBadInputs) {
  KerasMultiHeadAttentionConfig c;
  c.num_heads = 2;
  c.key_dim = 3;
  c.value_dim = 5;
  c.output_shape = {4, 2};
  KerasMultiHeadAttention layer(c);
  EXPECT_THROW_WITH(std::as_const(layer).forward(Tensor::randn({1, 3, 6}, 1), Tensor::randn({1, 4, 7}, 2)),
                    qkv::ValueError, "has no weights");
  const auto r = layer.forward(Tensor::randn({1, 3, 6}, 1), Tensor::randn({1, 4, 7}, 2));
  EXPECT_EQ(r.output.shape(), (qkv::Shape{1, 3, 4, 2}));
  EXPECT_EQ(layer.get_weights().at(6).shape(), (qkv::Shape{2, 5, 4, 2}));
  EXPECT_THROW_WITH(layer.forward(Tensor::randn({1, 3, 6}, 1), Tensor::randn({1, 4}, 2)), qkv::ShapeError, "same rank");
  EXPECT_THROW_WITH(layer.load_weights({}), qkv::ValueError, "no MultiHeadAttention layer (with a query/kernel)");
  KerasMultiHeadAttentionOptions masked;  // masks that do not fit [B, T = 3, S = 4]: the layer's error, not expand's
  masked.attention_mask = Tensor::ones({1, 3, 5}, qkv::DType::b8);
  EXPECT_THROW_WITH(layer.forward(Tensor::randn({1, 3, 6}, 1), Tensor::randn({1, 4, 7}, 2), masked), qkv::ShapeError,
                    "KerasMultiHeadAttention: the masks (query_mask [B, T], value_mask / key_mask [B, S], "
                    "attention_mask [B, T, S], causal, sliding window) combine to [1, 3, 5], which does not fit the "
                    "scores' attention axes [1, 1, 3, 4] of query [1, 3, 6] and value [1, 4, 7]");
  masked.attention_mask.reset();
  masked.query_mask = Tensor::ones({1, 4}, qkv::DType::b8);
  EXPECT_THROW_WITH(layer.forward(Tensor::randn({1, 3, 6}, 1), Tensor::randn({1, 4, 7}, 2), masked), qkv::ShapeError,
                    "combine to [1, 4, 1], which does not fit the scores' attention axes [1, 1, 3, 4]");
  c.attention_axes = {3};
  KerasMultiHeadAttention bad(c);
  EXPECT_THROW_WITH(bad.forward(Tensor::randn({1, 3, 6}, 1), Tensor::randn({1, 4, 6}, 2)), qkv::ValueError,
                    "attention axis 3");
}

// An empty batch: Keras 3.15.1 returns output [0, 5, 8] and scores [0, 2, 5, 5] (checked live);
// qkv's reshape of the projected heads to [B, N, -1, D] could not infer the -1 of 0 elements and
// raised "reshape: shape [0, 2, -1, 4] is invalid". Backward gives empty input gradients and zero
// weight gradients.
TEST(KerasMha, AnEmptyBatchGivesEmptyOutputs) {
  KerasMultiHeadAttentionConfig c;
  c.num_heads = 2, c.key_dim = 4;
  KerasMultiHeadAttention layer(c);
  layer.build(8, 8, 8, 1);
  const Tensor x = Tensor::zeros({0, 5, 8});
  KerasMultiHeadAttentionOptions o;
  o.return_attention_scores = true;
  o.use_causal_mask = true;
  const auto r = layer.forward(x, x, o);
  EXPECT_EQ(r.output.shape(), (qkv::Shape{0, 5, 8}));
  EXPECT_EQ(r.scores->shape(), (qkv::Shape{0, 2, 5, 5}));
  const auto g = layer.backward(x, x, Tensor::zeros({0, 5, 8}));
  EXPECT_EQ(g.query.shape(), x.shape());
  for (const auto& [name, t] : g.weights) {
    const auto v = t.to_vector<float>();
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float e) { return e == 0.0f; })) << name;
  }
  c.attention_axes = {1, 2};
  KerasMultiHeadAttention two(c);
  two.build(8, 8, 8, 1);
  EXPECT_EQ(two.forward(Tensor::zeros({0, 3, 4, 8}), Tensor::zeros({0, 3, 4, 8})).output.shape(),
            (qkv::Shape{0, 3, 4, 8}));
}

// Keras 3.15's sliding_window and use_gate (the fixtures window_* and gate_* check the numbers):
// the gate sits between key and value in get_weights(), and the combinations qkv refuses say why.
TEST(KerasMha, SlidingWindowAndGateOptions) {
  KerasMultiHeadAttentionConfig c;
  c.num_heads = 2;
  c.key_dim = 3;
  c.value_dim = 5;
  c.sliding_window = 0;
  EXPECT_THROW_WITH(KerasMultiHeadAttention{c}, qkv::ValueError, "sliding_window must be None or a positive integer");
  c.sliding_window = 2;
  c.use_gate = true;
  KerasMultiHeadAttention layer(c);
  layer.build(6, 4, 4);
  const auto w = layer.get_weights();
  ASSERT_EQ(w.size(), 10u);
  EXPECT_EQ(qkv::nn::keras_mha_weight_names(true, true).at(4), "gate/kernel");
  EXPECT_EQ(w.at(4).shape(), (qkv::Shape{6, 2, 5}));  // the query's features -> [N, value_dim]
  EXPECT_EQ(w.at(5).shape(), (qkv::Shape{2, 5}));
  EXPECT_EQ(w.at(6).shape(), (qkv::Shape{4, 2, 5}));  // value/kernel
  EXPECT_THROW_WITH(layer.set_weights({w.begin(), w.begin() + 8}), qkv::ValueError,
                    "expected 10 weights (get_weights() order: query/kernel, query/bias, key/kernel, key/bias, "
                    "gate/kernel, gate/bias, value/kernel");
  std::vector<Tensor> bad = w;
  bad[4] = Tensor::randn({4, 2, 5}, 3);
  EXPECT_THROW_WITH(layer.set_weights(bad), qkv::ShapeError, "gate/kernel [4, 2, 5] must take the query's 6 features");
  c.use_bias = false;
  KerasMultiHeadAttention no_bias(c);
  no_bias.build(6, 4, 4);
  EXPECT_EQ(no_bias.get_weights().size(), 5u);
  // Gate weights into a layer without use_gate, and the converse, are errors naming the option.
  std::map<std::string, Tensor> named;
  const auto names = qkv::nn::keras_mha_weight_names(true, true);
  for (size_t i = 0; i < names.size(); ++i) named[names[i]] = w[i];
  KerasMultiHeadAttentionConfig plain;
  plain.num_heads = 2, plain.key_dim = 3, plain.value_dim = 5;
  EXPECT_THROW_WITH(KerasMultiHeadAttention(plain).load_weights(named), qkv::ValueError, "use_gate=True");
  named.erase("gate/kernel");
  EXPECT_THROW_WITH(layer.load_weights(named), qkv::ValueError, "use_gate=False for a layer without a gate");
  EXPECT_THROW_WITH(qkv::nn::keras_to_torch_state_dict(layer), qkv::ValueError, "has a gate");
  // Keras builds the window from axis 1's lengths: qkv takes it only over axis 1 alone.
  KerasMultiHeadAttentionConfig two_axes = plain;
  two_axes.sliding_window = 2;
  KerasMultiHeadAttention image(two_axes);
  const Tensor x = Tensor::randn({1, 3, 4, 6}, 1);
  EXPECT_THROW_WITH(image.forward(x, x), qkv::ValueError,
                    "sliding_window=2 with attention over the axes (1, 2) of a query [1, 3, 4, 6] is not supported");
  EXPECT_THROW_WITH((void)image.backward(x, x, Tensor::randn({1, 3, 4, 6}, 2)), qkv::ValueError,
                    "use attention_axes=(1,) or no sliding_window");
  two_axes.attention_axes = {1};
  KerasMultiHeadAttention rows(two_axes);
  EXPECT_EQ(rows.forward(x, x).output.shape(), x.shape());
}

}  // namespace
