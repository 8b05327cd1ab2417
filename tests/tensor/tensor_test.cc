#include "qkv/tensor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/expect.h"
#include "qkv/parallel.h"

namespace qkv {
namespace {

Tensor iota(const Shape& shape, DType dtype = DType::f32) {
  return Tensor::arange(shape_numel(shape), dtype).reshape(shape);
}

TEST(Tensor, StorageIs64ByteAligned) {
  for (int64_t n : {1, 3, 17, 1000}) {
    Tensor t = Tensor::empty({n}, DType::i8);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % 64, 0u);
  }
}

TEST(Tensor, ContiguousStridesAndNumel) {
  Tensor t = Tensor::zeros({2, 3, 4});
  EXPECT_EQ(t.strides(), (Strides{12, 4, 1}));
  EXPECT_EQ(t.numel(), 24);
  EXPECT_EQ(t.nbytes(), 96u);
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.size(-1), 4);
  EXPECT_THROW_WITH(t.size(3), IndexError, "[2, 3, 4]");
}

TEST(Tensor, PermuteIsAViewWithPermutedStrides) {
  Tensor t = iota({2, 3, 4});
  Tensor p = t.permute({2, 0, 1});
  EXPECT_TRUE(p.shares_storage(t));
  EXPECT_EQ(p.shape(), (Shape{4, 2, 3}));
  EXPECT_EQ(p.strides(), (Strides{1, 12, 4}));
  EXPECT_FALSE(p.is_contiguous());
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 3; ++k) EXPECT_EQ(p.item({i, j, k}), t.item({j, k, i}));
}

TEST(Tensor, PermuteRejectsRepeatedAndMissingDims) {
  Tensor t = iota({2, 3, 4});
  EXPECT_THROW_WITH(t.permute({0, 0, 1}), ShapeError, "permute: dims [0, 0, 1] repeat dim 0");
  EXPECT_THROW_WITH(t.permute({0, 1}), ShapeError, "tensor of shape [2, 3, 4]");
  EXPECT_THROW_WITH(t.permute({0, 1, 5}), IndexError, "out of range");
}

TEST(Tensor, ReshapeIsAViewWhenStridesAllow) {
  Tensor t = iota({2, 3, 4});
  Tensor r = t.reshape({6, -1});
  EXPECT_TRUE(r.shares_storage(t));
  EXPECT_EQ(r.shape(), (Shape{6, 4}));
  // Merging dims that stay adjacent in memory after a permute is still a view.
  Tensor p = t.permute({1, 2, 0});  // [3, 4, 2], strides [4, 1, 12]
  Tensor merged = p.reshape({12, 2});
  EXPECT_TRUE(merged.shares_storage(t));
  EXPECT_EQ(merged.item({5, 1}), t.item({1, 1, 1}));
}

TEST(Tensor, ReshapeCopiesWhenNoViewExists) {
  Tensor t = iota({2, 3});
  Tensor r = t.transpose(0, 1).reshape({6});
  EXPECT_FALSE(r.shares_storage(t));
  EXPECT_EQ(r.to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  EXPECT_THROW_WITH(t.transpose(0, 1).view({6}), ShapeError, "without a copy");
}

TEST(Tensor, ReshapeErrorsNameTheShapes) {
  Tensor t = iota({2, 3});
  EXPECT_THROW_WITH(t.reshape({4, -1}), ShapeError, "reshape: shape [4, -1] is invalid for input of shape [2, 3]");
  EXPECT_THROW_WITH(t.reshape({-1, -1}), ShapeError, "only one dimension can be -1");
}

TEST(Tensor, SliceFollowsPythonSemantics) {
  Tensor t = iota({10});
  EXPECT_EQ(t.slice(0, 2, 8, 3).to_vector<float>(), (std::vector<float>{2, 5}));
  EXPECT_EQ(t.slice(0, -3, 100).to_vector<float>(), (std::vector<float>{7, 8, 9}));
  EXPECT_EQ(t.slice(0, 5, 2).numel(), 0);
  EXPECT_THROW_WITH(t.slice(0, 0, 5, 0), ValueError, "step 0");
  Tensor m = iota({3, 4}).slice(1, 1, 3);
  EXPECT_EQ(m.shape(), (Shape{3, 2}));
  EXPECT_EQ(m.item({2, 1}), 10.0);
}

TEST(Tensor, SelectSqueezeUnsqueeze) {
  Tensor t = iota({2, 3, 4});
  EXPECT_EQ(t.select(1, -1).shape(), (Shape{2, 4}));
  EXPECT_EQ(t.select(1, -1).item({1, 2}), 22.0);
  Tensor u = t.unsqueeze(1);
  EXPECT_EQ(u.shape(), (Shape{2, 1, 3, 4}));
  EXPECT_EQ(u.squeeze(1).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(t.unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_THROW_WITH(t.squeeze(0), ShapeError, "has size 2, not 1");
}

TEST(Tensor, ExpandBroadcastsWithZeroStrides) {
  Tensor t = iota({3, 1});
  Tensor e = t.expand({2, 3, 4});
  EXPECT_EQ(e.strides(), (Strides{0, 1, 0}));
  EXPECT_TRUE(e.shares_storage(t));
  EXPECT_EQ(e.item({1, 2, 3}), 2.0);
  EXPECT_EQ(t.expand({-1, 5}).shape(), (Shape{3, 5}));
  EXPECT_THROW_WITH(t.expand({2, 4}), ShapeError, "expand: tensor of shape [3, 1] cannot expand to [2, 4]");
  // A contiguous copy materializes the broadcast.
  EXPECT_EQ(e.contiguous().strides(), (Strides{12, 4, 1}));
  EXPECT_EQ(e.contiguous().item({1, 2, 3}), 2.0);
}

TEST(Tensor, CopyFromBroadcastsAndConverts) {
  Tensor dst = Tensor::zeros({2, 3}, DType::f64);
  dst.copy_from(Tensor::from_vector<int32_t>({1, 2, 3}, {3}));
  EXPECT_EQ(dst.to_vector<double>(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  EXPECT_THROW_WITH(dst.copy_from(iota({4})), ShapeError, "[4]");
}

TEST(Tensor, ElementAccessChecksDtypeAndRange) {
  Tensor t = iota({2, 2});
  t.at<float>({1, 0}) = 7.0f;
  EXPECT_EQ(t.item({1, 0}), 7.0);
  EXPECT_EQ(t.item({-1, -2}), 7.0);
  EXPECT_THROW_WITH(t.at<double>({0, 0}), DTypeError, "requested float64 from a float32 tensor");
  EXPECT_THROW_WITH(t.item({2, 0}), IndexError, "index [2, 0] out of range for tensor of shape [2, 2]");
  EXPECT_THROW_WITH(t.item({0}), IndexError, "has 1 entries");
  t.set_item({0, 1}, 2.5);
  EXPECT_EQ(t.at<float>({0, 1}), 2.5f);
}

TEST(Tensor, FromBlobIsZeroCopyAndKeepsOwnerAlive) {
  auto owner = std::make_shared<std::vector<float>>(std::vector<float>{1, 2, 3, 4, 5, 6});
  std::weak_ptr<std::vector<float>> watch = owner;
  Tensor t = Tensor::from_blob(owner->data(), {3, 2}, DType::f32, {}, owner);
  EXPECT_EQ(t.data<float>(), owner->data());
  owner.reset();
  EXPECT_FALSE(watch.expired());  // the tensor holds it
  EXPECT_EQ(t.item({2, 1}), 6.0);
  Tensor col = Tensor::from_blob(t.data<float>(), {2, 3}, DType::f32, {1, 2});  // Fortran view
  EXPECT_EQ(col.item({1, 0}), 2.0);
  t = Tensor();
  EXPECT_TRUE(watch.expired());
}

TEST(Tensor, HalfConversionsRoundToNearestEven) {
  // bfloat16 keeps 7 fraction bits: 1 + 2^-8 is a tie (-> 1), 1 + 3 * 2^-8 rounds up to 1 + 2^-6.
  Tensor t = Tensor::from_vector<double>({1.0 + 0x1p-8, 1.0 + 3 * 0x1p-8, -2.0, 3.0e38}, {4});
  const auto bf = t.to(DType::bf16).to_vector<double>();
  EXPECT_EQ(bf[0], 1.0);
  EXPECT_EQ(bf[1], 1.0 + 0x1p-6);
  EXPECT_EQ(bf[2], -2.0);
  // float16: max 65504, 65520 overflows to inf, 2^-24 is the smallest subnormal, 2^-25 ties to 0.
  Tensor h = Tensor::from_vector<double>({65504.0, 65520.0, 0x1p-24, 0x1p-25, 3 * 0x1p-26, 1.0 / 3.0}, {6});
  const auto hf = h.to(DType::f16).to_vector<double>();
  EXPECT_EQ(hf[0], 65504.0);
  EXPECT_TRUE(std::isinf(hf[1]));
  EXPECT_EQ(hf[2], 0x1p-24);
  EXPECT_EQ(hf[3], 0.0);
  EXPECT_EQ(hf[4], 0x1p-24);
  EXPECT_EQ(hf[5], 0.333251953125);  // numpy.float16(1/3)
  EXPECT_TRUE(std::isnan(Tensor::full({1}, NAN).to(DType::f16).item({0})));
}

TEST(Tensor, FloatToIntSaturatesAndMapsNanToZero) {
  Tensor t = Tensor::from_vector<double>({1e10, -1e10, NAN, -3.7, 200.0}, {5});
  EXPECT_EQ(
      t.to(DType::i32).to_vector<int64_t>(),
      (std::vector<int64_t>{std::numeric_limits<int32_t>::max(), std::numeric_limits<int32_t>::min(), 0, -3, 200}));
  EXPECT_EQ(t.to(DType::i8).to_vector<int64_t>()[4], 127);
  EXPECT_EQ(t.to(DType::b8).to_vector<int64_t>(), (std::vector<int64_t>{1, 1, 1, 1, 1}));
}

TEST(Tensor, RandomValuesDependOnlyOnSeedAndIndex) {
  const int before = get_num_threads();
  set_num_threads(1);
  Tensor a = Tensor::randn({100000}, 42);
  set_num_threads(2);
  Tensor b = Tensor::randn({100000}, 42);
  set_num_threads(before);
  EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>());
  EXPECT_NE(Tensor::randn({8}, 43).to_vector<float>(), a.slice(0, 0, 8).to_vector<float>());
  double sum = 0, sq = 0;
  for (float x : a.to_vector<float>()) {
    sum += x;
    sq += double(x) * x;
  }
  const double mean = sum / 1e5, var = sq / 1e5 - mean * mean;
  EXPECT_NEAR(mean, 0.0, 0.02);  // 5 sigma of the sample mean is 0.016
  EXPECT_NEAR(var, 1.0, 0.03);
  Tensor u = Tensor::uniform({10000}, 7, -2.0, 3.0, DType::f64);
  for (double x : u.to_vector<double>()) {
    ASSERT_GE(x, -2.0);
    ASSERT_LT(x, 3.0);
  }
}

TEST(Tensor, PrintsLikeNumpy) {
  EXPECT_EQ(iota({2, 2}).to_string(), "array([[0., 1.],\n       [2., 3.]], dtype=float32)");
  EXPECT_EQ(Tensor::from_vector<double>({0.5, 0.25, 10.0}, {3}).to_string(), "array([ 0.5 ,  0.25, 10.  ])");
  // Fewest digits that round-trip in the element type, as numpy's repr.
  EXPECT_EQ(Tensor::from_vector<float>({0.46831101f, 1.0f / 3.0f}, {2}).to_string(),
            "array([0.468311  , 0.33333334], dtype=float32)");
  EXPECT_EQ(Tensor::from_vector<double>({1.0 / 3.0, 2.0}, {2}).to(DType::f16).to_string(),
            "array([0.3333, 2.    ], dtype=float16)");
  EXPECT_EQ(Tensor::from_vector<int64_t>({1, -20, 3}, {3}).to_string(), "array([  1, -20,   3])");
  EXPECT_EQ(Tensor::from_vector<bool>({true, false}, {2}).to_string(), "array([ True, False])");
  EXPECT_EQ(Tensor::full({}, 2.5, DType::f64).to_string(), "array(2.5)");
  EXPECT_EQ(Tensor::zeros({0, 3}).to_string(), "array([], shape=[0, 3], dtype=float32)");
  const std::string big = Tensor::arange(2000, DType::i32).to_string();
  EXPECT_NE(big.find("array([   0,    1,    2, ..., 1997, 1998, 1999]"), std::string::npos) << big;
  EXPECT_NE(big.find("shape=[2000]"), std::string::npos) << big;
  EXPECT_NE(big.find("dtype=int32"), std::string::npos);
}

TEST(Tensor, BroadcastShapesNamesBothShapes) {
  EXPECT_EQ(broadcast_shapes({2, 1, 4}, {3, 1}), (Shape{2, 3, 4}));
  EXPECT_THROW_WITH(broadcast_shapes({2, 3}, {4, 3}, "add"), ShapeError,
                    "add: shapes [2, 3] and [4, 3] cannot be broadcast");
}

}  // namespace
}  // namespace qkv
