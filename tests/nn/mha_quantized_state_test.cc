// A quantized MultiheadAttention saved as int8 weights with their scales (safetensors) and loaded
// back is the same layer: the same int8 weights and scales, the same outputs (issue 14 item 4).
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <vector>

#include "common/expect.h"
#include "qkv/io.h"
#include "qkv/nn/mha.h"

namespace qkv::nn {
namespace {

void round_trip(const MultiheadAttention& q, const MultiheadAttentionConfig& c, const Tensor& x, const char* file) {
  const auto sd = q.quantized_state_dict();
  const std::filesystem::path path = std::filesystem::temp_directory_path() / file;
  io::save(path, sd);
  const MultiheadAttention back = MultiheadAttention::from_quantized_state_dict(c, io::load(path));
  std::filesystem::remove(path);
  const auto sd2 = back.quantized_state_dict();
  ASSERT_EQ(sd.size(), sd2.size());
  for (const auto& [name, t] : sd) {
    EXPECT_EQ(t.dtype(), sd2.at(name).dtype()) << name;
    EXPECT_EQ(t.to_vector<double>(), sd2.at(name).to_vector<double>()) << name;
  }
  MultiheadAttentionOptions o;
  o.need_weights = false;
  EXPECT_EQ(q.forward(x, x, x, o).output.to_vector<float>(), back.forward(x, x, x, o).output.to_vector<float>());
}

TEST(MultiheadAttentionQuantizedState, DynamicAndStaticRoundTripThroughSafetensors) {
  MultiheadAttentionConfig c;
  c.embed_dim = 32, c.num_heads = 4;
  const MultiheadAttention layer(c, 9);
  const Tensor x = Tensor::randn({6, 2, 32}, 10);  // [L, N, E]
  const MultiheadAttention dyn = layer.quantize_dynamic();
  const auto sd = dyn.quantized_state_dict();
  EXPECT_EQ(sd.at("in_proj_weight").dtype(), DType::i8);
  EXPECT_EQ(sd.at("in_proj_weight.scale").shape(), (Shape{96}));
  EXPECT_EQ(sd.at("in_proj_bias").dtype(), DType::f32);
  EXPECT_EQ(sd.count("activation_scales"), 0u);
  round_trip(dyn, c, x, "qkv_mha_dynamic.safetensors");
  const MultiheadAttention stat = layer.quantize_static({{x, x, x}});
  EXPECT_EQ(stat.quantized_state_dict().at("activation_scales").shape(), (Shape{4}));
  round_trip(stat, c, x, "qkv_mha_static.safetensors");
  MultiheadAttentionConfig separate = c;  // kdim/vdim: q/k/v_proj_weight each
  separate.kdim = 24, separate.vdim = 20;
  const MultiheadAttention sep = MultiheadAttention(separate, 11).quantize_dynamic();
  EXPECT_EQ(sep.quantized_state_dict().at("k_proj_weight.scale").shape(), (Shape{32}));
}

TEST(MultiheadAttentionQuantizedState, SevenBitWeightsStaySevenBit) {
  // 7-bit weights (the CPUs without VNNI choose them) saved and loaded, on any CPU: the loaded
  // layer keeps 7 bits, whatever this CPU would choose, so the int8 weights come back the same.
  MultiheadAttentionConfig c;
  c.embed_dim = 32, c.num_heads = 4;
  const MultiheadAttention layer(c, 9);
  const Tensor x = Tensor::randn({6, 2, 32}, 10);  // [L, N, E]
  for (int bits : {7, 8}) {
    const MultiheadAttention dyn = layer.quantize_dynamic(bits);
    EXPECT_EQ(dyn.weight_bits(), bits);
    const std::vector<int8_t> w = dyn.quantized_state_dict().at("in_proj_weight").to_vector<int8_t>();
    EXPECT_EQ(*std::max_element(w.begin(), w.end()), bits == 7 ? 63 : 127);
    EXPECT_EQ(MultiheadAttention::from_quantized_state_dict(c, dyn.quantized_state_dict()).weight_bits(), bits);
    round_trip(dyn, c, x, "qkv_mha_bits.safetensors");
    CalibrationOptions o;
    o.weight_bits = bits;
    round_trip(layer.quantize_static({{x, x, x}}, o), c, x, "qkv_mha_bits_static.safetensors");
  }
  EXPECT_EQ(layer.weight_bits(), 0);
  EXPECT_THROW_WITH(layer.quantize_dynamic(6), ValueError,
                    "MultiheadAttention.quantize_dynamic: weight_bits must be 8, 7 or 0");
}

// New float weights into a quantized layer: a dynamic layer re-quantizes them (it is then the
// dynamic layer of those weights, bit for bit); a static one refused nothing and kept the
// activation scales calibrated on its old weights (here the output projection's input range of
// weights 4x as large is 4x the old one: everything past it clipped). It refuses now, as
// torch.ao's converted modules refuse float weights, and stays as it was.
TEST(MultiheadAttentionQuantizedState, StaticLayerRefusesNewFloatWeights) {
  MultiheadAttentionConfig c;
  c.embed_dim = 16, c.num_heads = 2;
  const MultiheadAttention f(c, 3);
  auto big = MultiheadAttention(c, 5).state_dict();
  for (auto& [name, t] : big) t = t.clone();
  for (const char* name : {"in_proj_weight", "out_proj.weight"}) {
    float* w = big.at(name).data<float>();
    for (int64_t i = 0; i < big.at(name).numel(); ++i) w[i] *= 4.0f;
  }
  const MultiheadAttention g = MultiheadAttention::from_state_dict(c, big);
  const Tensor x = Tensor::randn({5, 2, 16}, 4);
  MultiheadAttention d = f.quantize_dynamic();
  d.load_state_dict(big);
  EXPECT_EQ(d.forward(x, x, x).output.to_vector<float>(),
            g.quantize_dynamic().forward(x, x, x).output.to_vector<float>());
  MultiheadAttention s = f.quantize_static({{x, x, x}});
  const auto before = s.forward(x, x, x).output.to_vector<float>();
  const float stale = s.quantized_state_dict().at("activation_scales").to_vector<float>()[3];
  const float fresh =
      g.quantize_static({{x, x, x}}).quantized_state_dict().at("activation_scales").to_vector<float>()[3];
  EXPECT_GT(fresh, 2.0f * stale);  // why the old scales cannot stay
  EXPECT_THROW_WITH(s.load_state_dict(big), ValueError,
                    "MultiheadAttention.load_state_dict: the layer is statically quantized, and its activation "
                    "scales were calibrated with the weights it has");
  EXPECT_EQ(s.forward(x, x, x).output.to_vector<float>(), before);
  EXPECT_EQ(s.state_dict().at("in_proj_weight").to_vector<float>(),
            f.state_dict().at("in_proj_weight").to_vector<float>());
  EXPECT_TRUE(s.quantized());
}

TEST(MultiheadAttentionQuantizedState, Errors) {
  MultiheadAttentionConfig c;
  c.embed_dim = 8, c.num_heads = 2;
  const MultiheadAttention layer(c);
  EXPECT_THROW_WITH(layer.quantized_state_dict(), ValueError,
                    "MultiheadAttention.quantized_state_dict: the layer is not quantized");
  auto sd = layer.quantize_dynamic().quantized_state_dict();
  sd.erase("out_proj.weight.scale");
  EXPECT_THROW_WITH(MultiheadAttention::from_quantized_state_dict(c, sd), ValueError,
                    "MultiheadAttention.from_quantized_state_dict: 'out_proj.weight' must be int8 [out, in] with "
                    "'out_proj.weight.scale' [out]");
  // A scale with no weight of its own was skipped without a word (every other stray key is an
  // unexpected-key error): a misspelt or foreign entry must not load silently.
  for (const char* stray : {"out_proj.bias.scale", "in_proj_weigth.scale", "q_proj_weight.scale"}) {
    auto extra = layer.quantize_dynamic().quantized_state_dict();
    extra[stray] = Tensor::ones({8});
    EXPECT_THROW_WITH(MultiheadAttention::from_quantized_state_dict(c, extra), ValueError,
                      std::string("MultiheadAttention.from_quantized_state_dict: unexpected key '") + stray + "'");
  }
  // Scales that quantization never makes (max|w_n| / 127 is never negative or infinite): a negative
  // one loaded its channel's weights negated without a word.
  for (const float bad : {-0.01f, std::numeric_limits<float>::infinity()}) {
    auto corrupt = layer.quantize_dynamic().quantized_state_dict();
    corrupt.at("out_proj.weight.scale").data<float>()[3] = bad;
    EXPECT_THROW_WITH(MultiheadAttention::from_quantized_state_dict(c, corrupt), ValueError,
                      "MultiheadAttention.from_quantized_state_dict: 'out_proj.weight.scale'[3] must be >= 0 and "
                      "finite");
  }
  auto acts =
      layer.quantize_static({{Tensor::randn({3, 2, 8}, 1), Tensor::randn({3, 2, 8}, 1), Tensor::randn({3, 2, 8}, 1)}})
          .quantized_state_dict();
  acts.at("activation_scales") = Tensor::from_vector<float>({1, 1, -1, 1}, {4});
  EXPECT_THROW_WITH(MultiheadAttention::from_quantized_state_dict(c, acts), ValueError,
                    "from_quantized_state_dict: activation_scales must be positive and finite, got -1");
  // A whole model's keys ("enc.in_proj_weight"): named for what is wrong, where the int8
  // weights went on to from_state_dict as float parameters ("in_proj_weight: expected a
  // floating-point tensor").
  std::map<std::string, Tensor> prefixed;
  for (const auto& [name, t] : layer.quantize_dynamic().quantized_state_dict()) prefixed["enc." + name] = t;
  EXPECT_THROW_WITH(MultiheadAttention::from_quantized_state_dict(c, prefixed), ValueError,
                    "unexpected key 'enc.in_proj_weight.scale' (scales belong to a projection weight of the layer's "
                    "own keys, no prefix");
}

}  // namespace
}  // namespace qkv::nn
