// pack / unpack (einops/packing.py) and parse_shape (einops.parse_shape).
#include <algorithm>
#include <limits>
#include <set>
#include <sstream>

#include "einops/parse.h"
#include "qkv/einops.h"

namespace qkv::einops {

using einops_detail::py_tuple_repr;

namespace {

struct PackPattern {
  int64_t before = 0, after = 0, min_axes = 0;
};

// einops' analyze_pattern: names split by spaces, exactly one "*".
PackPattern analyze_pattern(std::string_view pattern, const char* opname) {
  std::vector<std::string> axes;
  std::istringstream in{std::string(pattern)};
  for (std::string a; in >> a;) axes.push_back(a);
  const std::set<std::string> unique(axes.begin(), axes.end());
  if (unique.size() != axes.size())
    fail<FormatError>("Duplicates in axes names in ", opname, "(..., \"", pattern, "\")");
  if (!unique.count("*")) fail<FormatError>("No *-axis in ", opname, "(..., \"", pattern, "\")");
  for (const std::string& a : axes) {
    if (a != "*" && !einops_detail::axis_name_problem(a, false).empty()) {
      fail<FormatError>("Invalid axis name ", a, " in ", opname, "(..., \"", pattern, "\")");
    }
  }
  PackPattern p;
  p.before = std::find(axes.begin(), axes.end(), "*") - axes.begin();
  p.after = static_cast<int64_t>(axes.size()) - p.before - 1;
  p.min_axes = p.before + p.after;
  return p;
}

Shape sub_shape(const Shape& s, int64_t begin, int64_t end) { return Shape(s.begin() + begin, s.begin() + end); }

// Product of the dims (a negative dim, as unpack may be given, stays negative);
// ShapeError past 2^62 (and for -2^63, whose magnitude int64 cannot hold: a UBSan
// negation overflow found by the einops fuzzer).
int64_t product(const Shape& s) {
  int64_t p = 1;
  for (int64_t v : s) {
    if (v == std::numeric_limits<int64_t>::min()) fail<ShapeError>("shape ", py_tuple_repr(s), " has a dim of -2^63");
    const auto m = checked_mul(p < 0 ? -p : p, v < 0 ? -v : v);
    if (!m) fail<ShapeError>("shape ", py_tuple_repr(s), " has more than 2^62 elements");
    p = (p < 0) != (v < 0) ? -*m : *m;
  }
  return p;
}

}  // namespace

Packed pack(const std::vector<Tensor>& tensors, std::string_view pattern) {
  const PackPattern p = analyze_pattern(pattern, "pack");
  if (tensors.empty()) fail<ValueError>("pack(..., \"", pattern, "\"): no tensors to pack");
  require_cpu("pack", tensors);
  Packed result;
  DType dtype = tensors[0].dtype();
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Shape& shape = tensors[i].shape();
    const int64_t nd = tensors[i].dim();
    if (nd < p.min_axes) {
      fail<ShapeError>("packed tensor #", i, " (enumeration starts with 0) has shape ", py_tuple_repr(shape),
                       ", while pattern ", pattern, " assumes at least ", p.min_axes, " axes");
    }
    const Shape outer = sub_shape(shape, 0, p.before), inner = sub_shape(shape, nd - p.after, nd);
    const Shape& first = tensors[0].shape();
    if (outer != sub_shape(first, 0, p.before) ||
        inner != sub_shape(first, tensors[0].dim() - p.after, tensors[0].dim())) {
      fail<ShapeError>("pack(..., \"", pattern, "\"): tensor #", i, " of shape ", py_tuple_repr(shape),
                       " does not match tensor #0 of shape ", py_tuple_repr(first), " outside the packed axes");
    }
    result.packed_shapes.push_back(sub_shape(shape, p.before, nd - p.after));
    // total + n past kMaxElements, checked without forming the sum (2^62 + 2^62 overflows int64).
    const int64_t n = product(result.packed_shapes.back());
    if (n > kMaxElements - total) {
      fail<ShapeError>("pack(..., \"", pattern, "\"): the packed axis has more than 2^62 elements");
    }
    total += n;
    dtype = promote_types(dtype, tensors[i].dtype());
  }
  Shape out_shape = sub_shape(tensors[0].shape(), 0, p.before);
  out_shape.push_back(total);
  const Shape tail = sub_shape(tensors[0].shape(), tensors[0].dim() - p.after, tensors[0].dim());
  out_shape.insert(out_shape.end(), tail.begin(), tail.end());
  result.tensor = Tensor::empty(out_shape, dtype);
  int64_t start = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const int64_t len = product(result.packed_shapes[i]);
    Shape flat = out_shape;
    flat[p.before] = len;
    if (len > 0) result.tensor.slice(p.before, start, start + len).copy_from(tensors[i].reshape(flat));
    start += len;
  }
  return result;
}

namespace {

// Python's x[a:b] bounds for an axis of length n (negative indices count from the end).
std::pair<int64_t, int64_t> python_slice(int64_t a, int64_t b, int64_t n) {
  auto clamp = [n](int64_t i) { return std::clamp<int64_t>(i < 0 ? i + n : i, 0, n); };
  return {clamp(a), std::max(clamp(a), clamp(b))};
}

// a + b saturated at +-(2^62 + 1): the split points of unpack, sums of lengths of up to
// 2^62 each, which overflowed int64 (api_python fuzz finding). Past an axis (at most 2^62
// long) every index slices the same way, so saturating keeps Python's semantics.
int64_t split_add(int64_t a, int64_t b) {
  constexpr int64_t kPast = kMaxElements + 1;
  int64_t s = 0;
  if (__builtin_add_overflow(a, b, &s)) s = b > 0 ? kPast : -kPast;
  return std::clamp(s, -kPast, kPast);
}

// Resolves one -1 in `want` for `numel` elements; false when impossible (as numpy's reshape).
bool resolve_shape(Shape* want, int64_t numel) {
  int64_t known = 1, unknown = -1;
  for (size_t i = 0; i < want->size(); ++i) {
    if ((*want)[i] == -1) {
      if (unknown >= 0) return false;
      unknown = static_cast<int64_t>(i);
    } else if ((*want)[i] < 0) {
      return false;
    } else if (const auto m = checked_mul(known, (*want)[i])) {
      known = *m;
    } else {
      return false;
    }
  }
  if (unknown < 0) return known == numel;
  if (known == 0 || numel % known != 0) return false;
  (*want)[unknown] = numel / known;
  return true;
}

}  // namespace

std::vector<Tensor> unpack(const Tensor& x, const std::vector<Shape>& packed_shapes, std::string_view pattern) {
  const PackPattern p = analyze_pattern(pattern, "unpack");
  require_cpu("unpack", {&x});
  const Shape& shape = x.shape();
  if (x.dim() != p.before + 1 + p.after) {
    fail<ShapeError>("unpack(..., ", pattern, ") received input of wrong dim with shape ", py_tuple_repr(shape));
  }
  std::vector<int64_t> lengths;
  int64_t n_unknown = 0, unknown_at = -1;
  for (size_t i = 0; i < packed_shapes.size(); ++i) {
    const bool unknown = std::count(packed_shapes[i].begin(), packed_shapes[i].end(), -1) > 0;
    lengths.push_back(unknown ? -1 : product(packed_shapes[i]));
    if (unknown) {
      ++n_unknown;
      if (unknown_at < 0) unknown_at = static_cast<int64_t>(i);
    }
  }
  if (n_unknown > 1) {
    fail<ShapeError>("unpack(..., ", pattern, ") received more than one -1 in ", shapes_str(packed_shapes),
                     " and can't infer dimensions");
  }
  const int64_t n = static_cast<int64_t>(packed_shapes.size());
  std::vector<int64_t> split(n + 1, 0);
  split[n] = shape[p.before];
  if (n_unknown == 0) {
    for (int64_t i = 0; i + 1 < n; ++i) split[i + 1] = split_add(split[i], lengths[i]);
  } else {
    for (int64_t i = 0; i < unknown_at; ++i) split[i + 1] = split_add(split[i], lengths[i]);
    for (int64_t j = n - 1; j > unknown_at; --j) split[j] = split_add(split[j + 1], -lengths[j]);
  }
  std::vector<Tensor> out;
  for (int64_t i = 0; i < n; ++i) {
    const auto [begin, end] = python_slice(split[i], split[i + 1], shape[p.before]);
    const Tensor part = x.slice(p.before, begin, end);
    Shape want = packed_shapes[i];
    const bool ok = resolve_shape(&want, end - begin);
    if (!ok) {
      fail<ShapeError>("Error during unpack(..., \"", pattern, "\"): could not split axis of size ", split[n],
                       " into requested ", shapes_str(packed_shapes));
    }
    Shape full = sub_shape(shape, 0, p.before);
    full.insert(full.end(), want.begin(), want.end());
    full.insert(full.end(), shape.begin() + p.before + 1, shape.end());
    out.push_back(part.reshape(full));  // splits one dim: a view
  }
  return out;
}

AxisLengths parse_shape(const Shape& shape, std::string_view pattern) {
  const einops_detail::Expression exp = einops_detail::parse_expression(pattern, true, false, nullptr);
  const std::string where = std::string(pattern) + " " + py_tuple_repr(shape);
  const int64_t nd = static_cast<int64_t>(shape.size()), ng = static_cast<int64_t>(exp.composition.size());
  if (exp.has_composed_axes() || exp.has_ellipsis_parenthesized.value_or(false)) {
    fail<ShapeError>("Can't parse shape with composite axes: ", where);
  }
  if (nd != ng) {
    if (!exp.has_ellipsis) fail<ShapeError>("Can't parse shape with different number of dimensions: ", where);
    if (nd < ng - 1) fail<ShapeError>("Can't parse shape with this number of dimensions: ", where);
  }
  AxisLengths result;
  int64_t d = 0;
  for (const einops_detail::Group& g : exp.composition) {
    if (g.bare_ellipsis) {
      d += nd - ng + 1;
      continue;
    }
    const int64_t length = shape[d++];
    if (g.axes.empty()) {
      if (length != 1) fail<ShapeError>("Length of axis is not 1: ", where);
    } else if (g.axes[0].anonymous()) {
      if (g.axes[0].value != length) fail<ShapeError>("Length of anonymous axis does not match: ", where);
    } else if (g.axes[0].key != "_") {
      result.emplace_back(g.axes[0].key, length);
    }
  }
  return result;
}

AxisLengths parse_shape(const Tensor& x, std::string_view pattern) { return parse_shape(x.shape(), pattern); }

}  // namespace qkv::einops
