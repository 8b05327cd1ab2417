// einops.einsum: the compacted equations of einops' test_einsum.py, values against
// explicit loops, and the error cases of that test file.
#include <gtest/gtest.h>

#include "common/expect.h"
#include "qkv/einops.h"

namespace qkv::einops {
namespace {

TEST(EinopsEinsum, CompactsLikeEinops) {
  const std::pair<const char*, const char*> cases[] = {
      {"b c h w, b w -> b h", "abcd,ad->ac"},
      {"b c h w, b w, b c -> b h", "abcd,ad,ab->ac"},
      {"... one two three, three four five -> ... two five", "...abc,cde->...be"},
      {"one two three ..., three four five -> two five ...", "abc...,cde->be..."},
      {"... one two three, ... three four five -> ... two five", "...abc,...cde->...be"},
      {"first_tensor second_tensor -> first_tensor", "ab->a"},
      {"i i -> ", "aa->"},
      {" one  two  ,  three four->two  four  ", "ab,cd->bd"},
      {"i middle i -> middle", "aba->b"},
      {"i ... i -> ...", "a...a->..."},
      {"one one one -> one", "aaa->a"},
      {"..., ..., ... -> ...", "...,...,...->..."},
      {"index ->", "a->"},
  };
  for (const auto& [pattern, expected] : cases) EXPECT_EQ(compact_einsum_pattern(pattern), expected) << pattern;
}

TEST(EinopsEinsum, NamedAxesScoresMatchLoops) {
  const Tensor q = Tensor::randn({2, 3, 4, 5}, 1), k = Tensor::randn({2, 3, 6, 5}, 2);
  const Tensor s = einsum({q, k}, "batch head q d, batch head k d -> batch head q k");
  ASSERT_EQ(s.shape(), (Shape{2, 3, 4, 6}));
  for (int64_t b = 0; b < 2; ++b)
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = 0; j < 6; ++j) {
          double want = 0;
          for (int64_t d = 0; d < 5; ++d) want += q.item({b, h, i, d}) * k.item({b, h, j, d});
          ASSERT_NEAR(s.item({b, h, i, j}), want, 1e-5);
        }
}

TEST(EinopsEinsum, ErrorsOfEinopsTests) {
  EXPECT_THROW_WITH(compact_einsum_pattern("i j -> ()"), FormatError, "Singleton () axes are not yet supported");
  EXPECT_THROW_WITH(compact_einsum_pattern("i j -> (i j)"), FormatError, "Shape rearrangement is not yet supported");
  EXPECT_THROW_WITH(compact_einsum_pattern("(i j) -> i"), FormatError, "Shape rearrangement");
  EXPECT_THROW_WITH(compact_einsum_pattern("i 2 -> i"), FormatError, "Anonymous axes are not yet supported");
  EXPECT_THROW_WITH(compact_einsum_pattern("i 2j -> i"), FormatError, "Invalid axis identifier");
  EXPECT_THROW_WITH(compact_einsum_pattern("i j"), FormatError, "Einsum pattern must contain '->'.");
  EXPECT_THROW_WITH(compact_einsum_pattern("i j -> k"), FormatError,
                    "Unknown axis k on right side of einsum i j -> k.");
  std::string many;
  for (int i = 0; i < 53; ++i) {
    many += 'a';
    many += std::to_string(i);
    many += ' ';
  }
  EXPECT_THROW_WITH(compact_einsum_pattern(many + "->"), FormatError, "Too many axes in einsum.");
}

}  // namespace
}  // namespace qkv::einops
