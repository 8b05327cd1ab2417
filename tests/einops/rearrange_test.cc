// rearrange / repeat: values against explicit index arithmetic, views vs copies,
// list inputs, the recipe cache, and einops' error texts.
#include <gtest/gtest.h>

#include <thread>

#include "common/expect.h"
#include "einops/recipe.h"
#include "qkv/einops.h"

namespace qkv::einops {
namespace {

Tensor iota(const Shape& shape, DType dtype = DType::f32) {
  return Tensor::arange(shape_numel(shape), dtype).reshape(shape);
}

// x [b, t, (d k h)] -> k b h t d, checked element by element.
TEST(Rearrange, SeedSplitHeadsIsAView) {
  const int64_t B = 2, T = 3, D = 4, K = 3, H = 2;
  const Tensor x = iota({B, T, D * K * H});
  const Tensor y = rearrange(x, "b t (d k h) -> k b h t d", {{"k", K}, {"h", H}});
  EXPECT_TRUE(y.shares_storage(x));
  ASSERT_EQ(y.shape(), (Shape{K, B, H, T, D}));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t t = 0; t < T; ++t)
          for (int64_t d = 0; d < D; ++d) ASSERT_EQ(y.item({k, b, h, t, d}), x.item({b, t, (d * K + k) * H + h}));
}

TEST(Rearrange, SeedMergeHeadsCopiesOnce) {
  const int64_t B = 2, H = 3, T = 4, D = 5;
  const Tensor x = iota({B * H, T, D});
  const Tensor y = rearrange(x, "(batch heads) numq eachhead -> batch numq (heads eachhead)", {{"batch", B}});
  EXPECT_FALSE(y.shares_storage(x));
  EXPECT_TRUE(y.is_contiguous());
  ASSERT_EQ(y.shape(), (Shape{B, T, H * D}));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t d = 0; d < D; ++d) ASSERT_EQ(y.item({b, t, h * D + d}), x.item({b * H + h, t, d}));
}

TEST(Rearrange, CompositionOrderMatters) {
  const Tensor x = iota({1, 2, 6});
  const Tensor a = rearrange(x, "b t (d n) -> n b t d", {{"n", 3}});
  const Tensor c = rearrange(x, "b t (n d) -> n b t d", {{"n", 3}});
  EXPECT_EQ(a.item({1, 0, 1, 0}), x.item({0, 1, 1}));  // (d n): n is the fast index
  EXPECT_EQ(c.item({1, 0, 1, 0}), x.item({0, 1, 2}));  // (n d): d is the fast index
}

TEST(Rearrange, ContiguousMergeIsAView) {
  const Tensor x = iota({2, 3, 4});
  const Tensor y = rearrange(x, "a b c -> (a b) c");
  EXPECT_TRUE(y.shares_storage(x));
  EXPECT_EQ(y.shape(), (Shape{6, 4}));
  EXPECT_EQ(rearrange(x, "a b c -> a b c 1 ()").shape(), (Shape{2, 3, 4, 1, 1}));
  EXPECT_EQ(rearrange(x, "... -> (...)").shape(), (Shape{24}));
  EXPECT_EQ(rearrange(x, "a ... -> ... a").shape(), (Shape{3, 4, 2}));
}

TEST(Rearrange, IdentityPatternsOfEinopsTests) {
  const Tensor x = iota({2, 3, 4, 5, 6}, DType::i64);
  for (const char* p :
       {"...->...", "a b c d e-> a b c d e", "a b c d e ...-> ... a b c d e", "a b c d e ...-> a ... b c d e",
        "... a b c d e -> ... a b c d e", "a ... e-> a ... e", "a ... -> a ... ", "a ... c d e -> a (...) c d e"}) {
    EXPECT_EQ(rearrange(x, p).to_vector<int64_t>(), x.to_vector<int64_t>()) << p;
  }
}

// Both patterns of each pair of einops' test against the result written out by
// index arithmetic: x[a, b, c, d, e] = iota goes to flat position where(a..e) of y.
TEST(Rearrange, EquivalentPatternsOfEinopsTests) {
  const int64_t A = 2, B = 3, C = 4, D = 5, E = 6;
  const Tensor x = iota({A, B, C, D, E});
  using Where = int64_t (*)(int64_t, int64_t, int64_t, int64_t, int64_t);
  struct Case {
    const char *p1, *p2;
    Shape shape;
    Where where;
  };
  const Case cases[] = {
      {"a b c d e -> (a b) c d e",
       "a b ... -> (a b) ... ",
       {A * B, C, D, E},
       [](int64_t a, int64_t b, int64_t c, int64_t d, int64_t e) { return (((a * B + b) * C + c) * D + d) * E + e; }},
      {"a b c d e -> a b (c d) e",
       "... c d e -> ... (c d) e",
       {A, B, C * D, E},
       [](int64_t a, int64_t b, int64_t c, int64_t d, int64_t e) { return (((a * B + b) * C + c) * D + d) * E + e; }},
      {"a b c d e -> (a b c d e)",
       "... ->  (...)",
       {A * B * C * D * E},
       [](int64_t a, int64_t b, int64_t c, int64_t d, int64_t e) { return (((a * B + b) * C + c) * D + d) * E + e; }},
      {"a b c d e -> b (c d e) a",
       "a b ... -> b (...) a",
       {B, C * D * E, A},
       [](int64_t a, int64_t b, int64_t c, int64_t d, int64_t e) {
         return (b * C * D * E + (c * D + d) * E + e) * A + a;
       }},
      {"a b c d e -> b (a c d) e",
       "a b ... e -> b (a ...) e",
       {B, A * C * D, E},
       [](int64_t a, int64_t b, int64_t c, int64_t d, int64_t e) {
         return (b * A * C * D + (a * C + c) * D + d) * E + e;
       }}};
  for (const Case& k : cases) {
    std::vector<float> want(static_cast<size_t>(x.numel()));
    for (int64_t a = 0; a < A; ++a)
      for (int64_t b = 0; b < B; ++b)
        for (int64_t c = 0; c < C; ++c)
          for (int64_t d = 0; d < D; ++d)
            for (int64_t e = 0; e < E; ++e)
              want[static_cast<size_t>(k.where(a, b, c, d, e))] =
                  static_cast<float>((((a * B + b) * C + c) * D + d) * E + e);
    for (const char* p : {k.p1, k.p2}) {
      const Tensor y = rearrange(x, p);
      EXPECT_EQ(y.shape(), k.shape) << p;
      EXPECT_EQ(y.to_vector<float>(), want) << p;
    }
  }
}

TEST(Rearrange, ListInputsStackOnFirstAxis) {
  const Tensor a = iota({2, 3}), b = Tensor::full({2, 3}, 7.0);
  const Tensor y = rearrange(std::vector<Tensor>{a, b}, "n h w -> h (n w)");
  ASSERT_EQ(y.shape(), (Shape{2, 6}));
  EXPECT_EQ(y.item({1, 2}), a.item({1, 2}));
  EXPECT_EQ(y.item({1, 3}), 7.0);
  EXPECT_THROW_WITH(rearrange(std::vector<Tensor>{}, "a -> a"), ValueError, "empty list");
  EXPECT_THROW_WITH(rearrange(std::vector<Tensor>{a, iota({3})}, "... -> ..."), ShapeError, "element 1");
  EXPECT_THROW_WITH(rearrange(std::vector<Tensor>{a}, "a b -> a b"), ShapeError,
                    "Input is list. Additional info: {}.\n Wrong shape: expected 2 dims. Received 3-dim tensor.");
}

TEST(Repeat, BroadcastsNewAxesAsZeroStrideView) {
  const Tensor x = iota({2, 3});
  const Tensor y = repeat(x, "h w -> h w c", {{"c", 4}});
  EXPECT_TRUE(y.shares_storage(x));
  EXPECT_EQ(y.strides()[2], 0);
  const Tensor z = repeat(x, "h w -> (h h2) (w3 w)", {{"h2", 2}, {"w3", 3}});
  ASSERT_EQ(z.shape(), (Shape{4, 9}));
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 9; ++j) ASSERT_EQ(z.item({i, j}), x.item({i / 2, j % 3}));
  const Tensor a = repeat(iota({1, 2}), "1 b -> 3 b 2");
  EXPECT_EQ(a.shape(), (Shape{3, 2, 2}));
  EXPECT_EQ(a.item({2, 1, 1}), 1.0);
}

std::string message(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(EinopsErrors, QuotePatternShapeAndLengths) {
  const Tensor x = iota({2, 7});
  EXPECT_EQ(message([&] {
              rearrange(x, "b (h d) -> b h d", {{"h", 2}});
            }),
            "Error while processing rearrange-reduction pattern \"b (h d) -> b h d\".\n Input tensor shape: (2, 7). "
            "Additional info: {'h': 2}.\n Shape mismatch, can't divide axis of length 7 in chunks of 2");
  EXPECT_THROW_WITH(rearrange(x, "a b c -> a b c"), ShapeError, "Wrong shape: expected 3 dims. Received 2-dim tensor.");
  EXPECT_THROW_WITH(rearrange(x, "a b c ... -> a b c ..."), ShapeError, "expected >=3 dims");
  EXPECT_THROW_WITH(rearrange(x, "a b -> a"), FormatError,
                    "Identifiers only on one side of expression (should be on both): {'b'}");
  EXPECT_THROW_WITH(rearrange(x, "a b -> a b 2"), FormatError, "Non-unitary anonymous axes are not supported");
  EXPECT_THROW_WITH(rearrange(x, "a b -> a b ..."), FormatError, "Ellipsis found in right side, but not left side");
  EXPECT_THROW_WITH(rearrange(x, "a (b ...) -> a b ..."), FormatError, "Ellipsis inside parenthesis in the left side");
  EXPECT_THROW_WITH(rearrange(x, "a (b c) -> a b c"), FormatError, "Could not infer sizes for {'b', 'c'}");
  EXPECT_THROW_WITH(rearrange(x, "a b -> a b", {{"c", 2}}), FormatError, "Axis c is not used in transform");
  EXPECT_THROW_WITH(rearrange(x, "a b -> a b", {{"c_", 2}}), FormatError, "('Invalid name for an axis', 'c_')");
  EXPECT_THROW_WITH(rearrange(x, "a b -> b a", {{"a", 3}}), ShapeError, "Shape mismatch, 2 != 3");
  EXPECT_THROW_WITH(rearrange(x, "a b c"), FormatError, "exactly one '->'");
  EXPECT_THROW_WITH(repeat(x, "a b -> a b c"), FormatError, "Specify sizes for new axes in repeat: {'c'}");
  EXPECT_THROW_WITH(repeat(x, "a b -> a"), FormatError, "Unexpected identifiers on the left side of repeat: {'b'}");
  EXPECT_THROW_WITH(reduce(x, "a b -> a c", "sum"), FormatError,
                    "Unexpected identifiers on the right side of reduce sum: {'c'}");
  EXPECT_THROW_WITH(reduce(x, "a b -> a", "median"), FormatError,
                    "Unknown reduction median. Expect one of ('min', 'max', 'sum', 'mean', 'prod', 'any', 'all').");
  EXPECT_THROW_WITH(reduce(x, "a b -> a 2", "sum"), FormatError, "{2-axis}");
}

TEST(RecipeCache, CompilesOncePerPatternOpNamesAndNdim) {
  const Tensor x = iota({4, 6});
  const auto r1 = einops_detail::prepare_recipe("a (b c) -> c a b", einops_detail::Operation::rearrange(), {"b"}, 2);
  const auto before = einops_detail::recipe_cache_stats();
  const auto r2 = einops_detail::prepare_recipe("a (b c) -> c a b", einops_detail::Operation::rearrange(), {"b"}, 2);
  EXPECT_EQ(r1.get(), r2.get());
  EXPECT_EQ(einops_detail::recipe_cache_stats().hits, before.hits + 1);
  EXPECT_NE(einops_detail::prepare_recipe("a (b c) -> c a b", einops_detail::Operation::rearrange(), {"c"}, 2).get(),
            r1.get());
  EXPECT_NE(einops_detail::prepare_recipe("a ... -> ... a", einops_detail::Operation::rearrange(), {}, 2).get(),
            einops_detail::prepare_recipe("a ... -> ... a", einops_detail::Operation::rearrange(), {}, 3).get());
  // The cached recipe serves other lengths of the same names.
  EXPECT_EQ(rearrange(x, "a (b c) -> c a b", {{"b", 2}}).shape(), (Shape{3, 4, 2}));
  EXPECT_EQ(rearrange(x, "a (b c) -> c a b", {{"b", 3}}).shape(), (Shape{2, 4, 3}));
}

TEST(RecipeCache, ThreadSafe) {
  const Tensor x = iota({2, 3, 4});
  // y[c, (b a)] = x[a, b, c] = (a * 3 + b) * 4 + c, written out.
  std::vector<float> want(24);
  for (int64_t a = 0; a < 2; ++a)
    for (int64_t b = 0; b < 3; ++b)
      for (int64_t c = 0; c < 4; ++c)
        want[static_cast<size_t>(c * 6 + b * 2 + a)] = static_cast<float>((a * 3 + b) * 4 + c);
  std::vector<std::thread> threads;
  std::vector<int> ok(8, 0);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      for (int j = 0; j < 200; ++j) {
        const std::string p = "a b c -> c (b a) " + std::string(static_cast<size_t>(j % 7), ' ');
        const Tensor y = rearrange(x, p);
        ok[i] += y.shape() == Shape{4, 6} && y.to_vector<float>() == want;
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int v : ok) EXPECT_EQ(v, 200);
}

}  // namespace
}  // namespace qkv::einops
