// pack / unpack and parse_shape, with the cases of einops' test_packing.py and test_other.py.
#include <gtest/gtest.h>

#include <limits>

#include "common/expect.h"
#include "qkv/einops.h"

namespace qkv::einops {
namespace {

Tensor iota(const Shape& shape, double start = 0) {
  Tensor t = Tensor::arange(shape_numel(shape), DType::f64).reshape(shape);
  Tensor out = Tensor::empty(shape, DType::f64);
  double* p = out.data<double>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = start + static_cast<double>(i);
  return out;
}

TEST(Pack, ConcatenatesAlongStarAndReportsShapes) {
  const Tensor a = iota({2, 3, 5}), b = iota({2, 3, 7, 5}, 100), c = iota({2, 3, 7, 9, 5}, 1000);
  const Packed p = pack({a, b, c}, "i j * k");
  ASSERT_EQ(p.tensor.shape(), (Shape{2, 3, 71, 5}));
  EXPECT_EQ(p.packed_shapes, (std::vector<Shape>{{}, {7}, {7, 9}}));
  EXPECT_EQ(p.tensor.item({1, 2, 0, 4}), a.item({1, 2, 4}));
  EXPECT_EQ(p.tensor.item({1, 2, 1 + 3, 4}), b.item({1, 2, 3, 4}));
  EXPECT_EQ(p.tensor.item({1, 2, 8 + 2 * 9 + 4, 1}), c.item({1, 2, 2, 4, 1}));
  const std::vector<Tensor> back = unpack(p.tensor, p.packed_shapes, "i j * k");
  ASSERT_EQ(back.size(), 3u);
  EXPECT_TRUE(back[2].shares_storage(p.tensor));
  EXPECT_EQ(back[1].shape(), b.shape());
  EXPECT_EQ(back[2].to_vector<double>(), c.to_vector<double>());
}

TEST(Pack, StackingPatterns) {
  const Tensor r = iota({4, 5}), g = iota({4, 5}, 50);
  EXPECT_EQ(pack({r, g}, "h w *").tensor.shape(), (Shape{4, 5, 2}));
  EXPECT_EQ(pack({r, g}, "* h w").tensor.item({1, 0, 0}), 50.0);
  EXPECT_EQ(pack({r, g}, "h *").tensor.shape(), (Shape{4, 10}));
}

TEST(Pack, PatternErrors) {
  const Tensor r = iota({4, 5});
  EXPECT_THROW_WITH(
      pack({r}, "h w nonexisting_axis *"), ShapeError,
      "packed tensor #0 (enumeration starts with 0) has shape (4, 5), while pattern h w nonexisting_axis * "
      "assumes at least 3 axes");
  EXPECT_THROW_WITH(pack({r}, "h _w *"), FormatError, "Invalid axis name _w in pack(..., \"h _w *\")");
  EXPECT_THROW_WITH(pack({r}, "h_ w *"), FormatError, "Invalid axis name h_");
  EXPECT_THROW_WITH(pack({r}, "1 w *"), FormatError, "Invalid axis name 1");
  EXPECT_THROW_WITH(pack({r}, "h h *"), FormatError, "Duplicates in axes names in pack(..., \"h h *\")");
  EXPECT_THROW_WITH(pack({r}, "h w"), FormatError, "No *-axis in pack(..., \"h w\")");
  EXPECT_NO_THROW(pack({r}, "h H *"));
}

TEST(Unpack, MinusOneAndErrorsOfEinopsTests) {
  const Tensor x = iota({3, 5, 4});  // unpacked axis of length 5
  const char* pattern = "three * four";
  EXPECT_EQ(unpack(x, {{2}, {1}, {-1}}, pattern)[2].shape(), (Shape{3, 2, 4}));
  EXPECT_EQ(unpack(x, {{2}, {3}, {-1}}, pattern)[2].shape(), (Shape{3, 0, 4}));
  EXPECT_EQ(unpack(x, {{1, 2}, {1, -1}, {1, 1}}, pattern)[1].shape(), (Shape{3, 1, 2, 4}));
  EXPECT_EQ(unpack(x, {{2, -1}, {1, 5}}, pattern)[0].shape(), (Shape{3, 2, 0, 4}));
  EXPECT_EQ(unpack(x, {{-1}, {5}, {0}}, pattern)[0].shape(), (Shape{3, 0, 4}));
  for (const std::vector<Shape>& bad : std::vector<std::vector<Shape>>{{{2}, {1}, {1}},
                                                                       {{4}, {1}, {1}},
                                                                       {{2}, {4}, {-1}},
                                                                       {{-1}, {1}, {5}},
                                                                       {{-1, 2}, {1}, {5}},
                                                                       {{2, 2}, {2}, {5, -1}},
                                                                       {{2, 1}, {1}, {3, -1}},
                                                                       {{2, 1}, {3, -1}, {1}},
                                                                       {{3, -1}, {2, 1}, {1}}}) {
    EXPECT_THROW_WITH(unpack(x, bad, pattern), ShapeError,
                      "Error during unpack(..., \"three * four\"): could not split axis of size 5 into requested");
  }
  EXPECT_THROW_WITH(unpack(x, {{-1}, {-1}}, pattern), ShapeError, "received more than one -1 in [[-1], [-1]]");
  EXPECT_THROW_WITH(unpack(x, {{5}}, "* four"), ShapeError,
                    "unpack(..., * four) received input of wrong dim with shape (3, 5, 4)");
}

// Split points summing lengths of 2^62 each overflowed int64 (UBSan, api_python fuzz finding;
// seen by `make asan`): saturated, they slice as Python's unbounded ints do, and the request
// fails as einops' does.
TEST(Unpack, SplitPointsOfHugeLengthsSaturate) {
  const Tensor x = iota({3});
  const int64_t big = int64_t{1} << 62;
  for (const std::vector<Shape>& bad :
       std::vector<std::vector<Shape>>{{{big}, {big}, {-1}}, {{-1}, {big}, {big}, {big}}, {{big}, {big}, {big}}}) {
    EXPECT_THROW_WITH(unpack(x, bad, "*"), ShapeError,
                      "Error during unpack(..., \"*\"): could not split axis of size 3 into requested");
  }
  // -2^63 has no int64 magnitude (UBSan: negation overflow, einops fuzz finding).
  const int64_t min = std::numeric_limits<int64_t>::min();
  EXPECT_THROW_WITH(unpack(x, {{2, min}, {-1}}, "*"), ShapeError, "shape (2, -9223372036854775808) has a dim of -2^63");
}

TEST(ParseShape, NamesUnderscoresEllipsisAndAnonymousAxes) {
  const Shape s{10, 20, 30, 40};
  EXPECT_EQ(parse_shape(s, "a b c d"), (AxisLengths{{"a", 10}, {"b", 20}, {"c", 30}, {"d", 40}}));
  EXPECT_EQ(parse_shape(s, "_ _ _ _"), AxisLengths{});
  EXPECT_EQ(parse_shape(s, "_ _ a1 a1a111a"), (AxisLengths{{"a1", 30}, {"a1a111a", 40}}));
  EXPECT_EQ(parse_shape(Shape{10, 20}, "..."), AxisLengths{});
  EXPECT_EQ(parse_shape(Shape{10}, "... a"), (AxisLengths{{"a", 10}}));
  EXPECT_EQ(parse_shape(s, " a ... b"), (AxisLengths{{"a", 10}, {"b", 40}}));
  EXPECT_EQ(parse_shape(Shape{10, 40}, " a ... b"), (AxisLengths{{"a", 10}, {"b", 40}}));
  EXPECT_EQ(parse_shape(Shape{1, 2, 3, 4}, "1 2 3 a"), (AxisLengths{{"a", 4}}));
  EXPECT_EQ(parse_shape(Shape{10, 1, 2}, "a () 2"), (AxisLengths{{"a", 10}}));
  EXPECT_EQ(parse_shape(Tensor::zeros({2, 3}), "b c"), (AxisLengths{{"b", 2}, {"c", 3}}));
}

TEST(ParseShape, Failures) {
  const Shape s{1, 2, 3, 4};
  EXPECT_THROW_WITH(parse_shape(s, "a b c"), ShapeError,
                    "Can't parse shape with different number of dimensions: a b c (1, 2, 3, 4)");
  EXPECT_THROW_WITH(parse_shape(s, "2 a b c"), ShapeError, "Length of anonymous axis does not match");
  EXPECT_THROW_WITH(parse_shape(s, "a b c ()"), ShapeError, "Length of axis is not 1: a b c () (1, 2, 3, 4)");
  EXPECT_THROW_WITH(parse_shape(s, "a b c d e"), ShapeError, "different number of dimensions");
  EXPECT_THROW_WITH(parse_shape(s, "a b c d e ..."), ShapeError, "Can't parse shape with this number of dimensions");
  EXPECT_THROW_WITH(parse_shape(s, "a (b c) d"), ShapeError, "Can't parse shape with composite axes");
  EXPECT_THROW_WITH(parse_shape(s, "a a b b"), FormatError, "duplicate dimension \"a\"");
}

}  // namespace
}  // namespace qkv::einops
