// qkv::softmax on tensors: any dim, any layout, f32 and f64, and its errors.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "qkv/error.h"
#include "qkv/softmax.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

// Softmax of one line from the definition, in long double (not qkv's
// softmax_reference, which is the f64 path under test): exp(x - max) / sum.
std::vector<double> softmax_line(const std::vector<double>& x) {
  long double m = -INFINITY;
  for (double e : x) m = std::max<long double>(m, e);
  std::vector<double> y(x.size(), 0.0);
  if (m == -INFINITY) return y;  // fully masked: zeros (_safe_softmax)
  long double sum = 0;
  for (double e : x) sum += std::exp(static_cast<long double>(e) - m);
  for (size_t j = 0; j < x.size(); ++j) y[j] = static_cast<double>(std::exp(static_cast<long double>(x[j]) - m) / sum);
  return y;
}

// Softmax of x along `dim`, line by line with softmax_line, in row-major order of x.
std::vector<double> expected_softmax(const Tensor& x, int64_t dim) {
  const std::vector<double> v = x.to_vector<double>();
  int64_t inner = 1;
  for (int64_t d = dim + 1; d < x.dim(); ++d) inner *= x.size(d);
  const int64_t len = x.size(dim), outer = x.numel() / std::max<int64_t>(len * inner, 1);
  std::vector<double> out(v.size()), line(static_cast<size_t>(len));
  for (int64_t o = 0; o < outer; ++o) {
    for (int64_t i = 0; i < inner; ++i) {
      for (int64_t j = 0; j < len; ++j) line[j] = v[(o * len + j) * inner + i];
      const std::vector<double> result = softmax_line(line);
      for (int64_t j = 0; j < len; ++j) out[(o * len + j) * inner + i] = result[j];
    }
  }
  return out;
}

void expect_softmax_matches(const Tensor& x, int64_t dim) {
  SCOPED_TRACE(testing::Message() << "shape " << shape_str(x.shape()) << " dim " << dim);
  const Tensor before = x.clone();
  const Tensor y = softmax(x, dim);
  EXPECT_EQ(y.shape(), x.shape());
  EXPECT_EQ(y.dtype(), x.dtype());
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_EQ(x.to_vector<double>(), before.to_vector<double>());  // input untouched
  const std::vector<double> got = y.to_vector<double>();
  const std::vector<double> want = expected_softmax(x, dim < 0 ? dim + x.dim() : dim);
  ASSERT_EQ(got.size(), want.size());
  // f64: a few ulps of the long double result (exp, sum and division each round);
  // f32: the SIMD exp's few ulps.
  const bool f64 = x.dtype() == DType::f64;
  const double tol = f64 ? 16 * DBL_EPSILON : 4e-6;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::fabs(got[i] - want[i]), tol * want[i] + (f64 ? DBL_MIN : FLT_MIN)) << "element " << i;
  }
}

TEST(SoftmaxOp, EveryDimOfA3dTensor) {
  const Tensor x = Tensor::randn({4, 5, 37}, 11);
  for (int64_t dim : {0, 1, 2, -1, -2, -3}) expect_softmax_matches(x, dim);
}

TEST(SoftmaxOp, NonContiguousInputs) {
  const Tensor x = Tensor::randn({6, 9, 10}, 5);
  expect_softmax_matches(x.permute({2, 0, 1}), -1);
  expect_softmax_matches(x.slice(2, 1, 10, 2), -1);
  expect_softmax_matches(x.transpose(0, 2), 1);
  expect_softmax_matches(Tensor::randn({1, 7}, 2).expand({3, 7}), -1);
}

TEST(SoftmaxOp, Float64MatchesLongDoubleDefinition) {
  const Tensor x = Tensor::randn({3, 4, 129}, 8, DType::f64);
  expect_softmax_matches(x, -1);
  expect_softmax_matches(x, 1);
}

TEST(SoftmaxOp, ManyRowsUseSeveralThreads) { expect_softmax_matches(Tensor::randn({2048, 100}, 3), -1); }

TEST(SoftmaxOp, MaskedRowsAndEntries) {
  const float inf = std::numeric_limits<float>::infinity();
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor x = Tensor::from_vector<float>({-inf, -inf, -inf, 1.0f, -inf, 2.0f}, {2, 3}).to(dt);
    const std::vector<double> y = softmax(x).to_vector<double>();
    // Row 0 fully masked: exactly 0. Row 1: e^1 / (e^1 + e^2) = 1 / (1 + e), the rest,
    // and exactly 0 for the -inf entry.
    const double w0 = 1.0 / (1.0 + std::exp(1.0));
    EXPECT_EQ(y[0], 0.0);
    EXPECT_EQ(y[1], 0.0);
    EXPECT_EQ(y[2], 0.0);
    EXPECT_NEAR(y[3], w0, 4e-7);
    EXPECT_EQ(y[4], 0.0);
    EXPECT_NEAR(y[5], 1.0 - w0, 4e-7);
  }
}

TEST(SoftmaxOp, ScalarsAndEmptyTensors) {
  EXPECT_EQ(softmax(Tensor::full({}, 3.0)).item(), 1.0);
  EXPECT_EQ(softmax(Tensor::full({}, 3.0), -1).item(), 1.0);
  EXPECT_EQ(softmax(Tensor::zeros({0, 4})).shape(), (Shape{0, 4}));
  EXPECT_EQ(softmax(Tensor::zeros({4, 0})).shape(), (Shape{4, 0}));
  EXPECT_EQ(softmax(Tensor::zeros({4, 0}), 0).shape(), (Shape{4, 0}));
}

TEST(SoftmaxOp, RejectsOtherDtypesAndBadDims) {
  EXPECT_THROW(softmax(Tensor::zeros({2, 3}, DType::i32)), DTypeError);
  EXPECT_THROW(softmax(Tensor::zeros({2, 3}, DType::f16)), DTypeError);
  EXPECT_THROW(softmax(Tensor::zeros({2, 3}), 2), IndexError);
  EXPECT_THROW(softmax(Tensor::zeros({2, 3}), -3), IndexError);
  EXPECT_THROW(softmax(Tensor::full({}, 1.0), 1), IndexError);
  try {
    softmax(Tensor::zeros({2, 3}, DType::i64));
  } catch (const DTypeError& e) {
    EXPECT_NE(std::string(e.what()).find("softmax"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("[2, 3]"), std::string::npos);
  }
}

}  // namespace
}  // namespace qkv
