// Recipe compilation (einops' _prepare_transformation_recipe), its thread-safe
// cache, and the per-shape reconstruction (_reconstruct_from_shape).
#include "einops/recipe.h"

#include <algorithm>
#include <map>
#include <mutex>
#include <set>
#include <unordered_map>

#include "einops/parse.h"
#include "qkv/error.h"

namespace qkv::einops_detail {

namespace {

// Axes of both sides by key, to print anonymous axes as einops does ("2-axis").
class AxisNames {
 public:
  void add(const Expression& e) {
    for (const Group& g : e.composition) {
      for (const Axis& a : g.axes) axes_[a.key] = a;
    }
  }
  std::string repr(const std::string& key) const {
    auto it = axes_.find(key);
    if (it != axes_.end() && it->second.anonymous()) return it->second.display();
    return py_str_repr(key);
  }
  template <class Keys>
  std::string set_repr(const Keys& keys) const {
    std::vector<std::string> items;
    for (const std::string& k : keys) items.push_back(repr(k));
    return py_set_repr(items);
  }

 private:
  std::map<std::string, Axis> axes_;
};

std::vector<std::string> set_difference(const std::set<std::string>& a, const std::set<std::string>& b) {
  std::vector<std::string> out;
  std::set_difference(a.begin(), a.end(), b.begin(), b.end(), std::back_inserter(out));
  return out;
}

void check_sides(const Expression& left, const Expression& rght, std::string_view pattern, const Operation& op,
                 const std::vector<std::string>& axes_names, const AxisNames& names) {
  if (!left.has_ellipsis && rght.has_ellipsis) {
    fail<FormatError>("Ellipsis found in right side, but not left side of a pattern ", pattern);
  }
  if (left.has_ellipsis && left.has_ellipsis_parenthesized.value_or(false)) {
    fail<FormatError>("Ellipsis inside parenthesis in the left side is not allowed: ", pattern);
  }
  if (op.kind == Operation::Kind::rearrange) {
    if (left.has_non_unitary_anonymous_axes || rght.has_non_unitary_anonymous_axes) {
      fail<FormatError>("Non-unitary anonymous axes are not supported in rearrange (exception is length 1)");
    }
    std::vector<std::string> diff;
    std::set_symmetric_difference(left.identifiers.begin(), left.identifiers.end(), rght.identifiers.begin(),
                                  rght.identifiers.end(), std::back_inserter(diff));
    if (!diff.empty()) {
      fail<FormatError>("Identifiers only on one side of expression (should be on both): ", names.set_repr(diff));
    }
  } else if (op.kind == Operation::Kind::repeat) {
    const auto diff = set_difference(left.identifiers, rght.identifiers);
    if (!diff.empty()) fail<FormatError>("Unexpected identifiers on the left side of repeat: ", names.set_repr(diff));
    std::set<std::string> known(left.identifiers);
    known.insert(axes_names.begin(), axes_names.end());
    std::vector<std::string> without_size;
    for (const Group& g : rght.composition) {
      for (const Axis& a : g.axes) {
        if (!a.anonymous() && known.count(a.key) == 0) without_size.push_back(a.key);
      }
    }
    if (!without_size.empty()) {
      fail<FormatError>("Specify sizes for new axes in repeat: ", names.set_repr(without_size));
    }
  } else if (op.reduces()) {
    const auto diff = set_difference(rght.identifiers, left.identifiers);
    if (!diff.empty()) {
      fail<FormatError>("Unexpected identifiers on the right side of reduce ", op.name, ": ", names.set_repr(diff));
    }
  } else {
    fail<FormatError>("Unknown reduction ", op.name,
                      ". Expect one of ('min', 'max', 'sum', 'mean', 'prod', 'any', 'all').");
  }
}

using Composition = std::vector<std::vector<Axis>>;

// Replaces the ellipsis by ndim - (other dims) axes named "…0", "…1", ...
void expand_ellipsis(Expression& left, Expression& rght, int64_t ndim, Composition* lc, Composition* rc) {
  if (!left.has_ellipsis) {
    if (ndim != static_cast<int64_t>(left.composition.size())) {
      fail<ShapeError>("Wrong shape: expected ", left.composition.size(), " dims. Received ", ndim, "-dim tensor.");
    }
    for (const Group& g : left.composition) lc->push_back(g.axes);
    for (const Group& g : rght.composition) rc->push_back(g.axes);
    return;
  }
  const int64_t n_other = static_cast<int64_t>(left.composition.size()) - 1;
  if (ndim < n_other) fail<ShapeError>("Wrong shape: expected >=", n_other, " dims. Received ", ndim, "-dim tensor.");
  std::vector<Axis> ell;
  for (int64_t i = 0; i < ndim - n_other; ++i) ell.push_back(Axis{std::string(kEllipsis) + std::to_string(i), 0});
  for (const Group& g : left.composition) {
    if (g.bare_ellipsis) {
      for (const Axis& a : ell) lc->push_back({a});
    } else {
      lc->push_back(g.axes);
    }
  }
  for (const Group& g : rght.composition) {
    if (g.bare_ellipsis) {
      for (const Axis& a : ell) rc->push_back({a});
      continue;
    }
    std::vector<Axis> group;
    for (const Axis& a : g.axes) {
      if (a.is_ellipsis()) {
        group.insert(group.end(), ell.begin(), ell.end());
      } else {
        group.push_back(a);
      }
    }
    rc->push_back(group);
  }
  left.identifiers.erase(std::string(kEllipsis));
  for (const Axis& a : ell) left.identifiers.insert(a.key);
  if (rght.has_ellipsis) {
    rght.identifiers.erase(std::string(kEllipsis));
    for (const Axis& a : ell) rght.identifiers.insert(a.key);
  }
}

// Ordered map key -> known length, as einops' OrderedDict axis_name2known_length.
struct ElementaryAxes {
  std::vector<std::string> keys;
  std::vector<int64_t> lengths;
  std::unordered_map<std::string, int> position;
  void add(const Axis& a) {
    if (position.count(a.key)) return;
    position[a.key] = static_cast<int>(keys.size());
    keys.push_back(a.key);
    lengths.push_back(a.anonymous() ? a.value : kUnknown);
  }
};

std::vector<int> positions(const ElementaryAxes& el, const std::vector<Axis>& axes) {
  std::vector<int> out;
  for (const Axis& a : axes) out.push_back(el.position.at(a.key));
  return out;
}

Recipe build_recipe(std::string_view pattern, const Operation& op, const std::vector<std::string>& axes_names,
                    int64_t ndim) {
  const size_t arrow = pattern.find("->");
  if (arrow == std::string_view::npos || pattern.find("->", arrow + 2) != std::string_view::npos) {
    fail<FormatError>("Pattern must contain exactly one '->'");
  }
  int anon_counter = 0;
  Expression left = parse_expression(pattern.substr(0, arrow), false, false, &anon_counter);
  Expression rght = parse_expression(pattern.substr(arrow + 2), false, false, &anon_counter);
  AxisNames names;
  names.add(left);
  names.add(rght);
  check_sides(left, rght, pattern, op, axes_names, names);
  Composition lc, rc;
  expand_ellipsis(left, rght, ndim, &lc, &rc);

  ElementaryAxes el;
  for (const auto& g : lc) {
    for (const Axis& a : g) el.add(a);
  }
  for (const auto& g : rc) {
    for (const Axis& a : g) el.add(a);  // axes only on the right (repeat), in order of appearance
  }
  Recipe r;
  for (const std::string& name : axes_names) {
    if (!axis_name_problem(name, false).empty()) {
      fail<FormatError>("('Invalid name for an axis', ", py_str_repr(name), ")");
    }
    auto it = el.position.find(name);
    if (it == el.position.end()) fail<FormatError>("Axis ", name, " is not used in transform");
    el.lengths[it->second] = kExpected;
    r.given_axis_positions.push_back(it->second);
  }
  for (const auto& g : lc) {
    std::vector<int> known, unknown;
    std::vector<std::string> unknown_keys;
    for (const Axis& a : g) {
      const int p = el.position.at(a.key);
      (el.lengths[p] == kUnknown ? unknown : known).push_back(p);
      if (el.lengths[p] == kUnknown) unknown_keys.push_back(a.key);
    }
    if (unknown.size() > 1) fail<FormatError>("Could not infer sizes for ", names.set_repr(unknown_keys));
    r.input_known_unknown.emplace_back(known, unknown);
  }
  for (const auto& g : rc) r.output_composite_axes.push_back(positions(el, g));

  std::vector<Axis> ordered_left, ordered_rght, reduced, order;
  for (const auto& g : lc) ordered_left.insert(ordered_left.end(), g.begin(), g.end());
  for (const auto& g : rc) ordered_rght.insert(ordered_rght.end(), g.begin(), g.end());
  for (const Axis& a : ordered_left) {
    if (!rght.identifiers.count(a.key)) reduced.push_back(a);
  }
  for (const Axis& a : ordered_rght) {
    if (left.identifiers.count(a.key)) order.push_back(a);
  }
  r.first_reduced_axis = static_cast<int>(order.size());
  order.insert(order.end(), reduced.begin(), reduced.end());
  for (const Axis& a : order) {
    const auto it = std::find(ordered_left.begin(), ordered_left.end(), a);
    r.axes_permutation.push_back(static_cast<int>(it - ordered_left.begin()));
  }
  for (size_t i = 0; i < ordered_rght.size(); ++i) {
    if (!left.identifiers.count(ordered_rght[i].key)) {
      r.added_axes.emplace_back(static_cast<int>(i), el.position.at(ordered_rght[i].key));
    }
  }
  r.elementary_axes_lengths = el.lengths;
  return r;
}

struct Cache {
  std::mutex mutex;
  std::unordered_map<std::string, std::shared_ptr<const Recipe>> recipes;
  RecipeCacheStats stats;
};

Cache& cache() {
  static Cache c;
  return c;
}

constexpr size_t kMaxCachedRecipes = 1024;

}  // namespace

std::shared_ptr<const Recipe> prepare_recipe(std::string_view pattern, const Operation& operation,
                                             const std::vector<std::string>& axes_names, int64_t ndim) {
  std::string key(pattern);
  key += '\0';
  key += static_cast<char>('0' + static_cast<int>(operation.kind));
  key += operation.name;
  for (const std::string& n : axes_names) {
    key += '\0';
    key += n;
  }
  key += '\0';
  key += std::to_string(ndim);
  Cache& c = cache();
  {
    const std::lock_guard<std::mutex> lock(c.mutex);
    if (auto it = c.recipes.find(key); it != c.recipes.end()) {
      ++c.stats.hits;
      return it->second;
    }
  }
  // Compiled outside the lock; two threads may both compile a new key, which is harmless.
  auto recipe = std::make_shared<const Recipe>(build_recipe(pattern, operation, axes_names, ndim));
  const std::lock_guard<std::mutex> lock(c.mutex);
  ++c.stats.misses;
  if (c.recipes.size() >= kMaxCachedRecipes) c.recipes.clear();  // bounded, like einops' lru_cache
  c.recipes.emplace(std::move(key), recipe);
  c.stats.size = static_cast<int64_t>(c.recipes.size());
  return recipe;
}

RecipeCacheStats recipe_cache_stats() {
  Cache& c = cache();
  const std::lock_guard<std::mutex> lock(c.mutex);
  return c.stats;
}

namespace {
// a * b for axis lengths; ShapeError past 2^62 (a repeat axis of 2^60 on a 2 x 2 input).
int64_t axes_product(int64_t a, int64_t b) {
  const auto p = checked_mul(a, b);
  if (!p) fail<ShapeError>("Axis lengths multiply past 2^62: ", a, " * ", b);
  return *p;
}
}  // namespace

Plan reconstruct(const Recipe& recipe, const Shape& shape, const std::vector<int64_t>& given_lengths) {
  std::vector<int64_t> lengths = recipe.elementary_axes_lengths;
  for (size_t i = 0; i < given_lengths.size(); ++i) lengths[recipe.given_axis_positions[i]] = given_lengths[i];
  Plan plan;
  for (size_t input_axis = 0; input_axis < recipe.input_known_unknown.size(); ++input_axis) {
    const auto& [known, unknown] = recipe.input_known_unknown[input_axis];
    const int64_t length = shape[input_axis];
    if (known.empty() && unknown.size() == 1) {
      lengths[unknown[0]] = length;
      continue;
    }
    int64_t known_product = 1;
    for (int k : known) known_product = axes_product(known_product, lengths[k]);
    if (unknown.empty()) {
      if (length != known_product) fail<ShapeError>("Shape mismatch, ", length, " != ", known_product);
    } else {
      if (known_product == 0 ? length != 0 : length % known_product != 0) {
        fail<ShapeError>("Shape mismatch, can't divide axis of length ", length, " in chunks of ", known_product);
      }
      lengths[unknown[0]] = known_product == 0 ? 0 : length / known_product;
    }
    if (known.size() + unknown.size() != 1) plan.need_init_reshape = true;
  }
  const size_t n_left = recipe.axes_permutation.size();
  plan.init_shape.assign(lengths.begin(), lengths.begin() + static_cast<std::ptrdiff_t>(n_left));
  for (const auto& group : recipe.output_composite_axes) {
    int64_t product = 1;
    for (int a : group) product = axes_product(product, lengths[a]);
    plan.final_shape.push_back(product);
    plan.final_group_sizes.push_back(static_cast<int64_t>(group.size()));
    if (group.size() != 1) plan.need_final_reshape = true;
  }
  if (!checked_numel(plan.final_shape)) {
    fail<ShapeError>("Output shape ", shape_str(plan.final_shape), " has more than 2^62 elements");
  }
  for (const auto& [pos, axis] : recipe.added_axes) plan.added_axes.emplace_back(pos, lengths[axis]);
  bool identity = true;
  for (size_t i = 0; i < n_left; ++i) identity = identity && recipe.axes_permutation[i] == static_cast<int>(i);
  if (!identity) plan.permutation.assign(recipe.axes_permutation.begin(), recipe.axes_permutation.end());
  plan.n_kept = recipe.first_reduced_axis;
  plan.has_reduction = recipe.first_reduced_axis < static_cast<int>(n_left);
  return plan;
}

}  // namespace qkv::einops_detail
