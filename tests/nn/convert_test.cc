// The one Keras <-> PyTorch MHA conversion (src/nn/convert.cc) where the two older ones
// differed: separate q/k/v projections (kdim/vdim) and bias-free layers convert, dtypes are
// kept, and errors name weights, never CLI flags. Oracles: PyTorch's output for
// tests/fixtures/mha_torch/kdim_vdim (make_torch_mha_fixtures.py) and Keras' for
// tests/fixtures/mha_keras/no_bias (make_keras_mha_fixtures.py).
#include <gtest/gtest.h>

#include <string>

#include "common/expect.h"
#include "nn/fixtures.h"
#include "qkv/nn/keras_layers.h"
#include "qkv/nn/keras_mha.h"
#include "qkv/nn/keras_weights.h"
#include "qkv/nn/mha.h"

namespace {

using qkv::Tensor;
using namespace qkv::nn::testing;
namespace nn = qkv::nn;

constexpr double kTolerance = 1e-5;

std::map<std::string, Tensor> state_dict_of(const Fixture& fx) {
  std::map<std::string, Tensor> sd;
  for (const auto& [k, v] : fx.tensors) {
    if (!k.starts_with("input.") && !k.starts_with("expected.")) sd[k] = v;
  }
  return sd;
}

// PyTorch's kdim=10, vdim=6 layer (q/k/v_proj_weight) as Keras' MultiHeadAttention gives
// PyTorch's output.
TEST(KerasTorchConvert, SeparateProjectionsBecomeKerasKernels) {
  const Fixture fx = load_fixture(fixture_dir("mha_torch") / "kdim_vdim.safetensors");
  const nn::LayerWeights layers = nn::torch_to_keras(state_dict_of(fx), 4);
  ASSERT_EQ(layers.size(), 1u);
  const auto& w = layers.at("multi_head_attention");
  EXPECT_EQ(w.at("key/kernel").shape(), (qkv::Shape{10, 4, 4}));
  EXPECT_EQ(w.at("value/kernel").shape(), (qkv::Shape{6, 4, 4}));
  nn::KerasMultiHeadAttention keras(nn::keras_mha_config(w));
  keras.load_weights(w);
  nn::KerasMultiHeadAttentionOptions o;
  o.key = fx.at("input.key").transpose(0, 1);  // seq-first [S, B, kdim] -> [B, S, kdim]
  const Tensor q = fx.at("input.query").transpose(0, 1), v = fx.at("input.value").transpose(0, 1);
  const Tensor out = keras.forward(q, v, o).output;  // [B, L, E]
  EXPECT_LE(relative_error(out, fx.at("expected.output").transpose(0, 1)), kTolerance);
}

// Keras' use_bias=False layer as torch.nn.MultiheadAttention(bias=False) gives Keras' output,
// and converts back to the same weights.
TEST(KerasTorchConvert, BiasFreeLayersConvertBothWays) {
  const Fixture fx = load_fixture(fixture_dir("mha_keras") / "no_bias.safetensors");
  const auto keras = fx.with_prefix("mha/");
  const auto sd = nn::keras_mha_to_torch(keras, "mha");
  EXPECT_EQ(sd.count("in_proj_bias") + sd.count("out_proj.bias"), 0u);
  nn::MultiheadAttentionConfig c;
  c.embed_dim = 8;
  c.num_heads = 2;
  c.bias = false;
  c.batch_first = true;
  const auto torch = nn::MultiheadAttention::from_state_dict(c, sd);
  nn::MultiheadAttentionOptions o;
  o.need_weights = false;
  const Tensor q = fx.at("input.query"), v = fx.at("input.value");
  EXPECT_LE(relative_error(torch.forward(q, v, v, o).output, fx.at("expected.output")), kTolerance);
  const auto back = nn::torch_mha_to_keras(sd, 2, "");
  ASSERT_EQ(back.size(), keras.size());
  for (const auto& [name, t] : keras) {
    ASSERT_EQ(back.at(name).shape(), t.shape()) << name;
    EXPECT_EQ(back.at(name).to_vector<double>(), t.to_vector<double>()) << name;
  }
}

TEST(KerasTorchConvert, KeepsTheDtype) {
  const Fixture fx = load_fixture(fixture_dir("mha_keras") / "self.safetensors");
  std::map<std::string, Tensor> f64;
  for (const auto& [k, t] : fx.with_prefix("mha/")) f64[k] = t.to(qkv::DType::f64);
  for (const auto& [k, t] : nn::keras_mha_to_torch(f64, "mha")) EXPECT_EQ(t.dtype(), qkv::DType::f64) << k;
}

TEST(KerasTorchConvert, ErrorsNameTheWeightsAndNoCliFlag) {
  const Fixture fx = load_fixture(fixture_dir("mha_torch") / "kdim_vdim.safetensors");
  auto sd = state_dict_of(fx);
  try {
    (void)nn::torch_mha_to_keras(sd, 3, "mha.");
    ADD_FAILURE() << "no error for 3 heads of 16";
  } catch (const qkv::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("embed dim 16 is not divisible by num_heads 3"), std::string::npos)
        << e.what();
    EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
  }
  sd["bias_k"] = Tensor::zeros({1, 1, 16});
  EXPECT_THROW_WITH(nn::torch_mha_to_keras(sd, 4, "mha."), qkv::ValueError, "'mha.bias_k': Keras has no add_bias_kv");
  sd.erase("bias_k");
  sd.erase("out_proj.bias");
  EXPECT_THROW_WITH(nn::torch_mha_to_keras(sd, 4, "mha."), qkv::ValueError, "'mha.out_proj.bias' is missing");
  auto keras = load_fixture(fixture_dir("mha_keras") / "self.safetensors").with_prefix("mha/");
  keras.erase("key/bias");
  EXPECT_THROW_WITH(nn::keras_mha_to_torch(keras, "mha"), qkv::ValueError, "layer 'mha' has no weight 'key/bias'");
}

}  // namespace
