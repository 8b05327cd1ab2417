// The seed layers' backward passes (qkv/nn/seed_layers.h) against PyTorch's float64 autograd
// on the articles' modules (tests/fixtures/seed_grad from tests/nn/make_seed_grad_fixtures.py):
// SelfAttention and MultiHeadSelfAttention with random and causal masks (True = masked),
// dim_head != dim / heads, one token; SeparateHeadsAttention with Dkq != Dv, Lq != Lk, causal
// with Lq < Lk and Lq > Lk, explicit scales, default head sizes; LazyMultiHeadAttention with
// d_q, d_k, d_v apart, one query, one key. Criterion as tests/nn/mha_backward_test.cc: every
// gradient within 1e-5 of its largest magnitude (with a floor of 1e-2 of the configuration's
// largest gradient, for gradients that vanish in torch: one key or one token).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "nn/fixtures.h"
#include "qkv/nn/seed_layers.h"

namespace qkv::nn {
namespace {

using testing::Fixture;

double relative_error(const Tensor& got, const Tensor& want, double floor) {
  EXPECT_EQ(got.shape(), want.shape());
  if (got.shape() != want.shape()) return INFINITY;
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double err = 0.0, scale = floor;
  for (size_t i = 0; i < w.size(); ++i) {
    const double d = std::fabs(g[i] - w[i]);
    err = std::isnan(d) ? INFINITY : std::max(err, d);  // a NaN on either side fails
    scale = std::max(scale, std::fabs(w[i]));
  }
  return err / std::max(scale, 1e-30);
}

template <class T>
std::optional<T> opt(const nlohmann::json& j, const char* key) {
  if (!j.contains(key) || j.at(key).is_null()) return std::nullopt;
  return j.at(key).get<T>();
}

// The gradients of one fixture's layer: inputs by the fixture's names ("x" or "q", "k",
// "v") and parameters by state_dict name.
std::map<std::string, Tensor> gradients(const Fixture& fx) {
  const std::string layer = fx.options.at("layer");
  const nlohmann::json& c = fx.options.at("ctor");
  const auto sd = fx.with_prefix("param.");
  const Tensor& dy = fx.at("grad_output");
  std::map<std::string, Tensor> out;
  if (layer == "SelfAttention" || layer == "MultiHeadSelfAttention") {
    SelfAttentionGradients g;
    if (layer == "SelfAttention") {
      SelfAttention m(c.at("dim"));
      m.load_state_dict(sd);
      g = m.backward(fx.at("input.x"), dy, fx.maybe("input.mask"));
    } else {
      MultiHeadSelfAttention m(c.at("dim"), c.value("heads", 8), opt<int64_t>(c, "dim_head"));
      m.load_state_dict(sd);
      g = m.backward(fx.at("input.x"), dy, fx.maybe("input.mask"));
    }
    out = g.params;
    out["x"] = g.x;
    return out;
  }
  MultiheadAttentionGradients g;
  const Tensor &q = fx.at("input.q"), &k = fx.at("input.k"), &v = fx.at("input.v");
  if (layer == "SeparateHeadsAttention") {
    SeparateHeadsAttention m(c.at("embed_dim"), c.at("n_heads"), opt<int64_t>(c, "d_kq"), opt<int64_t>(c, "d_v"),
                             opt<double>(c, "scale"), c.value("causal", false));
    m.load_state_dict(sd);
    g = m.backward(q, k, v, dy);
  } else {
    LazyMultiHeadAttention m(c.at("hidden"), c.at("heads"));
    m.load_state_dict(sd);
    g = m.backward(q, k, v, dy);
  }
  out = g.params;
  out["q"] = g.query;
  out["k"] = g.key;
  out["v"] = g.value;
  return out;
}

TEST(SeedLayersBackward, FixturesCoverEveryLayer) {
  std::map<std::string, int> per_layer;
  for (const auto& path : testing::fixture_files("seed_grad")) {
    ++per_layer[testing::load_fixture(path).options.at("layer").get<std::string>()];
  }
  EXPECT_EQ(per_layer.size(), 4u);
  for (const auto& [layer, n] : per_layer) EXPECT_GE(n, 5) << layer;
}

TEST(SeedLayersBackward, MatchesTorchAutograd) {
  const auto files = testing::fixture_files("seed_grad");
  ASSERT_EQ(files.size(), 22u);
  double worst = 0.0;
  for (const auto& path : files) {
    SCOPED_TRACE(path.stem().string());
    const Fixture fx = testing::load_fixture(path);
    const auto want = fx.with_prefix("grad.");
    double floor = 0.0;  // 1e-2 of the configuration's largest gradient
    for (const auto& [name, t] : want) {
      for (double x : t.to_vector<double>()) floor = std::max(floor, 1e-2 * std::fabs(x));
    }
    const auto got = gradients(fx);
    EXPECT_EQ(got.size(), want.size());  // every input and every parameter, nothing else
    for (const auto& [name, t] : want) {
      ASSERT_TRUE(got.count(name)) << name;
      const double e = relative_error(got.at(name), t, floor);
      EXPECT_LE(e, 1e-5) << name;
      worst = std::max(worst, e);
    }
  }
  std::printf("seed layers' backward vs torch float64 autograd: worst %.2e of each gradient's scale\n", worst);
}

// The message names the op and both shapes.
template <class F>
void expect_shape_error(F&& f, const std::string& op, const std::string& want, const std::string& got) {
  try {
    f();
    ADD_FAILURE() << "no ShapeError from " << op;
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(op), std::string::npos) << msg;
    EXPECT_NE(msg.find(want), std::string::npos) << msg;
    EXPECT_NE(msg.find(got), std::string::npos) << msg;
  }
}

TEST(SeedLayersBackward, WrongGradOutputShapeIsShapeError) {
  const Tensor x = Tensor::randn({2, 5, 8}, 1), bad = Tensor::randn({2, 5, 7}, 2);
  expect_shape_error([&] { (void)SelfAttention(8).backward(x, bad); }, "SelfAttention.backward", "[2, 5, 8]",
                     "[2, 5, 7]");
  expect_shape_error([&] { (void)MultiHeadSelfAttention(8, 2, 3).backward(x, bad); }, "MultiHeadSelfAttention.backward",
                     "[2, 5, 8]", "[2, 5, 7]");
  const Tensor q = Tensor::randn({2, 3, 8}, 3), kv = Tensor::randn({2, 6, 8}, 4);
  const SeparateHeadsAttention sh(8, 2, 3, 5);
  expect_shape_error(
      [&] {
        (void)sh.backward(q, kv, kv, Tensor::randn({2, 6, 8}, 5));
      },
      "SeparateHeadsAttention.backward", "[2, 3, 8]", "[2, 6, 8]");
  LazyMultiHeadAttention lz(6, 2);
  EXPECT_THROW((void)lz.backward(q, kv, kv, Tensor::randn({2, 3, 6}, 6)), ValueError);  // not materialized
  (void)lz.forward(q, kv, kv);
  expect_shape_error(
      [&] {
        (void)lz.backward(q, kv, kv, Tensor::randn({2, 3, 8}, 6));
      },
      "LazyMultiHeadAttention.backward", "[2, 3, 6]", "[2, 3, 8]");
  // the forward's input checks, under the backward's name
  EXPECT_THROW((void)SelfAttention(8).backward(Tensor::randn({2, 5, 6}, 7), bad), ShapeError);
  EXPECT_THROW((void)SelfAttention(8).backward(x, x, Tensor::zeros({4, 4}, DType::b8)), ShapeError);
  EXPECT_THROW((void)sh.backward(q, kv, q, q), ShapeError);  // v's length is not k's
  EXPECT_THROW((void)lz.backward(q, q, Tensor::randn({2, 3, 5}, 8), Tensor::randn({2, 3, 6}, 9)), ShapeError);
}

// A fully masked row: the forward gives zeros there (not torch's NaN); no gradient flows
// through it, and the rest stays finite.
TEST(SeedLayersBackward, FullyMaskedRowHasZeroGradient) {
  const Tensor x = Tensor::randn({1, 3, 4}, 11);
  const Tensor mask =
      Tensor::from_vector(std::vector<bool>{true, true, true, false, false, false, false, false, false}, {3, 3});
  // query 0 sees no key
  std::vector<float> dy(12, 0.0f);
  for (int i = 0; i < 4; ++i) dy[i] = 1.0f;  // only row 0's output feeds the loss
  const SelfAttentionGradients g = SelfAttention(4, 3).backward(x, Tensor::from_vector(dy, {1, 3, 4}), mask);
  for (double d : g.x.to_vector<double>()) EXPECT_EQ(d, 0.0);
  for (double d : g.params.at("to_qvk.weight").to_vector<double>()) EXPECT_EQ(d, 0.0);
}

}  // namespace
}  // namespace qkv::nn
