// qkv::nn::Linear against plain double loops, in both weight layouts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/expect.h"
#include "nn/fixtures.h"
#include "qkv/nn/linear.h"

namespace {

using qkv::Tensor;
using qkv::nn::Linear;
using qkv::nn::testing::relative_error;

// y[r, o] = sum_i x[r, i] * w[o, i] + b[o] in double; x [R, in], w [out, in].
Tensor oracle(const Tensor& x, const Tensor& w, const Tensor* b) {
  const int64_t rows = x.size(0), in = x.size(1), out = w.size(0);
  Tensor y = Tensor::empty({rows, out}, qkv::DType::f64);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t o = 0; o < out; ++o) {
      double s = b ? b->item({o}) : 0.0;
      for (int64_t i = 0; i < in; ++i) s += x.item({r, i}) * w.item({o, i});
      y.set_item({r, o}, s);
    }
  }
  return y;
}

TEST(Linear, TorchLayoutMatchesLoops) {
  const Tensor x = Tensor::randn({2, 3, 7}, 1), w = Tensor::randn({5, 7}, 2), b = Tensor::randn({5}, 3);
  const Tensor y = Linear::torch(w, b).forward(x);
  EXPECT_EQ(y.shape(), (qkv::Shape{2, 3, 5}));
  EXPECT_LE(relative_error(y.reshape({6, 5}), oracle(x.reshape({6, 7}), w, &b)), 1e-6);
  EXPECT_LE(
      relative_error(Linear::torch(w, std::nullopt).forward(x).reshape({6, 5}), oracle(x.reshape({6, 7}), w, nullptr)),
      1e-6);
}

TEST(Linear, StridedInputsAndWeightRowsAreReadInPlace) {
  const Tensor big = Tensor::randn({12, 7}, 4);
  const Tensor w = big.slice(0, 4, 9);                              // rows 4..8 of a packed weight
  const Tensor x = Tensor::randn({7, 4, 3}, 5).permute({1, 2, 0});  // [4, 3, 7], not contiguous
  const Tensor y = Linear::torch(w, std::nullopt).forward(x);
  EXPECT_LE(relative_error(y.reshape({12, 5}), oracle(x.reshape({12, 7}), w.contiguous(), nullptr)), 1e-6);
}

TEST(Linear, KerasEinsumDenseKernelIsTheTransposedTorchWeight) {
  // Keras "abc,cde->abde": kernel [dim, heads, key_dim], bias [heads, key_dim].
  const Tensor kernel = Tensor::randn({6, 2, 3}, 6), bias = Tensor::randn({2, 3}, 7);
  const Linear k = Linear::keras(kernel, bias);
  const Linear t = Linear::torch(k.to_torch_layout(), k.bias());
  EXPECT_EQ(k.to_torch_layout().shape(), (qkv::Shape{6, 6}));
  EXPECT_EQ(relative_error(t.to_keras_layout().reshape({6, 2, 3}), kernel), 0.0);
  const Tensor x = Tensor::randn({2, 4, 6}, 8);
  // y[a, b, d, e] = sum_c x[a, b, c] kernel[c, d, e] + bias[d, e]: the loops with
  // w[(d e), c] = kernel[c, (d e)].
  const Tensor flat_bias = bias.reshape({6});
  const Tensor want = oracle(x.reshape({8, 6}), kernel.reshape({6, 6}).transpose(0, 1), &flat_bias);
  EXPECT_LE(relative_error(k.forward(x).reshape({8, 6}), want), 1e-6);
  EXPECT_LE(relative_error(t.forward(x).reshape({8, 6}), want), 1e-6);
  // Output dense "abcd,cde->abe": kernel [heads, value_dim, out], two contracted axes.
  const Tensor okernel = Tensor::randn({2, 3, 5}, 9);
  const Linear o = Linear::keras(okernel, std::nullopt, 2);
  EXPECT_EQ(o.in_features(), 6);
  EXPECT_LE(
      relative_error(o.forward(x),
                     oracle(x.reshape({8, 6}), okernel.reshape({6, 5}).transpose(0, 1), nullptr).reshape({2, 4, 5})),
      1e-6);
}

TEST(Linear, ErrorsNameShapes) {
  EXPECT_THROW_WITH(Linear::torch(Tensor::zeros({3, 4}), Tensor::zeros({4})), qkv::ShapeError,
                    "Linear: bias: expected shape [3], got [4]");
  EXPECT_THROW_WITH(Linear::torch(Tensor::zeros({3, 4}), std::nullopt).forward(Tensor::zeros({2, 5})), qkv::ShapeError,
                    "does not end in in_features 4");
  EXPECT_THROW_WITH(Linear::keras(Tensor::zeros({3, 4}), std::nullopt, 2), qkv::ShapeError, "needs more than 2");
}

// The backward against loops in double from its definition: with L = sum(y * g) for the
// forward y = x W^T + b (torch layout), dL/dx = g W, dL/dW = g^T x, dL/db = sum g.
TEST(LinearBackward, MatchesTheDefinitionInBothLayouts) {
  const Tensor w = Tensor::randn({5, 7}, 1), b = Tensor::randn({5}, 2);
  const Tensor x = Tensor::randn({2, 3, 7}, 3), g = Tensor::randn({2, 3, 5}, 4);
  const Linear torch = Linear::torch(w, b);
  const Linear keras = Linear::keras(w.transpose(0, 1).contiguous(), b);  // the same map, [in, out]
  for (const Linear* l : {&torch, &keras}) {
    const qkv::nn::LinearGradients got = l->backward(x, g);
    ASSERT_EQ(got.dx.shape(), x.shape());
    ASSERT_TRUE(got.dbias.has_value());
    const bool t = l == &torch;
    double e_dx = 0, e_dw = 0, e_db = 0;
    for (int64_t r = 0; r < 6; ++r) {
      for (int64_t i = 0; i < 7; ++i) {
        double s = 0;
        for (int64_t o = 0; o < 5; ++o) s += g.item({r / 3, r % 3, o}) * w.item({o, i});
        e_dx = std::max(e_dx, std::fabs(got.dx.item({r / 3, r % 3, i}) - s));
      }
    }
    for (int64_t o = 0; o < 5; ++o) {
      double sb = 0;
      for (int64_t r = 0; r < 6; ++r) sb += g.item({r / 3, r % 3, o});
      e_db = std::max(e_db, std::fabs(got.dbias->item({o}) - sb));
      for (int64_t i = 0; i < 7; ++i) {
        double s = 0;
        for (int64_t r = 0; r < 6; ++r) s += g.item({r / 3, r % 3, o}) * x.item({r / 3, r % 3, i});
        const double have = t ? got.dweight.item({o, i}) : got.dweight.item({i, o});
        e_dw = std::max(e_dw, std::fabs(have - s));
      }
    }
    EXPECT_LT(e_dx, 1e-5) << (t ? "torch" : "keras");
    EXPECT_LT(e_dw, 1e-5) << (t ? "torch" : "keras");
    EXPECT_LT(e_db, 1e-5) << (t ? "torch" : "keras");
  }
  EXPECT_THROW_WITH(torch.backward(x, Tensor::randn({2, 3, 4}, 5)), qkv::ShapeError,
                    "Linear.backward: dy must have shape [2, 3, 5], got [2, 3, 4]");
  EXPECT_THROW(torch.quantize_dynamic().backward(x, g), qkv::ValueError);
}

}  // namespace
