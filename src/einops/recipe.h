// Transformation recipes: a pattern, an operation, the names of the given axis
// lengths and the input's ndim compiled once (einops' _prepare_transformation_recipe)
// and cached; then, per call, the recipe plus the actual shape give a Plan
// (einops' _reconstruct_from_shape): reshape -> permute -> reduce -> add axes -> reshape.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qkv/einops.h"

namespace qkv::einops_detail {

struct Recipe {
  // Lengths of the elementary axes: the left side's axes in order, then the axes that
  // appear only on the right. kUnknown / kExpected mark lengths read from the shape /
  // given by name; anonymous axes hold their value.
  std::vector<int64_t> elementary_axes_lengths;
  std::vector<int> given_axis_positions;  // per given length (in the given order): its elementary axis
  // Per input dim: elementary axes of known and of unknown (at most one) length.
  std::vector<std::pair<std::vector<int>, std::vector<int>>> input_known_unknown;
  std::vector<int> axes_permutation;  // over the left elementary axes; reduced axes last
  int first_reduced_axis = 0;
  std::vector<std::pair<int, int>> added_axes;          // output position -> elementary axis
  std::vector<std::vector<int>> output_composite_axes;  // per output dim: its elementary axes
};

// What a recipe is compiled for (einops' `operation`). A reduction computed elsewhere (a
// Python callable, as einops accepts: einops::reduction_plan) is checked as a reduction;
// a name that is no reduction (Kind::unknown) fails when the recipe is built, with einops'
// message. `name` is what messages call it: "rearrange", "sum", the callable's name.
struct Operation {
  enum class Kind { rearrange, repeat, reduction, callable, unknown };
  Kind kind = Kind::rearrange;
  einops::Reduction reduction = einops::Reduction::sum;  // Kind::reduction only
  std::string name;

  static Operation rearrange() { return {Kind::rearrange, einops::Reduction::sum, "rearrange"}; }
  static Operation repeat() { return {Kind::repeat, einops::Reduction::sum, "repeat"}; }
  static Operation of(einops::Reduction r) { return {Kind::reduction, r, std::string(einops::reduction_name(r))}; }
  // A reduction by einops' name, or Kind::unknown.
  static Operation of_name(std::string_view name) {
    const auto r = einops::reduction_from_name(name);
    return r ? of(*r) : Operation{Kind::unknown, einops::Reduction::sum, std::string(name)};
  }
  static Operation callable(std::string_view name) {
    return {Kind::callable, einops::Reduction::sum, std::string(name)};
  }
  bool reduces() const { return kind == Kind::reduction || kind == Kind::callable; }
};

inline constexpr int64_t kUnknown = -999999;
inline constexpr int64_t kExpected = -99999;

// The cached recipe for (pattern, operation, axis names, ndim). Thread-safe. Throws FormatError /
// ShapeError with einops' inner message (no prefix).
std::shared_ptr<const Recipe> prepare_recipe(std::string_view pattern, const Operation& operation,
                                             const std::vector<std::string>& axes_names, int64_t ndim);

// Recipes compiled so far (cache misses) and cached recipes returned (hits).
struct RecipeCacheStats {
  int64_t misses = 0;
  int64_t hits = 0;
  int64_t size = 0;
};
RecipeCacheStats recipe_cache_stats();

// Everything _apply_recipe needs for one input shape.
struct Plan {
  bool need_init_reshape = false;
  Shape init_shape;                  // elementary left axes
  std::vector<int64_t> permutation;  // empty when the identity
  int64_t n_kept = 0;                // dims left after reduction (reduced dims are the trailing ones)
  bool has_reduction = false;
  std::vector<std::pair<int64_t, int64_t>> added_axes;  // position -> length, increasing positions
  bool need_final_reshape = false;
  Shape final_shape;
  std::vector<int64_t> final_group_sizes;  // elementary dims per output dim
};

// einops' _reconstruct_from_shape. Throws ShapeError ("Shape mismatch, ...").
Plan reconstruct(const Recipe& recipe, const Shape& shape, const std::vector<int64_t>& given_lengths);

}  // namespace qkv::einops_detail
