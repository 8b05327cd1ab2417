// Read-only storage: a wrapped buffer marked read-only stays read-only in every view,
// every qkv write into it is a ValueError, and copies are writable again.
#include <gtest/gtest.h>

#include <vector>

#include "common/expect.h"
#include "qkv/einops.h"
#include "qkv/einsum.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

Tensor read_only_2x3(std::vector<float>& buffer) {
  buffer = {0, 1, 2, 3, 4, 5};
  return Tensor::from_blob(buffer.data(), {2, 3}, DType::f32, {}, nullptr, /*read_only=*/true);
}

TEST(ReadOnly, WritesIntoAReadOnlyTensorAreErrorsAndChangeNothing) {
  std::vector<float> buffer;
  const Tensor t = read_only_2x3(buffer);
  ASSERT_TRUE(t.is_read_only());
  EXPECT_THROW_WITH(t.set_item({0, 0}, 9.0), ValueError, "set_item: tensor of shape [2, 3] is read-only");
  EXPECT_THROW_WITH(t.fill(9.0), ValueError, "fill: tensor of shape [2, 3] is read-only");
  EXPECT_THROW_WITH(t.copy_from(Tensor::ones({2, 3})), ValueError, "copy_from: tensor of shape [2, 3] is read-only");
  EXPECT_THROW_WITH(t.at<float>({1, 1}), ValueError, "at: tensor of shape [2, 3] is read-only");
  EXPECT_EQ(t.at<const float>({1, 1}), 4.0f);  // reading is fine
  EXPECT_EQ(t.item({1, 2}), 5.0);
  EXPECT_EQ(buffer, (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

TEST(ReadOnly, ViewsStayReadOnlyAndCopiesAreWritable) {
  std::vector<float> buffer;
  const Tensor t = read_only_2x3(buffer);
  for (const Tensor& v : {t.transpose(0, 1), t.slice(1, 0, 2), t.select(0, 1), t.reshape({3, 2}),
                          t.unsqueeze(0).expand({4, 2, 3}), t.contiguous(), t.to(DType::f32)}) {
    EXPECT_TRUE(v.is_read_only()) << shape_str(v.shape());
    EXPECT_THROW_WITH(v.fill(1.0), ValueError, "is read-only");
  }
  for (const Tensor& c : {t.clone(), t.to(DType::f64), t.transpose(0, 1).contiguous()}) {
    EXPECT_FALSE(c.is_read_only());
    c.fill(7.0);
  }
  EXPECT_EQ(buffer, (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

TEST(ReadOnly, EinsumAndRearrangeViewsOfReadOnlyInputsAreReadOnly) {
  std::vector<float> buffer;
  const Tensor t = read_only_2x3(buffer);
  const Tensor transposed = einsum("ij->ji", {t});
  ASSERT_TRUE(transposed.shares_storage(t));  // a view, as numpy returns
  EXPECT_TRUE(transposed.is_read_only());
  EXPECT_THROW_WITH(transposed.set_item({0, 1}, 1.0), ValueError, "is read-only");
  std::vector<float> square = {1, 2, 3, 4};
  const Tensor sq = Tensor::from_blob(square.data(), {2, 2}, DType::f32, {}, nullptr, true);
  EXPECT_TRUE(einsum("ii->i", {sq}).is_read_only());
  const Tensor r = einops::rearrange(t, "a b -> b a");
  EXPECT_TRUE(r.shares_storage(t) && r.is_read_only());
  EXPECT_FALSE(einsum("ij->i", {t}).is_read_only());  // computed: a new tensor
  EXPECT_EQ(buffer, (std::vector<float>{0, 1, 2, 3, 4, 5}));
}

TEST(ReadOnly, WritableBuffersStayWritable) {
  std::vector<float> buffer(6, 0.0f);
  const Tensor t = Tensor::from_blob(buffer.data(), {2, 3}, DType::f32);
  EXPECT_FALSE(t.is_read_only());
  t.transpose(0, 1).set_item({2, 1}, 3.0);
  t.at<float>({0, 0}) = 1.0f;
  EXPECT_EQ(buffer, (std::vector<float>{1, 0, 0, 0, 0, 3}));
}

}  // namespace
}  // namespace qkv
