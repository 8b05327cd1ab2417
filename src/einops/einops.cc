// rearrange / reduce / repeat: error context as einops adds it, list stacking,
// and the application of a plan (einops' _apply_recipe) with views where possible.
#include <algorithm>
#include <set>

#include "einops/parse.h"
#include "einops/recipe.h"
#include "einops/reduce.h"
#include "qkv/einops.h"
#include "tensor/buffer_pool.h"

namespace qkv::einops {

using einops_detail::Plan;

namespace {

std::string dict_repr(const AxisLengths& lengths) {
  std::string out = "{";
  for (size_t i = 0; i < lengths.size(); ++i) {
    out += (i ? ", " : "") + einops_detail::py_str_repr(lengths[i].first) + ": " + std::to_string(lengths[i].second);
  }
  return out + "}";
}

// einops' message around an inner error:
//   Error while processing <op>-reduction pattern "<p>".
//    Input tensor shape: (2, 3). Additional info: {'h': 2}.
//    <inner>
std::string context(const einops_detail::Operation& op, std::string_view pattern, const Shape& shape, bool is_list,
                    const AxisLengths& lengths, const char* inner) {
  std::string m = "Error while processing ";
  m += op.name;
  m += "-reduction pattern \"";
  m += pattern;
  m += "\".\n ";
  m += is_list ? std::string("Input is list. ") : "Input tensor shape: " + einops_detail::py_tuple_repr(shape) + ". ";
  m += "Additional info: " + dict_repr(lengths) + ".\n " + inner;
  return m;
}

Plan make_plan(const Shape& shape, bool is_list, std::string_view pattern, const einops_detail::Operation& op,
               const AxisLengths& lengths) {
  try {
    std::vector<std::string> names;
    std::vector<int64_t> values;
    for (const auto& [name, value] : lengths) {
      if (std::find(names.begin(), names.end(), name) != names.end()) {
        fail<FormatError>("Axis ", name, " is given more than once");
      }
      if (value < 0) fail<ShapeError>("Axis ", name, " has a negative length ", value);
      names.push_back(name);
      values.push_back(value);
    }
    const auto recipe = einops_detail::prepare_recipe(pattern, op, names, static_cast<int64_t>(shape.size()));
    return einops_detail::reconstruct(*recipe, shape, values);
  } catch (const FormatError& e) {
    throw FormatError(context(op, pattern, shape, is_list, lengths, e.what()));
  } catch (const ShapeError& e) {
    throw ShapeError(context(op, pattern, shape, is_list, lengths, e.what()));
  }
}

// Merges consecutive dims of t into the final shape: a view when every group's dims
// are contiguous with each other (numpy's rule), else one copy by the transpose kernel.
Tensor merge_groups(const Tensor& t, const std::vector<int64_t>& group_sizes, const Shape& final_shape) {
  bool viewable = true;
  Strides strides;
  size_t d = 0;
  for (int64_t n : group_sizes) {
    int64_t stride = 1, previous = 0;
    bool have = false;
    for (int64_t k = 0; k < n; ++k, ++d) {
      const int64_t size = t.shape()[d], s = t.strides()[d];
      if (size == 1) continue;
      if (have && previous != s * size) viewable = false;
      have = true;
      previous = stride = s;
    }
    strides.push_back(stride);
  }
  if (t.numel() == 0) return Tensor::empty(final_shape, t.dtype());
  if (viewable) return Tensor::view_of(t.storage(), t.dtype(), final_shape, strides, t.offset());
  return materialize(t).view(final_shape);
}

Tensor apply_plan(const Tensor& x, const Plan& plan, const einops_detail::Operation& op) {
  Tensor t = x;
  if (plan.need_init_reshape) t = t.reshape(plan.init_shape);  // only splits dims: a view
  if (!plan.permutation.empty()) t = t.permute(plan.permutation);
  if (plan.has_reduction) t = einops_detail::reduce_trailing(t, plan.n_kept, op.reduction);  // never a callable
  if (!plan.added_axes.empty()) {
    for (const auto& [pos, length] : plan.added_axes) t = t.unsqueeze(pos);
    Shape target = t.shape();
    for (const auto& [pos, length] : plan.added_axes) target[pos] = length;
    t = t.expand(target);
  }
  if (plan.need_final_reshape) t = merge_groups(t, plan.final_group_sizes, plan.final_shape);
  return t;
}

Tensor stack(const std::vector<Tensor>& xs, std::string_view op) {
  if (xs.empty()) fail<ValueError>("Rearrange/Reduce/Repeat can't be applied to an empty list");
  require_cpu(op, xs);
  for (size_t i = 1; i < xs.size(); ++i) {
    if (xs[i].shape() != xs[0].shape() || xs[i].dtype() != xs[0].dtype()) {
      fail<ShapeError>(op, ": list elements must have one shape and dtype; element 0 is ", shape_str(xs[0].shape()),
                       " ", dtype_name(xs[0].dtype()), ", element ", i, " is ", shape_str(xs[i].shape()), " ",
                       dtype_name(xs[i].dtype()));
    }
  }
  Shape shape = xs[0].shape();
  const AllocationScope scope(op, {}, std::span<const Shape>(&xs[0].shape(), 1), "list of elements");
  shape.insert(shape.begin(), static_cast<int64_t>(xs.size()));
  Tensor out = kernels::empty_pooled(shape, xs[0].dtype());
  for (size_t i = 0; i < xs.size(); ++i) out.select(0, static_cast<int64_t>(i)).copy_from(xs[i]);
  return out;
}

Tensor transform(const Tensor& x, bool is_list, std::string_view pattern, const einops_detail::Operation& op,
                 const AxisLengths& lengths) {
  // Names the call in size errors: "repeat: 'h w -> (h w c)' (input [2, 2]): output ...".
  const AllocationScope scope(op.name, pattern, std::span<const Shape>(&x.shape(), 1), "input");
  // CPU kernels only (qkv/device.h); a reduction's op.name is its own ("mean").
  using Kind = einops_detail::Operation::Kind;
  require_cpu(op.kind == Kind::rearrange || op.kind == Kind::repeat ? std::string_view(op.name) : "reduce", {&x});
  try {
    const Plan plan = make_plan(x.shape(), is_list, pattern, op, lengths);
    return apply_plan(x, plan, op);
  } catch (const std::bad_alloc&) {
    scope.fail_bad_alloc();
  }
}

}  // namespace

Tensor rearrange(const Tensor& x, std::string_view pattern, const AxisLengths& axes_lengths) {
  return transform(x, false, pattern, einops_detail::Operation::rearrange(), axes_lengths);
}

Tensor rearrange(const std::vector<Tensor>& xs, std::string_view pattern, const AxisLengths& axes_lengths) {
  return transform(stack(xs, "rearrange"), true, pattern, einops_detail::Operation::rearrange(), axes_lengths);
}

namespace {
constexpr std::pair<Reduction, std::string_view> kReductionNames[] = {
    {Reduction::min, "min"},   {Reduction::max, "max"}, {Reduction::sum, "sum"}, {Reduction::mean, "mean"},
    {Reduction::prod, "prod"}, {Reduction::any, "any"}, {Reduction::all, "all"}};
}  // namespace

std::optional<Reduction> reduction_from_name(std::string_view name) {
  for (const auto& [r, n] : kReductionNames) {
    if (n == name) return r;
  }
  return std::nullopt;
}

std::string_view reduction_name(Reduction reduction) {
  for (const auto& [r, n] : kReductionNames) {
    if (r == reduction) return n;
  }
  return "?";
}

Tensor reduce(const Tensor& x, std::string_view pattern, Reduction reduction, const AxisLengths& axes_lengths) {
  return transform(x, false, pattern, einops_detail::Operation::of(reduction), axes_lengths);
}

Tensor reduce(const std::vector<Tensor>& xs, std::string_view pattern, Reduction reduction,
              const AxisLengths& axes_lengths) {
  return transform(stack(xs, "reduce"), true, pattern, einops_detail::Operation::of(reduction), axes_lengths);
}

Tensor reduce(const Tensor& x, std::string_view pattern, std::string_view reduction, const AxisLengths& axes_lengths) {
  return transform(x, false, pattern, einops_detail::Operation::of_name(reduction), axes_lengths);
}

Tensor reduce(const std::vector<Tensor>& xs, std::string_view pattern, std::string_view reduction,
              const AxisLengths& axes_lengths) {
  return transform(stack(xs, "reduce"), true, pattern, einops_detail::Operation::of_name(reduction), axes_lengths);
}

Tensor repeat(const Tensor& x, std::string_view pattern, const AxisLengths& axes_lengths) {
  return transform(x, false, pattern, einops_detail::Operation::repeat(), axes_lengths);
}

Tensor repeat(const std::vector<Tensor>& xs, std::string_view pattern, const AxisLengths& axes_lengths) {
  return transform(stack(xs, "repeat"), true, pattern, einops_detail::Operation::repeat(), axes_lengths);
}

ReductionPlan reduction_plan(const Shape& shape, std::string_view pattern, std::string_view name,
                             const AxisLengths& axes_lengths, bool is_list) {
  const Plan plan = make_plan(shape, is_list, pattern, einops_detail::Operation::callable(name), axes_lengths);
  ReductionPlan r;
  r.init_shape = plan.init_shape;
  r.permutation = plan.permutation;
  for (int64_t d = static_cast<int64_t>(r.permutation.size()); d < static_cast<int64_t>(r.init_shape.size()); ++d) {
    r.permutation.push_back(d);  // the identity when the plan has no permutation
  }
  r.n_kept = plan.n_kept;
  r.final_shape = plan.final_shape;
  return r;
}

Tensor materialize(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor out = kernels::empty_pooled(x.shape(), x.dtype());
  out.copy_from(x);
  return out;
}

}  // namespace qkv::einops
