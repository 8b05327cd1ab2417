// einops for qkv tensors: rearrange, reduce, repeat, pack/unpack, parse_shape,
// and einsum with named axes. Grammar and semantics are those of the einops
// Python package (github.com/arogozhnikov/einops); docs/einops.md lists them.
//
// Patterns: "left -> right". Axes are identifiers (multi-letter, e.g. "batch");
// "(h w)" composes/decomposes axes (one level of brackets); "1" and "()" are unit
// axes; numbers > 1 are anonymous axes (repeat / reduce only); one "..." per side
// (on the right also "(...)"). Lengths of axes that cannot be read from the input
// shape are passed by name (`{{"h", 2}}`); one unknown per bracket group is inferred.
//
// Errors quote the pattern, the input shape and the given lengths as einops does:
//   Error while processing rearrange-reduction pattern "b (h d) -> b h d".
//    Input tensor shape: (2, 7). Additional info: {'h': 2}.
//    Shape mismatch, can't divide axis of length 7 in chunks of 2
// FormatError for patterns that are malformed whatever the input; ShapeError when
// the pattern does not fit the input (dims, lengths). Both are ValueError in Python.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::einops {

// Axis lengths by name, in the order given (einops' **axes_lengths).
using AxisLengths = std::vector<std::pair<std::string, int64_t>>;

// Reorders / composes / decomposes axes: x [shape matching `pattern`'s left side]
// -> [right side]. A strided view of x when one exists (as numpy), else one copy.
Tensor rearrange(const Tensor& x, std::string_view pattern, const AxisLengths& axes_lengths = {});
// Same on a list of tensors of equal shape and dtype, stacked on a new first axis.
Tensor rearrange(const std::vector<Tensor>& xs, std::string_view pattern, const AxisLengths& axes_lengths = {});

// The reductions einops names (a closed set, as EinsumOptimize for einsum).
enum class Reduction { min, max, sum, mean, prod, any, all };
// "min", "max", "sum", "mean", "prod", "any", "all" -> the Reduction; nullopt for another name.
std::optional<Reduction> reduction_from_name(std::string_view name);
// The name einops gives a reduction ("sum", ...).
std::string_view reduction_name(Reduction reduction);

// rearrange plus reduction over the axes missing on the right (numpy's result dtypes: int
// sums -> int64, any/all -> bool).
Tensor reduce(const Tensor& x, std::string_view pattern, Reduction reduction, const AxisLengths& axes_lengths = {});
// Same on a list of tensors stacked on a new first axis.
Tensor reduce(const std::vector<Tensor>& xs, std::string_view pattern, Reduction reduction,
              const AxisLengths& axes_lengths = {});
// By einops' name (Python's and the CLI's strings); another name is einops' FormatError
// ("Unknown reduction median. Expect one of (...)", with the pattern and shape).
Tensor reduce(const Tensor& x, std::string_view pattern, std::string_view reduction,
              const AxisLengths& axes_lengths = {});
Tensor reduce(const std::vector<Tensor>& xs, std::string_view pattern, std::string_view reduction,
              const AxisLengths& axes_lengths = {});

// How reduce(x, pattern, f) runs for a reduction f computed elsewhere (a Python
// callable, as einops accepts): x.reshape(init_shape).permute(permutation) puts the
// reduced axes last (dims n_kept..); reducing them and reshaping to final_shape gives
// the result. Same checks and messages as reduce; `name` stands for f in messages.
struct ReductionPlan {
  Shape init_shape;
  std::vector<int64_t> permutation;
  int64_t n_kept = 0;
  Shape final_shape;
};
ReductionPlan reduction_plan(const Shape& shape, std::string_view pattern, std::string_view name,
                             const AxisLengths& axes_lengths = {}, bool is_list = false);

// rearrange plus new axes on the right (named with a length, or anonymous numbers),
// broadcasting x along them: a zero-stride view when no merge needs a copy.
Tensor repeat(const Tensor& x, std::string_view pattern, const AxisLengths& axes_lengths = {});
// Same on a list of tensors stacked on a new first axis.
Tensor repeat(const std::vector<Tensor>& xs, std::string_view pattern, const AxisLengths& axes_lengths = {});

// pack's result: the packed tensor and, per input, the shape its "*" stood for.
struct Packed {
  Tensor tensor;
  std::vector<Shape> packed_shapes;
};
// Packs tensors along "*" of `pattern` ("i j * k"): the axes before and after "*" must
// agree; each input's "*" axes are flattened and concatenated. Always a new tensor.
Packed pack(const std::vector<Tensor>& tensors, std::string_view pattern);
// Inverse of pack: splits x's "*" axis into one tensor per packed shape (one shape may
// hold a single -1, inferred). Results are views of x.
std::vector<Tensor> unpack(const Tensor& x, const std::vector<Shape>& packed_shapes, std::string_view pattern);

// Lengths of the named axes of `shape` ("batch _ h w", "... c"): "_" skips a dim,
// numbers and "()" check a dim. Order: as in the pattern. ValueError when it does not fit.
AxisLengths parse_shape(const Shape& shape, std::string_view pattern);
// Same for x's shape.
AxisLengths parse_shape(const Tensor& x, std::string_view pattern);

// einsum with einops' named axes: einsum({q, k}, "batch head q d, batch head k d ->
// batch head q k") -> [batch, head, q, k]. Names map to letters, then qkv::einsum runs.
Tensor einsum(const std::vector<Tensor>& tensors, std::string_view pattern);
// The letter equation einsum hands to qkv::einsum ("abcd,abed->abce"), as einops'
// _compactify_pattern_for_einsum builds it. FormatError for () axes, compositions,
// anonymous axes, a missing "->" or an output axis absent from the inputs.
std::string compact_einsum_pattern(std::string_view pattern);

// A contiguous copy of any strided tensor (such as a view returned by rearrange or
// repeat) made by the blocked, multi-threaded transpose kernel; x itself when contiguous.
Tensor materialize(const Tensor& x);

}  // namespace qkv::einops
