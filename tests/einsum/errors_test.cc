// Every invalid call of numpy's test_einsum_errors gets a clear qkv error naming
// the equation and the fault.
#include <gtest/gtest.h>

#include "common/expect.h"
#include "qkv/einsum.h"

namespace qkv {
namespace {

Tensor shaped(const Shape& s) { return Tensor::zeros(s, DType::f64); }

Tensor call(const std::string& eq, std::initializer_list<Tensor> ops) { return einsum(eq, ops); }

TEST(EinsumErrors, OperandCountMustMatchTerms) {
  EXPECT_THROW_WITH(einsum("", std::span<const Tensor>()), ValueError, "no operands");
  EXPECT_THROW_WITH(call("", {shaped({}), shaped({})}), ValueError, "1 input term(s) but 2 operand(s)");
  EXPECT_THROW_WITH(call(",", {shaped({}), shaped({1}), shaped({1})}), ValueError, "einsum(','):");
  EXPECT_THROW_WITH(call(",", {shaped({1})}), ValueError, "2 input term(s) but 1 operand(s)");
}

TEST(EinsumErrors, MoreLabelsThanDims) {
  EXPECT_THROW_WITH(call("i", {shaped({})}), ShapeError, "operand 0 has 0 dims but its term has 1 labels");
  EXPECT_THROW_WITH(call("ij", {shaped({2})}), ShapeError, "has 1 dims but its term has 2 labels");
  EXPECT_THROW_WITH(call("...i", {shaped({})}), ShapeError, "has 0 dims");
  EXPECT_THROW_WITH(call("i...j", {shaped({2})}), ShapeError, "has 1 dims");
  EXPECT_THROW_WITH(call("i...", {shaped({})}), ShapeError, "has 0 dims");
  EXPECT_THROW_WITH(call("ij...", {shaped({2})}), ShapeError, "has 1 dims");
}

TEST(EinsumErrors, FewerLabelsThanDimsWithoutEllipsis) {
  EXPECT_THROW_WITH(call("i", {shaped({2, 3})}), ShapeError, "no '...' to cover the rest");
  EXPECT_THROW_WITH(call("ij->i", {shaped({2, 3, 4})}), ShapeError, "(shapes [2, 3, 4])");
}

TEST(EinsumErrors, InvalidEllipsis) {
  EXPECT_THROW_WITH(call("i..", {shaped({2})}), FormatError, "invalid ellipsis in term 0 'i..'");
  EXPECT_THROW_WITH(call(".i...", {shaped({2})}), FormatError, "invalid ellipsis");
  EXPECT_THROW_WITH(call("j->..j", {shaped({2})}), FormatError, "invalid ellipsis in output");
  EXPECT_THROW_WITH(call("j->.j...", {shaped({2})}), FormatError, "invalid ellipsis in output");
  EXPECT_THROW_WITH(call("...i...", {shaped({2, 2})}), FormatError, "at most once");
  EXPECT_THROW_WITH(call("...i->i", {shaped({3, 2})}), ShapeError, "the output has no '...'");
}

TEST(EinsumErrors, InvalidCharacter) {
  EXPECT_THROW_WITH(call("i%...", {shaped({2})}), FormatError, "invalid character '%'");
  EXPECT_THROW_WITH(call("...j$", {shaped({2})}), FormatError, "invalid character '$'");
  EXPECT_THROW_WITH(call("i->&", {shaped({2})}), FormatError, "invalid character '&' in output");
  EXPECT_THROW_WITH(call("i->i->i", {shaped({2})}), FormatError, "'->' may appear only once");
  EXPECT_THROW_WITH(call("i-i", {shaped({2})}), FormatError, "invalid character '-'");
  // A non-ASCII character is quoted whole, never one byte of its UTF-8 sequence.
  EXPECT_THROW_WITH(call("\u00e4", {shaped({2})}), FormatError, "invalid character '\u00e4' in term 0");
  EXPECT_THROW_WITH(call("ij,j\u65e5->i", {shaped({2, 2}), shaped({2, 2})}), FormatError, "invalid character '\u65e5'");
  EXPECT_THROW_WITH(call("i->\U0001F600", {shaped({2})}), FormatError, "invalid character '\U0001F600' in output");
}

TEST(EinsumErrors, OutputLabelNotInInputs) {
  EXPECT_THROW_WITH(call("i->ij", {shaped({2})}), FormatError, "output label 'j' does not appear in the inputs");
}

TEST(EinsumErrors, DuplicateOutputLabel) {
  EXPECT_THROW_WITH(call("ij->jij", {shaped({2, 2})}), FormatError, "output label 'j' appears more than once");
}

TEST(EinsumErrors, DiagonalSizesMustMatch) {
  EXPECT_THROW_WITH(call("ii", {shaped({2, 3})}), ShapeError, "label 'i' is repeated in operand 0 with sizes 2 and 3");
  EXPECT_THROW_WITH(call("ii->i", {shaped({2, 3})}), ShapeError, "label 'i'");
  // gh-11221: the message names 'b', not 'c'.
  EXPECT_THROW_WITH(call("aabcb,abc", {shaped({3, 3, 4, 5, 6}), shaped({3, 4, 5})}), ShapeError,
                    "label 'b' is repeated in operand 0 with sizes 4 and 6");
}

TEST(EinsumErrors, DimensionMismatchNamesLabelAndBothSizes) {
  EXPECT_THROW_WITH(call("ij,jk->ik", {shaped({2, 3}), shaped({4, 5})}), ShapeError,
                    "einsum('ij,jk->ik'): size of label 'j' is 3 in operand 0 but 4 in operand 1 "
                    "(shapes [2, 3], [4, 5])");
  EXPECT_THROW_WITH(call("...i,...i", {shaped({2, 3}), shaped({4, 3})}), ShapeError,
                    "size of label '...' dim 0 is 2 in operand 0 but 4 in operand 1");
}

TEST(EinsumErrors, SizeOneBroadcastsInsteadOfFailing) {
  EXPECT_NO_THROW(call("ij,jk->ik", {shaped({2, 1}), shaped({4, 5})}));
  EXPECT_EQ(call("ij,jk->ik", {shaped({2, 1}), shaped({4, 5})}).shape(), (Shape{2, 5}));
}

TEST(EinsumErrors, BadOptimizeOptionAndPath) {
  EXPECT_THROW_WITH(einsum_optimize_from_name("fastest"), ValueError, "unknown optimize option 'fastest'");
  EinsumOptions options;
  options.path = std::vector<std::vector<int>>{{2, 3}, {0, 1}};
  const std::vector<Tensor> ops = {shaped({2, 2}), shaped({2, 2}), shaped({2, 2}), shaped({2, 2})};
  EXPECT_THROW_WITH(einsum("ab,bc,cd,de->ae", ops, options), ValueError, "1 more operand(s)");
  options.path = std::vector<std::vector<int>>{{1}, {0, 1}};
  const std::vector<Tensor> three = {shaped({2}), shaped({2}), shaped({2})};
  EXPECT_THROW_WITH(einsum("a,a,a->a", three, options), ValueError, "invalid explicit path");
  options.path = std::vector<std::vector<int>>{{0, 5}};
  EXPECT_THROW_WITH(einsum("a,a,a->a", three, options), ValueError, "step 0");
}

TEST(EinsumErrors, TooManyLabelsFor52Letters) {
  // Every letter may be used (numpy's test_subscript_range).
  const Tensor a = Tensor::ones({2, 3}, DType::f64), b = Tensor::ones({3, 4}, DType::f64);
  EXPECT_EQ(call("AZ,Zz->Az", {a, b}).shape(), (Shape{2, 4}));
}

}  // namespace
}  // namespace qkv
