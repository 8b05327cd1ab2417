// The .npy header: a Python dict literal, parsed by a small strict recursive-descent
// parser instead of anything resembling eval. It accepts what numpy's writers
// (and ast.literal_eval on them) accept: str, bool, int, tuple, list and None values,
// any whitespace between tokens, trailing commas. Everything else is a FormatError
// that quotes the header and says where parsing stopped.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "io/io_internal.h"

namespace qkv::io::detail {
namespace {

struct Value {
  enum class Kind { none, boolean, integer, string, tuple, list };
  Kind kind = Kind::none;
  bool boolean = false;
  int64_t integer = 0;
  std::string string;
  std::vector<Value> items;
};

const char* kind_name(Value::Kind k) {
  switch (k) {
    case Value::Kind::none: return "None";
    case Value::Kind::boolean: return "a bool";
    case Value::Kind::integer: return "an int";
    case Value::Kind::string: return "a str";
    case Value::Kind::tuple: return "a tuple";
    case Value::Kind::list: return "a list";
  }
  return "?";
}

class LiteralParser {
 public:
  LiteralParser(std::string_view text, bool allow_long_suffix, const Context& ctx)
      : text_(text), allow_long_suffix_(allow_long_suffix), ctx_(ctx) {}

  NpyHeader parse_header() {
    skip_space();
    expect('{', "the header dict");
    NpyHeader header;
    bool seen_descr = false, seen_order = false, seen_shape = false;
    skip_space();
    while (peek() != '}') {
      const std::string key = parse_string("a str key");
      skip_space();
      expect(':', "':' after key " + quote_name(key));
      Value value = parse_value(1);
      store(key, std::move(value), header, seen_descr, seen_order, seen_shape);
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        error("expected ',' or '}' after the value of " + quote_name(key));
      }
    }
    ++pos_;
    skip_space();
    if (pos_ != text_.size()) error("unexpected text after the header dict");
    if (!seen_descr) missing_key("descr");
    if (!seen_order) missing_key("fortran_order");
    if (!seen_shape) missing_key("shape");
    return header;
  }

 private:
  static constexpr int kMaxDepth = 8;  // numpy writes depth 2; bounds recursion on hostile input

  [[noreturn]] void error(const std::string& what) const {
    fail_at(ctx_, "bad .npy header: ", what, " at offset ", pos_, " in ", quote_excerpt(text_));
  }
  [[noreturn]] void missing_key(const char* key) const {
    fail_at(ctx_, "bad .npy header: no '", key, "' key in ", quote_excerpt(text_));
  }

  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool at_end() const { return pos_ >= text_.size(); }

  void skip_space() {
    while (!at_end() && (peek() == ' ' || peek() == '\t' || peek() == '\n' || peek() == '\r' || peek() == '\f')) {
      ++pos_;
    }
  }

  void expect(char c, const std::string& what) {
    if (at_end() || peek() != c) error("expected " + what);
    ++pos_;
  }

  void store(const std::string& key, Value value, NpyHeader& header, bool& seen_descr, bool& seen_order,
             bool& seen_shape) {
    bool* seen = key == "descr"           ? &seen_descr
                 : key == "fortran_order" ? &seen_order
                 : key == "shape"         ? &seen_shape
                                          : nullptr;
    // numpy rejects extra keys too ("Header does not contain the correct keys").
    if (seen == nullptr) error("unexpected key " + quote_name(key) + " (allowed: 'descr', 'fortran_order', 'shape')");
    if (*seen) error("duplicate key " + quote_name(key));
    *seen = true;
    if (key == "descr") {
      // A list descr is a structured dtype: well-formed, but not a dtype qkv holds.
      if (value.kind == Value::Kind::list) {
        fail_at<DTypeError>(ctx_, "structured dtypes (list 'descr') are not supported; header ", quote_excerpt(text_));
      }
      if (value.kind != Value::Kind::string) error(std::string("'descr' is ") + kind_name(value.kind) + ", not a str");
      header.descr = std::move(value.string);
    } else if (key == "fortran_order") {
      if (value.kind != Value::Kind::boolean) {
        error(std::string("'fortran_order' is ") + kind_name(value.kind) + ", not True or False");
      }
      header.fortran_order = value.boolean;
    } else {
      store_shape(value, header.shape);
    }
  }

  void store_shape(const Value& value, Shape& shape) {
    if (value.kind != Value::Kind::tuple) {
      error(std::string("'shape' is ") + kind_name(value.kind) + ", not a tuple of ints");
    }
    for (const Value& item : value.items) {
      if (item.kind != Value::Kind::integer) {
        error(std::string("'shape' holds ") + kind_name(item.kind) + ", not only ints");
      }
      if (item.integer < 0) error("'shape' has negative dimension " + std::to_string(item.integer));
      shape.push_back(item.integer);
    }
  }

  Value parse_value(int depth) {
    if (depth > kMaxDepth) error("values nested too deeply");
    skip_space();
    const char c = peek();
    if (c == '\'' || c == '"') {
      Value v;
      v.kind = Value::Kind::string;
      v.string = parse_string("a str");
      return v;
    }
    if (c == '(' || c == '[') return parse_sequence(depth);
    if (c == '-' || (c >= '0' && c <= '9')) return parse_int();
    return parse_name();
  }

  std::string parse_string(const char* what) {
    const char quote = peek();
    if (quote != '\'' && quote != '"') error(std::string("expected ") + what);
    const size_t start = ++pos_;
    while (!at_end() && peek() != quote) {
      // numpy never writes escapes; refusing them keeps the parser trivially correct.
      if (peek() == '\\') error("escape sequences in strings are not supported");
      if (peek() == '\n') error("unterminated string");
      ++pos_;
    }
    if (at_end()) error("unterminated string");
    std::string s(text_.substr(start, pos_ - start));
    ++pos_;
    return s;
  }

  Value parse_int() {
    const size_t start = pos_;
    const bool negative = peek() == '-';
    if (negative) {
      ++pos_;
      skip_space();
    }
    if (at_end() || peek() < '0' || peek() > '9') error("expected digits");
    const size_t digits = pos_;
    uint64_t magnitude = 0;
    while (!at_end() && peek() >= '0' && peek() <= '9') {
      const auto digit = static_cast<uint64_t>(peek() - '0');
      if (magnitude > (uint64_t{1} << 63) / 10 || magnitude * 10 > (uint64_t{1} << 63) - digit) {
        pos_ = start;
        error("integer does not fit in 64 bits");
      }
      magnitude = magnitude * 10 + digit;
      ++pos_;
    }
    // Python 3 rejects "007"; so do we, rather than guess octal or decimal.
    if (pos_ - digits > 1 && text_[digits] == '0') {
      pos_ = digits;
      error("integer with leading zeros");
    }
    if (allow_long_suffix_ && (peek() == 'L' || peek() == 'l')) ++pos_;
    if (!negative && magnitude > static_cast<uint64_t>(INT64_MAX)) {
      pos_ = start;
      error("integer does not fit in 64 bits");
    }
    Value v;
    v.kind = Value::Kind::integer;
    v.integer = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
    return v;
  }

  Value parse_name() {
    const size_t start = pos_;
    while (!at_end() && ((peek() >= 'a' && peek() <= 'z') || (peek() >= 'A' && peek() <= 'Z') ||
                         (peek() >= '0' && peek() <= '9') || peek() == '_')) {
      ++pos_;
    }
    const std::string_view name = text_.substr(start, pos_ - start);
    Value v;
    if (name == "True" || name == "False") {
      v.kind = Value::Kind::boolean;
      v.boolean = name == "True";
    } else if (name != "None") {
      pos_ = start;
      error("expected a value (str, int, True, False, None, tuple or list)");
    }
    return v;
  }

  // "(a, b)", "(a,)", "()", "[a, b]", "[]". "(a)" is just a parenthesized a, as in Python.
  Value parse_sequence(int depth) {
    const char open = peek();
    const char close = open == '(' ? ')' : ']';
    ++pos_;
    Value seq;
    seq.kind = open == '(' ? Value::Kind::tuple : Value::Kind::list;
    bool trailing_comma = false;
    skip_space();
    while (peek() != close) {
      seq.items.push_back(parse_value(depth + 1));
      skip_space();
      trailing_comma = peek() == ',';
      if (trailing_comma) {
        ++pos_;
        skip_space();
      } else if (peek() != close) {
        error(std::string("expected ',' or '") + close + "'");
      }
    }
    ++pos_;
    if (open == '(' && seq.items.size() == 1 && !trailing_comma) return std::move(seq.items[0]);
    return seq;
  }

  std::string_view text_;
  bool allow_long_suffix_;
  const Context& ctx_;
  size_t pos_ = 0;
};

}  // namespace

NpyHeader parse_npy_header(std::string_view text, bool allow_long_suffix, const Context& ctx) {
  return LiteralParser(text, allow_long_suffix, ctx).parse_header();
}

}  // namespace qkv::io::detail
