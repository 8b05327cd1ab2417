// The einops pattern parser, against einops/tests/test_parsing.py.
#include "einops/parse.h"

#include <gtest/gtest.h>

#include "common/expect.h"
#include "qkv/error.h"

namespace qkv::einops_detail {
namespace {

Expression parse(std::string_view s, bool underscore = false) {
  return parse_expression(s, underscore, false, nullptr);
}

// Composition as text: groups in brackets, anonymous axes as their value.
std::string layout(const Expression& e) {
  std::string out;
  for (const Group& g : e.composition) {
    if (g.bare_ellipsis) {
      out += "... ";
      continue;
    }
    out += "(";
    for (size_t i = 0; i < g.axes.size(); ++i) {
      out += i ? " " : "";
      out += g.axes[i].anonymous()     ? std::to_string(g.axes[i].value)
             : g.axes[i].is_ellipsis() ? std::string("...")
                                       : g.axes[i].key;
    }
    out += ") ";
  }
  return out;
}

TEST(EinopsParse, NamedAxesAndGroups) {
  const Expression e = parse("a1  b1   c1    d1");
  EXPECT_EQ(layout(e), "(a1) (b1) (c1) (d1) ");
  EXPECT_FALSE(e.has_ellipsis);
  EXPECT_FALSE(e.has_non_unitary_anonymous_axes);
  EXPECT_EQ(layout(parse("batch (heads eachhead) seq")), "(batch) (heads eachhead) (seq) ");
}

TEST(EinopsParse, UnitAxesAreEmptyGroups) {
  EXPECT_EQ(layout(parse("() () () ()")), "() () () () ");
  EXPECT_EQ(layout(parse("1 1 1 ()")), "() () () () ");
  EXPECT_TRUE(parse("1 1 1 ()").identifiers.empty());
  EXPECT_EQ(layout(parse("5 1 (1 4) 1")), "(5) () (4) () ");
}

TEST(EinopsParse, AnonymousAxesAreDistinct) {
  const Expression e = parse("5 (3 4)");
  EXPECT_EQ(layout(e), "(5) (3 4) ");
  EXPECT_EQ(e.identifiers.size(), 3u);
  EXPECT_TRUE(e.has_non_unitary_anonymous_axes);
  EXPECT_EQ(parse("2 2").identifiers.size(), 2u);  // not duplicates
  EXPECT_EQ(e.composition[0].axes[0].display(), "5-axis");
}

TEST(EinopsParse, Ellipsis) {
  Expression e = parse("name1 ... a1 12 (name2 14)");
  EXPECT_EQ(layout(e), "(name1) ... (a1) (12) (name2 14) ");
  EXPECT_EQ(e.identifiers.size(), 6u);
  EXPECT_TRUE(e.has_ellipsis);
  EXPECT_FALSE(*e.has_ellipsis_parenthesized);
  e = parse("(name1 ... a1 12) name2 14");
  EXPECT_EQ(layout(e), "(name1 ... a1 12) (name2) (14) ");
  EXPECT_TRUE(*e.has_ellipsis_parenthesized);
}

TEST(EinopsParse, InvalidExpressionsThrowEinopsMessages) {
  EXPECT_NO_THROW(parse("... a b c d"));
  EXPECT_THROW_WITH(parse("... a b c d ..."), FormatError, "only one ellipsis for tensor");
  EXPECT_THROW_WITH(parse("... a b c (d ...)"), FormatError, "only one ellipsis");
  EXPECT_THROW_WITH(parse("(... a) b c (d ...)"), FormatError, "only one ellipsis");
  EXPECT_THROW_WITH(parse("a . b"), FormatError, "Expression may contain dots only inside ellipsis (...)");
  EXPECT_NO_THROW(parse("(a) b c (d ...)"));
  EXPECT_THROW_WITH(parse("(a)) b c (d ...)"), FormatError, "Brackets are not balanced");
  EXPECT_THROW_WITH(parse("(a b c (d ...)"), FormatError, "brackets inside brackets not allowed");
  EXPECT_THROW_WITH(parse("(a) (()) b c (d ...)"), FormatError, "Axis composition is one-level");
  EXPECT_THROW_WITH(parse("(a) ((b c) (d ...))"), FormatError, "one-level");
  EXPECT_THROW_WITH(parse("(a b"), FormatError, "Imbalanced parentheses in expression: \"(a b\"");
  EXPECT_NO_THROW(parse("camelCase under_scored cApiTaLs \xC3\x9F ..."));
  EXPECT_THROW_WITH(parse("1a"), FormatError, "Invalid axis identifier: 1a\nnot a valid python identifier");
  EXPECT_THROW_WITH(parse("_pre"), FormatError, "should not start or end with underscore");
  EXPECT_THROW_WITH(parse("...pre"), FormatError, "Invalid axis identifier");
  EXPECT_THROW_WITH(parse("pre..."), FormatError, "Invalid axis identifier");
  EXPECT_THROW_WITH(parse("a b a"), FormatError, "Indexing expression contains duplicate dimension \"a\"");
  EXPECT_THROW_WITH(parse("a-b"), FormatError, "Unknown character '-'");
  EXPECT_THROW_WITH(parse("a 0"), FormatError, "Anonymous axis should have positive length, not 0");
  // Lengths are read exactly up to 2^62, refused past it (never saturated to another length).
  EXPECT_EQ(parse("a 4611686018427387904").composition.at(1).axes.at(0).value, int64_t{1} << 62);
  EXPECT_EQ(parse("a 1125899906842625").composition.at(1).axes.at(0).value, (int64_t{1} << 50) + 1);
  EXPECT_THROW_WITH(parse("a 4611686018427387905"), FormatError, "Anonymous axis length 4611686018427387905 is more");
  EXPECT_THROW_WITH(parse("a 99999999999999999999"), FormatError, "99999999999999999999 is more than 2^62");
}

TEST(EinopsParse, UnderscoreOnlyWhereAllowed) {
  EXPECT_EQ(parse("_ _ a", true).composition.size(), 3u);
  EXPECT_THROW_WITH(parse("_ a"), FormatError, "should not start or end with underscore");
}

TEST(EinopsParse, AxisNameRules) {
  for (const char* good : {"a", "b", "h", "dx", "h1", "zz", "i9123", "somelongname", "Alex", "camelCase",
                           "u_n_d_e_r_score", "unreasonablyLongAxisName"}) {
    EXPECT_EQ(axis_name_problem(good, false), "") << good;
  }
  for (const char* bad : {"", "2b", "12", "_startWithUnderscore", "endWithUnderscore_", "_", "...", "\xE2\x80\xA6"}) {
    EXPECT_NE(axis_name_problem(bad, false), "") << bad;
  }
}

TEST(EinopsParse, PythonReprs) {
  EXPECT_EQ(py_tuple_repr({2, 3}), "(2, 3)");
  EXPECT_EQ(py_tuple_repr({5}), "(5,)");
  EXPECT_EQ(py_tuple_repr({}), "()");
  EXPECT_EQ(py_set_repr({"'b'", "'a'"}), "{'a', 'b'}");
  EXPECT_EQ(py_str_repr("it's"), "\"it's\"");
}

}  // namespace
}  // namespace qkv::einops_detail
