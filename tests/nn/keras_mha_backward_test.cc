// KerasMultiHeadAttention::backward against Keras 3's own gradients (jax.grad of
// keras.layers.MultiHeadAttention in float64; tests/fixtures/mha_keras_grad from
// tests/nn/make_keras_mha_grad_fixtures.py): self and cross attention, key given or not, each
// kind of mask, causal, output_shape, attention_axes over one and two axes, use_bias=False,
// value_dim != key_dim, fully masked rows on both of Keras' paths, Keras 3.15's sliding_window and
// use_gate (the gate's kernel and bias, and the query through the gate). Criterion: every gradient
// within 1e-5 of its largest magnitude (float32 layer against float64 Keras, whose fused path runs
// its softmax in float32). Dropout, which Keras draws from another generator, is checked against
// central differences of the forward at the same seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "common/expect.h"
#include "nn/keras_mha_fixtures.h"
#include "qkv/nn/keras_mha.h"

namespace {

using qkv::Shape;
using qkv::Tensor;
using qkv::nn::KerasMultiHeadAttention;
using qkv::nn::KerasMultiHeadAttentionConfig;
using qkv::nn::KerasMultiHeadAttentionGradients;
using qkv::nn::KerasMultiHeadAttentionOptions;
using namespace qkv::nn::testing;

// max |got - want| / max |want| (a NaN fails).
double scaled_error(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double err = 0, scale = 0;
  for (size_t i = 0; i < w.size() && i < g.size(); ++i) {
    const double d = std::fabs(g[i] - w[i]);
    err = std::isnan(d) ? INFINITY : std::max(err, d);
    scale = std::max(scale, std::fabs(w[i]));
  }
  return err == 0 ? 0 : err / std::max(scale, 1e-30);
}

// The worst error of one fixture's gradients; every Keras gradient is checked and named.
double fixture_error(const Fixture& fx) {
  KerasMultiHeadAttention layer(keras_config_of(fx.options));
  layer.load_weights(fx.with_prefix("mha/"));
  const auto [query, value, call] = keras_inputs_of(fx);
  const KerasMultiHeadAttentionGradients g = layer.backward(query, value, fx.at("grad_output"), call);
  double worst = 0, largest = 0;
  for (const auto& [name, t] : fx.with_prefix("grad.")) {
    for (double x : t.to_vector<double>()) largest = std::max(largest, std::fabs(x));
  }
  auto check = [&](const Tensor& got, const std::string& name) {
    SCOPED_TRACE(name);
    // The key bias' gradient is 0 in exact arithmetic (softmax ignores a shift of a whole row):
    // qkv returns 0; Keras' is rounding noise, up to 1.5e-7 of the largest gradient where its
    // fused path runs the softmax in float32 (_dot_product_attention_core), 2e-16 elsewhere.
    if (name == "grad.mha/key/bias") {
      for (double x : got.to_vector<double>()) EXPECT_EQ(x, 0.0);
      for (double x : fx.at(name).to_vector<double>()) EXPECT_LE(std::fabs(x), 1e-6 * largest);
      return;
    }
    const double e = scaled_error(got, fx.at(name));
    EXPECT_LE(e, 1e-5);
    worst = std::max(worst, e);
  };
  check(g.query, "grad.query");
  check(g.value, "grad.value");
  EXPECT_EQ(g.key.has_value(), fx.has("grad.key"));
  if (g.key) check(*g.key, "grad.key");
  const auto keras = fx.with_prefix("grad.mha/");
  EXPECT_EQ(g.weights.size(), keras.size());
  for (const auto& [name, want] : keras) {
    EXPECT_TRUE(g.weights.count(name)) << name;
    if (g.weights.count(name)) check(g.weights.at(name), "grad.mha/" + name);
  }
  return worst;
}

TEST(KerasMhaBackward, MatchesKerasGradients) {
  const auto files = fixture_files("mha_keras_grad");
  ASSERT_GE(files.size(), 30u) << "missing fixtures in " << fixture_dir("mha_keras_grad");
  double worst_fused = 0, worst_einsum = 0;  // by Keras' path: its fused one has a float32 softmax
  for (const auto& path : files) {
    const Fixture fx = load_fixture(path);
    SCOPED_TRACE(fx.name);
    const double e = fixture_error(fx);
    double& worst = fx.options.at("keras_path") == "dot_product_attention" ? worst_fused : worst_einsum;
    worst = std::max(worst, e);
  }
  std::printf(
      "[ mha_keras_grad ] %zu fixtures, worst of each gradient's scale: %.3g (Keras' einsum path, float64), "
      "%.3g (its dot_product_attention path, float32 softmax)\n",
      files.size(), worst_einsum, worst_fused);
}

// sum(forward(x) * dy) in double.
double loss(const KerasMultiHeadAttention& layer, const Tensor& q, const Tensor& v, const Tensor& dy,
            const KerasMultiHeadAttentionOptions& o) {
  const auto y = layer.forward(q, v, o).output.to_vector<double>();
  const auto d = dy.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < y.size(); ++i) s += y[i] * d[i];
  return s;
}

// Central difference of the loss along `dir` in the tensor `x` (changed in place, restored).
double directional(const KerasMultiHeadAttention& layer, Tensor& x, const Tensor& dir, const Tensor& q, const Tensor& v,
                   const Tensor& dy, const KerasMultiHeadAttentionOptions& o) {
  const double eps = 1e-2;
  const Tensor saved = x.clone();
  auto shift = [&](double h) {
    float* p = x.data<float>();
    const float* s = saved.data<float>();
    const float* d = dir.data<float>();
    for (int64_t i = 0; i < x.numel(); ++i) p[i] = s[i] + static_cast<float>(h) * d[i];
  };
  shift(eps);
  const double up = loss(layer, q, v, dy, o);
  shift(-eps);
  const double down = loss(layer, q, v, dy, o);
  shift(0);
  return (up - down) / (2 * eps);
}

double dot(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < x.size(); ++i) s += x[i] * y[i];
  return s;
}

// Dropout in training is redrawn from dropout_seed: the gradients are those of the forward at
// that seed (central differences in float32, 2 axes, a mask, key given), and another seed
// gives other gradients.
TEST(KerasMhaBackward, DropoutMatchesTheForwardAtTheSameSeed) {
  KerasMultiHeadAttentionConfig c;
  c.num_heads = 2, c.key_dim = 3, c.value_dim = 2, c.dropout = 0.3, c.attention_axes = {1, 2};
  c.output_shape = {5};
  KerasMultiHeadAttention layer(c);
  layer.build(6, 4, 5, 7);
  layer.training = true;
  layer.dropout_seed = 42;
  Tensor q = Tensor::randn({2, 3, 2, 6}, 1), v = Tensor::randn({2, 2, 3, 4}, 2);
  KerasMultiHeadAttentionOptions o;
  o.key = Tensor::randn({2, 2, 3, 5}, 3);
  Tensor mask = Tensor::randn({2, 3, 2, 2, 3}, 8);  // [B, T1, T2, S1, S2], about 2/3 kept
  for (int64_t i = 0; i < mask.numel(); ++i) mask.data<float>()[i] = mask.data<float>()[i] > -0.4f ? 1.0f : 0.0f;
  o.attention_mask = mask;
  const Tensor dy = Tensor::randn({2, 3, 2, 5}, 4);
  const KerasMultiHeadAttentionGradients g = layer.backward(q, v, dy, o);
  auto expect_near = [](double analytic, double numeric, const char* what) {
    EXPECT_NEAR(analytic, numeric, 2e-3 * std::max(1.0, std::fabs(numeric))) << what;
  };
  const Tensor dq = Tensor::randn(q.shape(), 5), dv = Tensor::randn(v.shape(), 6),
               dk = Tensor::randn(o.key->shape(), 7);
  expect_near(dot(g.query, dq), directional(layer, q, dq, q, v, dy, o), "query");
  expect_near(dot(g.value, dv), directional(layer, v, dv, q, v, dy, o), "value");
  expect_near(dot(*g.key, dk), directional(layer, *o.key, dk, q, v, dy, o), "key");
  for (const char* name : {"query/kernel", "value/kernel", "attention_output/kernel", "key/bias"}) {
    std::vector<Tensor> w = layer.get_weights();
    const size_t i = static_cast<size_t>(std::find_if(std::begin(qkv::nn::kKerasMhaWeightNames),
                                                      std::end(qkv::nn::kKerasMhaWeightNames),
                                                      [&](const char* n) { return std::string(n) == name; }) -
                                         std::begin(qkv::nn::kKerasMhaWeightNames));
    const Tensor dir = Tensor::randn(w[i].shape(), 10 + i);
    const double analytic = dot(g.weights.at(name), dir);
    std::vector<Tensor> plus = w, minus = w;
    plus[i] = Tensor::from_vector(w[i].to_vector<float>(), w[i].shape()), minus[i] = plus[i].clone();
    const auto base = w[i].to_vector<float>(), d = dir.to_vector<float>();
    for (int64_t j = 0; j < w[i].numel(); ++j) {
      plus[i].data<float>()[j] = base[static_cast<size_t>(j)] + 1e-2f * d[static_cast<size_t>(j)];
      minus[i].data<float>()[j] = base[static_cast<size_t>(j)] - 1e-2f * d[static_cast<size_t>(j)];
    }
    KerasMultiHeadAttention lp = layer, lm = layer;
    lp.set_weights(plus);
    lm.set_weights(minus);
    expect_near(analytic, (loss(lp, q, v, dy, o) - loss(lm, q, v, dy, o)) / 2e-2, name);
  }
  layer.dropout_seed = 43;
  const KerasMultiHeadAttentionGradients other = layer.backward(q, v, dy, o);
  EXPECT_GT(scaled_error(other.query, g.query), 1e-3);
  layer.training = false;  // in inference dropout is the identity: the seed no longer matters
  const auto a = layer.backward(q, v, dy, o);
  layer.dropout_seed = 42;
  EXPECT_EQ(scaled_error(layer.backward(q, v, dy, o).query, a.query), 0);
}

TEST(KerasMhaBackward, ShapeAndStateErrors) {
  KerasMultiHeadAttentionConfig c;
  c.num_heads = 2, c.key_dim = 4, c.output_shape = {3};
  KerasMultiHeadAttention layer(c);
  const Tensor q = Tensor::randn({2, 5, 8}, 1), v = Tensor::randn({2, 7, 6}, 2);
  EXPECT_THROW_WITH((void)std::as_const(layer).backward(q, v, Tensor::randn({2, 5, 3}, 3)), qkv::ValueError,
                    "KerasMultiHeadAttention.backward: the layer has no weights");
  layer.build(8, 6, 6);
  EXPECT_THROW_WITH((void)layer.backward(q, v, Tensor::randn({2, 5, 8}, 3)), qkv::ShapeError,
                    "KerasMultiHeadAttention.backward: grad_output must have the output's shape [2, 5, 3]");
  EXPECT_THROW_WITH((void)layer.backward(q, v, Tensor::randn({2, 5, 8}, 3)), qkv::ShapeError, "got [2, 5, 8]");
  EXPECT_THROW_WITH((void)layer.backward(q, Tensor::randn({3, 7, 6}, 2), Tensor::randn({2, 5, 3}, 3)), qkv::ShapeError,
                    "KerasMultiHeadAttention.backward: query [2, 5, 8]");
  const auto g = layer.backward(q, v, Tensor::randn({2, 5, 3}, 3));
  EXPECT_EQ(g.query.shape(), q.shape());
  EXPECT_EQ(g.value.shape(), v.shape());
  EXPECT_FALSE(g.key.has_value());
  EXPECT_EQ(g.weights.at("attention_output/kernel").shape(), (Shape{2, 4, 3}));
  EXPECT_EQ(g.weights.size(), 8u);
}

}  // namespace
