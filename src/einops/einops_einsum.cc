// einops.einsum: multi-letter axis names compacted to letters (einops'
// _compactify_pattern_for_einsum), then qkv::einsum.
#include <map>
#include <span>

#include "einops/parse.h"
#include "qkv/einops.h"
#include "qkv/einsum.h"

namespace qkv::einops {

namespace {

using einops_detail::Group;

// einops' _validate_einsum_axis_name; returns the axis key.
const std::string& einsum_axis(const Group& g) {
  if (g.axes.empty()) fail<FormatError>("Singleton () axes are not yet supported in einsum.");
  if (g.axes.size() > 1) fail<FormatError>("Shape rearrangement is not yet supported in einsum.");
  if (g.axes[0].anonymous()) fail<FormatError>("Anonymous axes are not yet supported in einsum.");
  return g.axes[0].key;
}

std::vector<std::string_view> split_commas(std::string_view s) {
  std::vector<std::string_view> out;
  size_t start = 0;
  for (size_t comma; (comma = s.find(',', start)) != std::string_view::npos; start = comma + 1) {
    out.push_back(s.substr(start, comma - start));
  }
  out.push_back(s.substr(start));
  return out;
}

}  // namespace

std::string compact_einsum_pattern(std::string_view pattern) {
  const size_t arrow = pattern.find("->");
  if (arrow == std::string_view::npos) fail<FormatError>("Einsum pattern must contain '->'.");
  if (pattern.find("->", arrow + 2) != std::string_view::npos) {
    fail<FormatError>("Einsum pattern must contain '->' once: ", pattern);
  }
  static constexpr std::string_view kLetters = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
  // Every side is parsed before any axis is validated, as einops does: a malformed
  // expression anywhere is reported before an unsupported axis (e.g. `()`) elsewhere.
  std::vector<einops_detail::Expression> lefts;
  for (std::string_view left : split_commas(pattern.substr(0, arrow))) {
    lefts.push_back(einops_detail::parse_expression(left, true, true, nullptr));
  }
  const auto right = einops_detail::parse_expression(pattern.substr(arrow + 2), true, false, nullptr);
  std::map<std::string, char> letter;
  std::string compact;
  for (const auto& e : lefts) {
    std::string term;
    for (const Group& g : e.composition) {
      if (g.bare_ellipsis) {
        term += "...";
        continue;
      }
      const std::string& name = einsum_axis(g);
      if (!letter.count(name)) {
        if (letter.size() >= kLetters.size()) fail<FormatError>("Too many axes in einsum.");
        letter[name] = kLetters[letter.size()];
      }
      term += letter[name];
    }
    compact += term + ",";
  }
  compact.back() = '-';
  compact += ">";
  for (const Group& g : right.composition) {
    if (g.bare_ellipsis) {
      compact += "...";
      continue;
    }
    const std::string& name = einsum_axis(g);
    if (!letter.count(name)) fail<FormatError>("Unknown axis ", name, " on right side of einsum ", pattern, ".");
    compact += letter[name];
  }
  return compact;
}

Tensor einsum(const std::vector<Tensor>& tensors, std::string_view pattern) {
  return qkv::einsum(compact_einsum_pattern(pattern), std::span<const Tensor>(tensors.data(), tensors.size()));
}

}  // namespace qkv::einops
