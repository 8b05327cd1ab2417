// qkv::nn::MultiheadAttention against torch.nn.MultiheadAttention.
//
// Fixtures: tests/fixtures/mha_torch/*.safetensors from tests/nn/make_torch_mha_fixtures.py
// (PyTorch's float64 results on the stored float32 parameters and inputs). Tolerance:
// max |qkv - torch| <= 1e-5 * max |torch| for the output and the weights.
#include <gtest/gtest.h>

#include <cstdio>

#include "common/expect.h"
#include "nn/fixtures.h"
#include "qkv/nn/mha.h"

namespace {

using qkv::Tensor;
using qkv::nn::MultiheadAttention;
using qkv::nn::MultiheadAttentionConfig;
using qkv::nn::MultiheadAttentionOptions;
using namespace qkv::nn::testing;

constexpr double kTolerance = 1e-5;

MultiheadAttentionConfig config_of(const nlohmann::json& o) {
  MultiheadAttentionConfig c;
  c.embed_dim = o.at("embed_dim");
  c.num_heads = o.at("num_heads");
  c.bias = o.at("bias");
  c.add_bias_kv = o.at("add_bias_kv");
  c.add_zero_attn = o.at("add_zero_attn");
  if (!o.at("kdim").is_null()) c.kdim = o.at("kdim").get<int64_t>();
  if (!o.at("vdim").is_null()) c.vdim = o.at("vdim").get<int64_t>();
  c.batch_first = o.at("batch_first");
  return c;
}

TEST(MhaTorch, MatchesEveryPyTorchFixture) {
  const auto files = fixture_files("mha_torch");
  ASSERT_GE(files.size(), 30u) << "missing fixtures in " << fixture_dir("mha_torch");
  double worst = 0;
  for (const auto& path : files) {
    const Fixture fx = load_fixture(path);
    SCOPED_TRACE(fx.name);
    const nlohmann::json& o = fx.options;
    std::map<std::string, Tensor> sd;
    for (const auto& [k, v] : fx.tensors) {
      if (k.rfind("input.", 0) != 0 && k.rfind("expected.", 0) != 0) sd[k] = v;
    }
    const MultiheadAttention mha = MultiheadAttention::from_state_dict(config_of(o), sd);
    const Tensor q = fx.at("input.query");
    const Tensor k = o.at("self_attention") ? q : fx.at("input.key");
    const Tensor v = o.at("self_attention") ? q : (o.at("kv_shared") ? k : fx.at("input.value"));
    MultiheadAttentionOptions call;
    call.key_padding_mask = fx.maybe("input.key_padding_mask");
    call.attn_mask = fx.maybe("input.attn_mask");
    call.need_weights = o.at("need_weights");
    call.average_attn_weights = o.at("average_attn_weights");
    call.is_causal = o.at("is_causal");
    const auto r = mha.forward(q, k, v, call);
    const double e_out = relative_error(r.output, fx.at("expected.output"));
    EXPECT_LE(e_out, kTolerance);
    worst = std::max(worst, e_out);
    ASSERT_EQ(r.weights.has_value(), fx.has("expected.weights"));
    if (r.weights) {
      const double e_w = relative_error(*r.weights, fx.at("expected.weights"));
      EXPECT_LE(e_w, kTolerance);
      worst = std::max(worst, e_w);
    }
  }
  std::printf("[ mha_torch ] %zu fixtures, max relative error %.3g\n", files.size(), worst);
}

TEST(MhaTorch, StateDictRoundTripsWithPyTorchNames) {
  MultiheadAttentionConfig c;
  c.embed_dim = 8;
  c.num_heads = 2;
  c.kdim = 5;
  c.add_bias_kv = true;
  const MultiheadAttention a(c, 7);
  const auto sd = a.state_dict();
  for (const char* name : {"q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias", "bias_k", "bias_v",
                           "out_proj.weight", "out_proj.bias"}) {
    EXPECT_EQ(sd.count(name), 1u) << name;
  }
  EXPECT_EQ(sd.at("k_proj_weight").shape(), (qkv::Shape{8, 5}));
  const MultiheadAttention b = MultiheadAttention::from_state_dict(c, sd);
  const Tensor x = Tensor::randn({3, 2, 8}, 1), y = Tensor::randn({4, 2, 5}, 2), z = Tensor::randn({4, 2, 8}, 3);
  EXPECT_EQ(relative_error(a.forward(x, y, z).output, b.forward(x, y, z).output), 0.0);
}

TEST(MhaTorch, ErrorsNameTheProblem) {
  MultiheadAttentionConfig c;
  c.embed_dim = 6;
  c.num_heads = 4;
  EXPECT_THROW_WITH(MultiheadAttention(c), qkv::ValueError, "divisible by num_heads");
  c.num_heads = 2;
  MultiheadAttention m(c);
  EXPECT_THROW_WITH(m.load_state_dict({{"in_proj_weight", Tensor::zeros({18, 6})}}), qkv::ValueError,
                    "missing keys [in_proj_bias, out_proj.bias, out_proj.weight]");
  auto sd = m.state_dict();
  sd["in_proj_weight"] = Tensor::zeros({18, 5});
  EXPECT_THROW_WITH(m.load_state_dict(sd), qkv::ShapeError, "in_proj_weight: expected shape [18, 6]");
  const Tensor x = Tensor::randn({3, 2, 6}, 1);
  MultiheadAttentionOptions o;
  o.is_causal = true;
  EXPECT_THROW_WITH(m.forward(x, x, x, o), qkv::ValueError, "Need attn_mask");
  o.is_causal = false;
  o.attn_mask = Tensor::zeros({3, 4});
  EXPECT_THROW_WITH(m.forward(x, x, x, o), qkv::ShapeError, "2D attn_mask is [3, 4], but should be [3, 3]");
  EXPECT_THROW_WITH(m.forward(x, Tensor::randn({3, 2, 5}, 2), x), qkv::ShapeError, "key must be");
  // torch.nn.MultiheadAttention on int32 inputs: F.linear's "mat1 and mat2 must have the same
  // dtype, but got Int and Float"; qkv projected them as float32 without a word.
  const Tensor xi = x.to(qkv::DType::i32);
  EXPECT_THROW_WITH(m.forward(xi, xi, xi), qkv::DTypeError,
                    "MultiheadAttention: query must be float32, float64, float16 or bfloat16, got int32 [3, 2, 6]");
  EXPECT_THROW_WITH(m.forward(x, x, x.to(qkv::DType::b8)), qkv::DTypeError, "value must be float32");
  EXPECT_THROW_WITH(m.backward(x, xi, x, x), qkv::DTypeError, "MultiheadAttention: key must be float32");
}

// 3 * embed_dim overflowed int64 (undefined) for embed_dim 2^62 and reached the allocator as
// "output [-4611686018427387904, ...] has a negative dimension"; a negative kdim likewise.
TEST(MhaTorch, SizesThatOverflowOrAreNegativeAreValueErrors) {
  MultiheadAttentionConfig c;
  c.embed_dim = int64_t{1} << 62;
  c.num_heads = 2;
  EXPECT_THROW_WITH(MultiheadAttention(c), qkv::ValueError,
                    "MultiheadAttention: embed_dim 4611686018427387904 is too large (3 * embed_dim passes 2^62)");
  c.embed_dim = 8;
  c.kdim = -3;
  EXPECT_THROW_WITH(MultiheadAttention(c), qkv::ValueError, "MultiheadAttention: kdim and vdim must be >= 0, got -3");
}

TEST(MhaTorch, DropoutOnlyWhenTraining) {
  MultiheadAttentionConfig c;
  c.embed_dim = 8;
  c.num_heads = 2;
  c.dropout = 0.5;
  MultiheadAttention m(c, 3);
  const Tensor x = Tensor::randn({5, 2, 8}, 1);
  const Tensor eval = m.forward(x, x, x).output;
  c.dropout = 0.0;
  const MultiheadAttention plain = MultiheadAttention::from_state_dict(c, m.state_dict());
  EXPECT_EQ(relative_error(eval, plain.forward(x, x, x).output), 0.0);
  m.training = true;
  EXPECT_GT(relative_error(m.forward(x, x, x).output, eval), 1e-3);
}

}  // namespace
