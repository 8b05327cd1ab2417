// Parsing of one side of an einops pattern, following einops/parsing.py
// (ParsedExpression) rule by rule, with the same error texts.
#include "einops/parse.h"

#include <algorithm>

#include "qkv/error.h"

namespace qkv::einops_detail {

namespace {

bool is_ascii_digit(char c) { return c >= '0' && c <= '9'; }
bool is_ascii_alpha(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool is_high_byte(char c) { return static_cast<unsigned char>(c) >= 0x80; }

// Python's str.isdecimal (ASCII digits only; non-ASCII digits are rare enough).
bool is_decimal(std::string_view s) { return !s.empty() && std::all_of(s.begin(), s.end(), is_ascii_digit); }

// Parses a decimal string; FormatError past 2^62, the most any axis length may be (it
// saturated at 2^50 before, so repeat "a -> a 99999999999999999999" gave an axis of 2^50).
int64_t parse_decimal(std::string_view s) {
  constexpr int64_t kMax = int64_t{1} << 62;
  int64_t v = 0;
  for (char c : s) {
    if (v > (kMax - (c - '0')) / 10) fail<FormatError>("Anonymous axis length ", s, " is more than 2^62");
    v = v * 10 + (c - '0');
  }
  return v;
}

class Parser {
 public:
  Parser(bool allow_underscore, bool allow_duplicates, int* anon_counter)
      : allow_underscore_(allow_underscore), allow_duplicates_(allow_duplicates), anon_counter_(anon_counter) {}

  Expression run(std::string_view input) {
    std::string expression(input);
    if (expression.find('.') != std::string::npos) {
      const size_t first = expression.find("...");
      if (first == std::string::npos) fail<FormatError>("Expression may contain dots only inside ellipsis (...)");
      const bool one = expression.find("...", first + 3) == std::string::npos;
      if (!one || std::count(expression.begin(), expression.end(), '.') != 3) {
        fail<FormatError>("Expression may contain dots only inside ellipsis (...); only one ellipsis for tensor ");
      }
      expression.replace(first, 3, kEllipsis);
      out_.has_ellipsis = true;
    }
    std::string current;
    bool have_current = false;
    for (char c : expression) {
      if (c == '(' || c == ')' || c == ' ') {
        if (have_current) add_axis_name(current);
        current.clear();
        have_current = false;
        if (c == '(') {
          if (in_group_) fail<FormatError>("Axis composition is one-level (brackets inside brackets not allowed)");
          in_group_ = true;
          group_.clear();
        } else if (c == ')') {
          if (!in_group_) fail<FormatError>("Brackets are not balanced");
          out_.composition.push_back(Group{false, group_});
          in_group_ = false;
        }
      } else if (is_ascii_digit(c) || is_ascii_alpha(c) || c == '_' || is_high_byte(c)) {
        current += c;  // the ellipsis character is made of high bytes, so it joins names as in einops
        have_current = true;
      } else {
        fail<FormatError>("Unknown character '", c, "'");
      }
    }
    if (in_group_) fail<FormatError>("Imbalanced parentheses in expression: \"", expression, "\"");
    if (have_current) add_axis_name(current);
    return std::move(out_);
  }

 private:
  void add_axis_name(const std::string& x) {
    if (out_.identifiers.count(x) != 0) {
      if (!(allow_underscore_ && x == "_") && !allow_duplicates_) {
        fail<FormatError>("Indexing expression contains duplicate dimension \"", x, "\"");
      }
    }
    if (x == kEllipsis) {
      out_.identifiers.insert(x);
      if (!in_group_) {
        out_.composition.push_back(Group{true, {}});
        out_.has_ellipsis_parenthesized = false;
      } else {
        group_.push_back(Axis{x, 0});
        out_.has_ellipsis_parenthesized = true;
      }
      return;
    }
    const bool is_number = is_decimal(x);
    if (is_number && parse_decimal(x) == 1) {
      if (!in_group_) out_.composition.push_back(Group{});  // an axis of length 1: an empty group
      return;                                               // inside brackets a 1 changes nothing
    }
    const std::string reason = axis_name_problem(x, allow_underscore_);
    if (!is_number && !reason.empty()) fail<FormatError>("Invalid axis identifier: ", x, "\n", reason);
    Axis axis{x, 0};
    if (is_number) {
      const int64_t value = parse_decimal(x);
      if (value < 1) fail<FormatError>("Anonymous axis should have positive length, not ", value);
      std::string key(1, '\x01');
      key += std::to_string((*anon_counter_)++);
      axis = Axis{key, value};
      out_.has_non_unitary_anonymous_axes = true;
    }
    out_.identifiers.insert(axis.key);
    if (!in_group_) {
      out_.composition.push_back(Group{false, {axis}});
    } else {
      group_.push_back(axis);
    }
  }

  bool allow_underscore_, allow_duplicates_;
  int* anon_counter_;
  Expression out_;
  bool in_group_ = false;
  std::vector<Axis> group_;
};

}  // namespace

std::string Axis::display() const { return anonymous() ? std::to_string(value) + "-axis" : key; }

bool Expression::has_composed_axes() const {
  return std::any_of(composition.begin(), composition.end(),
                     [](const Group& g) { return !g.bare_ellipsis && g.axes.size() > 1; });
}

Expression parse_expression(std::string_view expression, bool allow_underscore, bool allow_duplicates,
                            int* anon_counter) {
  int local_counter = 0;
  Parser parser(allow_underscore, allow_duplicates, anon_counter != nullptr ? anon_counter : &local_counter);
  return parser.run(expression);
}

bool is_identifier(std::string_view name) {
  if (name.empty() || is_ascii_digit(name[0])) return false;
  if (name.find(kEllipsis) != std::string_view::npos) return false;
  return std::all_of(name.begin(), name.end(),
                     [](char c) { return is_ascii_digit(c) || is_ascii_alpha(c) || c == '_' || is_high_byte(c); });
}

std::string axis_name_problem(std::string_view name, bool allow_underscore) {
  if (!is_identifier(name)) return "not a valid python identifier";
  if (name.front() == '_' || name.back() == '_') {
    if (name == "_" && allow_underscore) return "";
    return "axis name should should not start or end with underscore";  // einops' text, typo included
  }
  return "";
}

std::string py_str_repr(std::string_view s) {
  const bool has_single = s.find('\'') != std::string_view::npos;
  const bool has_double = s.find('"') != std::string_view::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (char c : s) {
    if (c == quote || c == '\\') out += '\\';
    out += c;
  }
  return out + quote;
}

std::string py_set_repr(const std::vector<std::string>& items) {
  if (items.empty()) return "set()";
  std::vector<std::string> sorted = items;
  std::sort(sorted.begin(), sorted.end());
  std::string out = "{";
  for (size_t i = 0; i < sorted.size(); ++i) out += (i ? ", " : "") + sorted[i];
  return out + "}";
}

std::string py_tuple_repr(const std::vector<int64_t>& values) {
  std::string out = "(";
  for (size_t i = 0; i < values.size(); ++i) out += (i ? ", " : "") + std::to_string(values[i]);
  return out + (values.size() == 1 ? ",)" : ")");
}

}  // namespace qkv::einops_detail
