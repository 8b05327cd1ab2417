// einops.reduce: values against explicit loops, numpy's result dtypes, edge cases.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "common/expect.h"
#include "qkv/einops.h"

namespace qkv::einops {
namespace {

Tensor iota(const Shape& shape, DType dtype = DType::f32) {
  return Tensor::arange(shape_numel(shape), dtype).reshape(shape);
}

TEST(Reduce, MaxPool2x2MatchesLoops) {
  const Tensor x = Tensor::randn({2, 3, 4, 6}, 7);
  const Tensor y = reduce(x, "b c (h h2) (w w2) -> b c h w", "max", {{"h2", 2}, {"w2", 2}});
  ASSERT_EQ(y.shape(), (Shape{2, 3, 2, 3}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t w = 0; w < 3; ++w) {
          double m = -INFINITY;
          for (int64_t i = 0; i < 2; ++i)
            for (int64_t j = 0; j < 2; ++j) m = std::max(m, x.item({b, c, 2 * h + i, 2 * w + j}));
          ASSERT_EQ(y.item({b, c, h, w}), m);
        }
}

TEST(Reduce, SumMeanProdMinOverPermutedAxes) {
  const Tensor x = iota({2, 3, 4}, DType::f64);
  // "a b c -> c a": reduce over b, output [c, a].
  for (const char* op : {"sum", "mean", "prod", "min", "max"}) {
    const Tensor y = reduce(x, "a b c -> c a", op);
    ASSERT_EQ(y.shape(), (Shape{4, 2}));
    for (int64_t c = 0; c < 4; ++c)
      for (int64_t a = 0; a < 2; ++a) {
        double s = 0, p = 1, lo = INFINITY, hi = -INFINITY;
        for (int64_t b = 0; b < 3; ++b) {
          const double v = x.item({a, b, c});
          s += v, p *= v, lo = std::min(lo, v), hi = std::max(hi, v);
        }
        const std::string o = op;
        const double want = o == "sum" ? s : o == "mean" ? s / 3 : o == "prod" ? p : o == "min" ? lo : hi;
        ASSERT_DOUBLE_EQ(y.item({c, a}), want) << op;
      }
  }
}

TEST(Reduce, UnitAxesKeepDims) {
  const Tensor x = iota({2, 3, 4, 5});
  const Tensor y = reduce(x, "b c h w -> b c () ()", "mean");
  EXPECT_EQ(y.shape(), (Shape{2, 3, 1, 1}));
  EXPECT_FLOAT_EQ(static_cast<float>(y.item({1, 2, 0, 0})), (100 + 119) / 2.0f);
  EXPECT_EQ(reduce(x, "b c h w -> 1 c 1 1", "sum").shape(), (Shape{1, 3, 1, 1}));
  EXPECT_EQ(reduce(x, "... -> ", "sum").item(), 119.0 * 120 / 2);
  EXPECT_EQ(reduce(x, "(a1 a2) ... (e1 e2) -> ", "max", {{"a1", 1}, {"e2", 5}}).item(), 119.0);
}

TEST(Reduce, NumpyResultDtypes) {
  const Tensor i = iota({2, 3}, DType::i32);
  EXPECT_EQ(reduce(i, "a b -> a", "sum").dtype(), DType::i64);
  EXPECT_EQ(reduce(i, "a b -> a", "prod").dtype(), DType::i64);
  EXPECT_EQ(reduce(i, "a b -> a", "max").dtype(), DType::i32);
  EXPECT_EQ(reduce(i, "a b -> a", "any").dtype(), DType::b8);
  EXPECT_EQ(reduce(iota({2, 3}, DType::f16), "a b -> a", "sum").dtype(), DType::f16);
  EXPECT_EQ(reduce(iota({2, 3}, DType::b8), "a b -> a", "sum").to_vector<int64_t>(), (std::vector<int64_t>{2, 3}));
  EXPECT_THROW_WITH(reduce(i, "a b -> a", "mean"), DTypeError, "reduce_mean is not available for non-floating tensors");
}

TEST(Reduce, AnyAllOverBooleans) {
  const Tensor x = Tensor::from_vector<bool>({true, false, false, false, true, true}, {2, 3});
  EXPECT_EQ(reduce(x, "a b -> a", "any").to_vector<bool>(), (std::vector<bool>{true, true}));
  EXPECT_EQ(reduce(x, "a b -> a", "all").to_vector<bool>(), (std::vector<bool>{false, false}));
  EXPECT_EQ(reduce(x, "a b -> b", "all").to_vector<bool>(), (std::vector<bool>{false, false, false}));
  EXPECT_EQ(reduce(x, "a b -> 1 b", "any").to_vector<bool>(), (std::vector<bool>{true, true, true}));
}

TEST(Reduce, NanPropagatesAndEmptyMaxFails) {
  Tensor x = iota({2, 2});
  x.set_item({0, 1}, std::nan(""));
  const Tensor y = reduce(x, "a b -> a", "max");
  EXPECT_TRUE(std::isnan(y.item({0})));
  EXPECT_EQ(y.item({1}), 3.0);
  EXPECT_TRUE(std::isinf(reduce(Tensor::full({1, 2}, INFINITY), "a b -> a", "min").item({0})));
  EXPECT_EQ(reduce(Tensor::zeros({3, 0}), "a b -> a", "sum").to_vector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_THROW_WITH(reduce(Tensor::zeros({3, 0}), "a b -> a", "max"), ShapeError, "zero-size array");
}

TEST(Reduce, ListInputs) {
  const Tensor a = iota({2, 3}), b = Tensor::full({2, 3}, 10.0);
  const Tensor y = reduce(std::vector<Tensor>{a, b}, "n h w -> h w", "max");
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>(6, 10.0f)));
}

TEST(Reduce, ReductionPlanForCallables) {
  const ReductionPlan p = reduction_plan({2, 3, 4}, "a b c -> c a", "f");
  EXPECT_EQ(p.init_shape, (Shape{2, 3, 4}));
  EXPECT_EQ(p.permutation, (std::vector<int64_t>{2, 0, 1}));
  EXPECT_EQ(p.n_kept, 2);
  EXPECT_EQ(p.final_shape, (Shape{4, 2}));
  const ReductionPlan q = reduction_plan({6, 5}, "(a a2) b -> (a2 a) ()", "f", {{"a2", 2}});
  EXPECT_EQ(q.init_shape, (Shape{3, 2, 5}));
  EXPECT_EQ(q.permutation, (std::vector<int64_t>{1, 0, 2}));
  EXPECT_EQ(q.n_kept, 2);
  EXPECT_EQ(q.final_shape, (Shape{6, 1}));
  EXPECT_THROW_WITH(
      reduction_plan({2, 3}, "a b -> a c", "<function f>"), FormatError,
      "Error while processing <function f>-reduction pattern \"a b -> a c\".\n Input tensor shape: (2, 3). "
      "Additional info: {}.\n Unexpected identifiers on the right side of reduce <function f>: {'c'}");
  // No string stands for a callable (the "\x02" name prefix that once did is gone): it is an
  // unknown reduction like any other name (FormatError; Python's ValueError as before).
  EXPECT_THROW_WITH(reduce(Tensor::zeros({2}), "a -> ",
                           "\x02"
                           "f"),
                    FormatError,
                    "Unknown reduction \x02"
                    "f.");
}

TEST(Reduce, TakesTheReductionAsAnEnum) {
  const Tensor x = iota({2, 3}, DType::f64);  // [[0, 1, 2], [3, 4, 5]]
  const std::pair<Reduction, std::vector<double>> cases[] = {{Reduction::sum, {3, 12}},
                                                             {Reduction::mean, {1, 4}},
                                                             {Reduction::prod, {0, 60}},
                                                             {Reduction::min, {0, 3}},
                                                             {Reduction::max, {2, 5}}};
  for (const auto& [r, want] : cases) {
    EXPECT_EQ(reduce(x, "a b -> a", r).to_vector<double>(), want) << reduction_name(r);
    EXPECT_EQ(reduction_from_name(reduction_name(r)), r);
  }
  EXPECT_EQ(reduce(x, "a b -> a", Reduction::any).to(DType::f64).to_vector<double>(), (std::vector<double>{1, 1}));
  EXPECT_EQ(reduce(x, "a b -> a", Reduction::all).to(DType::f64).to_vector<double>(), (std::vector<double>{0, 1}));
  EXPECT_EQ(reduce(std::vector<Tensor>{x, x}, "l a b -> a", Reduction::sum).to_vector<double>(),
            (std::vector<double>{6, 24}));
  EXPECT_EQ(reduction_from_name("median"), std::nullopt);
  EXPECT_EQ(reduction_from_name("Sum"), std::nullopt);  // einops' names are case-sensitive
}

}  // namespace
}  // namespace qkv::einops
