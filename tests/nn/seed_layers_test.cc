// The seed articles' layers against their PyTorch code (tests/nn/make_seed_fixtures.py,
// float64 results on the stored float32 numbers). Tolerance 1e-5 * max |expected|.
#include <gtest/gtest.h>

#include "common/expect.h"
#include "nn/fixtures.h"
#include "qkv/nn/seed_layers.h"

namespace {

using qkv::Tensor;
using namespace qkv::nn;
using namespace qkv::nn::testing;

constexpr double kTolerance = 1e-5;

Fixture seed_fixture(const std::string& name) {
  return load_fixture(fixture_dir("mha_torch") / "seeds" / (name + ".safetensors"));
}

std::map<std::string, Tensor> params(const Fixture& fx) {
  std::map<std::string, Tensor> sd;
  for (const auto& [k, v] : fx.tensors) {
    if (k.rfind("input.", 0) != 0 && k.rfind("expected.", 0) != 0) sd[k] = v;
  }
  return sd;
}

TEST(SeedLayers, FixturesArePresent) { EXPECT_EQ(fixture_files("mha_torch/seeds").size(), 7u); }

TEST(SeedLayers, Seed000SelfAttentionMatchesPyTorch) {
  for (const char* name : {"self_attention", "self_attention_mask"}) {
    SCOPED_TRACE(name);
    const Fixture fx = seed_fixture(name);
    SelfAttention layer(fx.options.at("dim"));
    layer.load_state_dict(params(fx));
    EXPECT_LE(relative_error(layer.forward(fx.at("input.x"), fx.maybe("input.mask")), fx.at("expected.output")),
              kTolerance);
  }
}

TEST(SeedLayers, Seed000MultiHeadSelfAttentionWithOwnDimHeadMatchesPyTorch) {
  for (const char* name : {"mhsa", "mhsa_dim_head"}) {
    SCOPED_TRACE(name);
    const Fixture fx = seed_fixture(name);
    const auto& o = fx.options;
    std::optional<int64_t> dim_head;
    if (o.contains("dim_head")) dim_head = o.at("dim_head").get<int64_t>();
    MultiHeadSelfAttention layer(o.at("dim"), o.at("heads"), dim_head);
    layer.load_state_dict(params(fx));
    EXPECT_LE(relative_error(layer.forward(fx.at("input.x"), fx.maybe("input.mask")), fx.at("expected.output")),
              kTolerance);
  }
}

TEST(SeedLayers, Seed003SeparateHeadSizesCausalAndScaleMatchPyTorch) {
  for (const char* name : {"seed003", "seed003_causal_scale"}) {
    SCOPED_TRACE(name);
    const Fixture fx = seed_fixture(name);
    const auto& o = fx.options;
    std::optional<double> scale;
    if (o.contains("scale")) scale = o.at("scale").get<double>();
    SeparateHeadsAttention layer(o.at("E"), o.at("H"), o.at("Dkq").get<int64_t>(), o.at("Dv").get<int64_t>(), scale,
                                 o.value("causal", false));
    layer.load_state_dict(params(fx));
    const auto r = layer.forward(fx.at("input.q"), fx.at("input.k"), fx.at("input.v"));
    EXPECT_LE(relative_error(r.output, fx.at("expected.output")), kTolerance);
    EXPECT_LE(relative_error(r.scores, fx.at("expected.scores")), kTolerance);
  }
  EXPECT_THROW_WITH(SeparateHeadsAttention(3, 8), qkv::ValueError, "embed_dim (3) must be at least n_heads (8)");
  EXPECT_NO_THROW(SeparateHeadsAttention(4, 8, 64, 32));  // the article's example sizes
}

TEST(SeedLayers, Seed004LazyInputSizesMatchPyTorchAndAreFixedAfterTheFirstCall) {
  const Fixture fx = seed_fixture("seed004_lazy");
  LazyMultiHeadAttention layer(fx.options.at("hidden"), fx.options.at("heads"));
  layer.load_state_dict(params(fx));
  const Tensor q = fx.at("input.q"), k = fx.at("input.k"), v = fx.at("input.v");
  EXPECT_LE(relative_error(layer.forward(q, k, v), fx.at("expected.output")), kTolerance);
  // A fresh layer infers d_q, d_k, d_v at its first call and keeps them.
  LazyMultiHeadAttention lazy(12, 3, 5);
  EXPECT_FALSE(lazy.materialized());
  EXPECT_EQ(lazy.forward(q, k, v).shape(), (qkv::Shape{2, 5, 12}));
  EXPECT_EQ(lazy.state_dict().at("W_k.weight").shape(), (qkv::Shape{12, 9}));
  EXPECT_THROW_WITH(lazy.forward(q, k, Tensor::randn({2, 6, 5}, 1)), qkv::ShapeError,
                    "v has 5 features, but the first call fixed d_v = 4");
}

TEST(SeedLayers, MaskAndShapeErrorsNameTheLayer) {
  MultiHeadSelfAttention m(16, 4);
  EXPECT_THROW_WITH(m.forward(Tensor::randn({2, 6, 16}, 1), Tensor::zeros({6, 5}, qkv::DType::b8)), qkv::ShapeError,
                    "MultiHeadSelfAttention: mask must be [6, 6]");
  EXPECT_THROW_WITH(m.forward(Tensor::randn({2, 6, 15}, 1)), qkv::ShapeError, "x must be [B, T, 16]");
}

// torch's load_state_dict (strict) refuses keys a module lacks: SeparateHeadsAttention (bias-free)
// given the W_q.bias of a model with biases dropped it silently and computed other numbers. A
// failed load leaves the layer as it was: MultiHeadSelfAttention kept the new to_qvk.weight in
// state_dict() (forward still used the old one) when W_0.weight was misshapen.
TEST(SeedLayers, LoadStateDictRefusesUnexpectedKeysAndKeepsTheLayerOnErrors) {
  SeparateHeadsAttention sh(8, 2);
  auto sd = sh.state_dict();
  sd["W_q.bias"] = Tensor::ones({8});
  EXPECT_THROW_WITH(sh.load_state_dict(sd), qkv::ValueError,
                    "SeparateHeadsAttention: unexpected keys in state_dict [W_q.bias]");
  SelfAttention sa(4);
  EXPECT_THROW_WITH(sa.load_state_dict({{"to_qvk.weight", sa.state_dict().at("to_qvk.weight")},
                                        {"to_qkv.weight", Tensor::zeros({12, 4})}}),
                    qkv::ValueError, "unexpected keys in state_dict [to_qkv.weight]");
  LazyMultiHeadAttention lazy(4, 2);
  EXPECT_THROW_WITH(lazy.load_state_dict({{"W_x.weight", Tensor::zeros({4, 4})}}), qkv::ValueError,
                    "LazyMultiHeadAttention: unexpected keys in state_dict [W_x.weight]");
  MultiHeadSelfAttention m(16, 4);
  const auto old = m.state_dict();
  const Tensor x = Tensor::randn({2, 6, 16}, 1);
  const auto before = m.forward(x).to_vector<float>();
  EXPECT_THROW_WITH(
      m.load_state_dict({{"to_qvk.weight", Tensor::randn({48, 16}, 2)}, {"W_0.weight", Tensor::randn({16, 15}, 3)}}),
      qkv::ShapeError, "W_0.weight");
  EXPECT_EQ(m.state_dict().at("to_qvk.weight").to_vector<float>(), old.at("to_qvk.weight").to_vector<float>());
  EXPECT_EQ(m.forward(x).to_vector<float>(), before);
}

// Sizes whose products pass 2^62 overflowed int64 (undefined behaviour) before any check:
// MultiHeadSelfAttention(2^33, 2^31, 2^33) reached a view of "[0, 8589934592]", SelfAttention(2^62)
// and SeparateHeadsAttention(.., 2^31 heads, 2^33) likewise. Now a ValueError naming the layer.
TEST(SeedLayers, SizesWhoseProductsOverflowAreValueErrors) {
  const int64_t big = int64_t{1} << 33, heads = int64_t{1} << 31;
  EXPECT_THROW_WITH(MultiHeadSelfAttention(big, heads, big), qkv::ValueError,
                    "MultiHeadSelfAttention: 3 * heads * dim_head (3 * 2147483648 * 8589934592) passes 2^62");
  EXPECT_THROW_WITH(SelfAttention(int64_t{1} << 62), qkv::ValueError,
                    "SelfAttention: 3 * dim (3 * 4611686018427387904) passes 2^62");
  EXPECT_THROW_WITH(SeparateHeadsAttention(8, heads, big, 4), qkv::ValueError,
                    "SeparateHeadsAttention: n_heads * d_kq");
}

}  // namespace
