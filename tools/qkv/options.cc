// Numeric command-line values: one parser behind every subcommand's numeric options
// (CLI11 validators) and the numbers inside option strings (--shape B,H,L,D, NAME=LENGTH,
// --shapes). A bad value is a usage error (CLI::ValidationError, exit 2) whose message
// names the option, the accepted range and what was given.
#include <charconv>
#include <cmath>
#include <limits>
#include <sstream>

#include "commands.h"

namespace qkv::cli {

namespace {

constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// " in [lo, hi]", " >= lo", " <= hi" or "" (an empty bound is open).
std::string bounds(const std::string& lo, const std::string& hi) {
  if (!lo.empty() && !hi.empty()) return " in [" + lo + ", " + hi + "]";
  if (!lo.empty()) return " >= " + lo;
  return hi.empty() ? "" : " <= " + hi;
}

std::string integer_bounds(int64_t lo, uint64_t hi) {
  return bounds(lo == kMin ? "" : std::to_string(lo), hi >= static_cast<uint64_t>(kMax) ? "" : std::to_string(hi));
}

std::string real_bounds(double lo, double hi) {
  auto text = [](double x) {
    std::ostringstream out;
    out << x;
    return std::isfinite(x) ? out.str() : std::string();
  };
  return bounds(text(lo), text(hi));
}

// from_chars over the whole text (no sign other than '-', no spaces, no suffix).
template <class T>
bool parse_all(const std::string& text, T* value) {
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, *value);
  return ec == std::errc() && ptr == end && !text.empty();
}

// "" when text is a whole integer in [lo, hi] (hi may exceed int64: --seed is uint64).
std::string integer_problem(const std::string& text, int64_t lo, uint64_t hi) {
  int64_t v = 0;
  uint64_t u = 0;
  bool ok = false;
  if (parse_all(text, &v)) {
    ok = v >= lo && (v < 0 || static_cast<uint64_t>(v) <= hi);
  } else if (parse_all(text, &u)) {
    ok = u <= hi;  // above int64's range
  }
  return ok ? std::string() : "expected an integer" + integer_bounds(lo, hi) + ", got '" + text + "'";
}

std::string real_problem(const std::string& text, double lo, double hi) {
  double v = 0.0;
  if (parse_all(text, &v) && std::isfinite(v) && v >= lo && v <= hi) return {};
  return "expected a finite number" + real_bounds(lo, hi) + ", got '" + text + "'";
}

// --help shows "INT:in [1, 4096]" (CLI11 puts the type and ':' before it).
std::string help_text(const std::string& bounds, const char* unbounded) {
  return bounds.empty() ? unbounded : bounds.substr(1);
}

}  // namespace

CLI::Validator integer_in(int64_t lo, uint64_t hi) {
  return CLI::Validator([lo, hi](std::string& text) { return integer_problem(text, lo, hi); },
                        help_text(integer_bounds(lo, hi), "integer"));
}

CLI::Validator real_in(double lo, double hi) {
  return CLI::Validator([lo, hi](std::string& text) { return real_problem(text, lo, hi); },
                        help_text(real_bounds(lo, hi), "finite"));
}

std::optional<int64_t> to_integer(const std::string& text, int64_t lo, int64_t hi) {
  int64_t v = 0;
  if (!parse_all(text, &v) || v < lo || v > hi) return std::nullopt;
  return v;
}

int64_t parse_integer(const std::string& text, const std::string& what, int64_t lo, int64_t hi) {
  if (const std::optional<int64_t> v = to_integer(text, lo, hi)) return *v;
  throw CLI::ValidationError(what, integer_problem(text, lo, static_cast<uint64_t>(hi)));
}

}  // namespace qkv::cli
