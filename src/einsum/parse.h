// einsum stage 1: equation + operand shapes -> labelled dims, output labels, label sizes.
//
// Labels are small integers: 'A'-'Z' -> 0-25, 'a'-'z' -> 26-51 (so id order is
// numpy's sort order), and the dims covered by "..." -> 52 + j, j counted from the
// outermost broadcast dim (operands' ellipses are right-aligned, as numpy does).
#pragma once

#include <bit>
#include <compare>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/error.h"
#include "qkv/tensor.h"

namespace qkv::einsum_detail {

inline constexpr int kLetters = 52;
inline constexpr int kMaxLabels = 128;

// A set of label ids (< kMaxLabels) as a 128-bit mask.
struct LabelSet {
  uint64_t lo = 0, hi = 0;
  static LabelSet of(std::span<const int> labels) {
    LabelSet s;
    for (int l : labels) s.add(l);
    return s;
  }
  void add(int l) { (l < 64 ? lo : hi) |= uint64_t{1} << (l & 63); }
  bool has(int l) const { return ((l < 64 ? lo : hi) >> (l & 63)) & 1; }
  bool empty() const { return (lo | hi) == 0; }
  int count() const { return std::popcount(lo) + std::popcount(hi); }
  LabelSet operator|(LabelSet o) const { return {lo | o.lo, hi | o.hi}; }
  LabelSet operator&(LabelSet o) const { return {lo & o.lo, hi & o.hi}; }
  LabelSet operator-(LabelSet o) const { return {lo & ~o.lo, hi & ~o.hi}; }
  bool operator==(const LabelSet&) const = default;
  auto operator<=>(const LabelSet&) const = default;
  // f(id) for each id in ascending order, one step per set bit.
  template <class F>
  void for_each(F&& f) const {
    for (uint64_t w = lo; w; w &= w - 1) f(std::countr_zero(w));
    for (uint64_t w = hi; w; w &= w - 1) f(64 + std::countr_zero(w));
  }
  // Ids in ascending order.
  std::vector<int> ids() const {
    std::vector<int> out;
    for_each([&](int l) { out.push_back(l); });
    return out;
  }
};

// The parsed equation, checked against the operand shapes.
struct Spec {
  std::string equation;                  // as given (spaces kept) for messages
  std::vector<Shape> shapes;             // operand shapes
  std::vector<std::vector<int>> inputs;  // label id of every dim of every operand
  std::vector<int> output;               // output label ids, in output order
  int ellipsis_rank = 0;                 // dims covered by "..." (max over operands)
  std::vector<int64_t> sizes;            // size per label id (kMaxLabels entries; 0 = unused)
  std::string symbols;                   // display letter per label id (ellipsis dims: unused letters)

  LabelSet input_set(size_t i) const { return LabelSet::of(inputs[i]); }
  LabelSet output_set() const { return LabelSet::of(output); }
  // "ab" for a list of label ids, with ellipsis dims shown as their letters.
  std::string term(std::span<const int> labels) const;
  // "ab,bc->ac" with ellipsis dims shown as letters.
  std::string full_equation() const;
};

// Parses and checks; throws FormatError / ShapeError / ValueError (see einsum.h).
Spec parse(std::string_view equation, std::span<const Shape> shapes);

// numpy's result type of the operands (f32 when there are none).
inline DType result_dtype(std::span<const Tensor> operands) {
  if (operands.empty()) return DType::f32;
  DType t = operands[0].dtype();
  for (const Tensor& x : operands.subspan(1)) t = promote_types(t, x.dtype());
  return t;
}

// Shapes of the operands.
inline std::vector<Shape> shapes_of(std::span<const Tensor> operands) {
  std::vector<Shape> shapes;
  for (const Tensor& x : operands) shapes.push_back(x.shape());
  return shapes;
}

// "'b'" for a letter label, "'...' dim 2" for a broadcast dim.
std::string label_name(int id);

// "[2, 3], [4, 5]" ("none" when empty).
std::string shapes_str(std::span<const Shape> shapes);

// Throws E("einsum('<equation>'): <args> (shapes <shapes>)").
template <class E, class... Args>
[[noreturn]] void fail_eq(std::string_view equation, std::span<const Shape> shapes, Args&&... args) {
  fail<E>("einsum('", equation, "'): ", std::forward<Args>(args)..., " (shapes ", shapes_str(shapes), ")");
}

}  // namespace qkv::einsum_detail
