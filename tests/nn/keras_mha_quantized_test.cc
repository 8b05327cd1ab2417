// KerasMultiHeadAttention::quantize_dynamic: int8 projections give the float32 layer's output
// within int8's rounding, through the int8 path (not the same bits), and refuse backward.
#include <gtest/gtest.h>

#include <cmath>

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

}  // namespace
}  // namespace qkv::nn
