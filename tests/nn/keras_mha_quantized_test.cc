// KerasMultiHeadAttention::quantize_dynamic: int8 projections give the float32 layer's output
// within int8's rounding, through the int8 path (not the same bits), and refuse backward.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "common/expect.h"
#include "qkv/nn/keras_mha.h"

namespace qkv::nn {
namespace {

TEST(KerasMhaQuantized, Int8ProjectionsStayCloseToFloat32) {
  KerasMultiHeadAttentionConfig c;
  c.num_heads = 4, c.key_dim = 16, c.use_gate = true;
  KerasMultiHeadAttention layer(c);
  layer.build(64, 64, 64, 3);
  const Tensor x = Tensor::randn({2, 10, 64}, 4);  // [B, T, E]
  const KerasMultiHeadAttention q = layer.quantize_dynamic();
  EXPECT_TRUE(q.quantized());
  EXPECT_FALSE(layer.quantized());
  const auto a = q.forward(x, x).output.to_vector<double>(), b = layer.forward(x, x).output.to_vector<double>();
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
  EXPECT_LE(std::sqrt(num / den), 3e-2);
  EXPECT_GT(std::sqrt(num / den), 1e-6);  // the int8 path ran
  EXPECT_EQ(q.get_weights().size(), layer.get_weights().size());
  EXPECT_THROW_WITH(q.backward(x, x, Tensor::zeros({2, 10, 64})), ValueError,
                    "the layer is quantized (int8); backward needs the float32 layer");
  EXPECT_THROW_WITH(KerasMultiHeadAttention(c).quantize_dynamic(), ValueError,
                    "KerasMultiHeadAttention.quantize_dynamic: the layer is not built");
}

// New weights into a quantized layer keep it quantized, with its weight bits, as
// MultiheadAttention::load_state_dict re-quantizes: set_weights made it float32 again without a
// word (the same numbers as the float32 layer of those weights).
TEST(KerasMhaQuantized, NewWeightsAreQuantizedToo) {
  KerasMultiHeadAttentionConfig c;
  c.num_heads = 2, c.key_dim = 8, c.use_gate = true;
  KerasMultiHeadAttention a(c), b(c);
  a.build(16, 16, 16, 3);
  b.build(16, 16, 16, 7);
  const Tensor x = Tensor::randn({2, 5, 16}, 4);  // [B, T, E]
  for (int bits : {7, 8}) {
    KerasMultiHeadAttention q = a.quantize_dynamic(bits);
    q.set_weights(b.get_weights());
    EXPECT_TRUE(q.quantized());
    EXPECT_EQ(q.forward(x, x).output.to_vector<float>(),
              b.quantize_dynamic(bits).forward(x, x).output.to_vector<float>());
    EXPECT_NE(q.forward(x, x).output.to_vector<float>(), b.forward(x, x).output.to_vector<float>());
  }
}

// A weight list that fails its checks part way (the key bias misshapen) leaves the layer as it
// was: the query projection had already been replaced by the new one, the rest not.
TEST(KerasMhaQuantized, FailedSetWeightsLeavesTheLayerAsItWas) {
  KerasMultiHeadAttentionConfig c;
  c.num_heads = 2, c.key_dim = 8;
  KerasMultiHeadAttention a(c), b(c);
  a.build(16, 16, 16, 3);
  b.build(16, 16, 16, 7);
  const Tensor x = Tensor::randn({2, 5, 16}, 4);
  const auto before = a.forward(x, x).output.to_vector<float>();
  std::vector<Tensor> bad = b.get_weights();
  bad[3] = Tensor::zeros({3, 8});  // key/bias, not [2, 8]
  EXPECT_THROW_WITH(a.set_weights(bad), ShapeError, "key/bias");
  EXPECT_EQ(a.forward(x, x).output.to_vector<float>(), before);
}

}  // namespace
}  // namespace qkv::nn
