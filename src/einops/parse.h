// One side of an einops pattern ("b c (h w) ...") parsed into axes and groups,
// with the semantics of einops/parsing.py (ParsedExpression).
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

namespace qkv::einops_detail {

// "…" (U+2026): the ellipsis after "..." is replaced, as einops does.
inline constexpr std::string_view kEllipsis = "\xE2\x80\xA6";

// An axis as written: a name, the ellipsis, or an anonymous numeric axis (> 1).
// Anonymous axes are all distinct from each other, even with equal values: their
// key carries a unique id.
struct Axis {
  std::string key;    // identity: the name, kEllipsis, or "\x01<id>" for anonymous axes
  int64_t value = 0;  // length of an anonymous axis; 0 for named axes and the ellipsis

  bool anonymous() const { return value != 0; }
  bool is_ellipsis() const { return key == kEllipsis; }
  // How einops prints it in messages: the name, or "<value>-axis".
  std::string display() const;
  bool operator<(const Axis& o) const { return key < o.key; }
  bool operator==(const Axis& o) const { return key == o.key; }
};

// One entry of the composition: a (possibly empty) group of axes, or the bare
// ellipsis (not in brackets).
struct Group {
  bool bare_ellipsis = false;
  std::vector<Axis> axes;
};

struct Expression {
  bool has_ellipsis = false;
  std::optional<bool> has_ellipsis_parenthesized;
  std::set<std::string> identifiers;  // axis keys (the ellipsis included)
  bool has_non_unitary_anonymous_axes = false;
  std::vector<Group> composition;

  bool has_composed_axes() const;  // some group holds more than one axis
};

// Parses one side. Throws qkv::FormatError with einops' message (without the
// "Error while processing" prefix, which the caller adds). `anon_counter` numbers
// anonymous axes so that keys stay unique across both sides of a pattern.
Expression parse_expression(std::string_view expression, bool allow_underscore, bool allow_duplicates,
                            int* anon_counter);

// Python's str.isidentifier for ASCII names; bytes >= 0x80 (UTF-8 letters such as
// "ß") count as letters, the ellipsis character does not.
bool is_identifier(std::string_view name);
// einops' check_axis_name_return_reason: empty string when valid, else the reason.
std::string axis_name_problem(std::string_view name, bool allow_underscore);

// Python reprs used in messages: 'name', {'a', 'b'} (sorted), (2, 3), (5,).
std::string py_str_repr(std::string_view s);
std::string py_set_repr(const std::vector<std::string>& items);
std::string py_tuple_repr(const std::vector<int64_t>& values);

}  // namespace qkv::einops_detail
