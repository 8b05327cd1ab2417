// numpy-style printing: array([[0.5, 1. ],
//                              [2. , 3. ]], dtype=float32)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "qkv/tensor.h"

namespace qkv {

namespace {

constexpr int64_t kSummarizeAbove = 1000;  // numpy's threshold
constexpr int64_t kEdgeItems = 3;
constexpr size_t kLineWidth = 75;

// How every float element is written, chosen from all of them as numpy does.
struct FloatStyle {
  bool scientific = false;
  bool integral = true;
};

std::string trim_fraction(std::string s) {
  const auto dot = s.find('.');
  if (dot == std::string::npos) return s;
  const auto exp = s.find('e');
  std::string mantissa = s.substr(0, exp), suffix = exp == std::string::npos ? "" : s.substr(exp);
  while (mantissa.size() > dot + 2 && mantissa.back() == '0') mantissa.pop_back();
  if (mantissa.size() == dot + 2 && mantissa.back() == '0' && suffix.empty()) mantissa.pop_back();
  return mantissa + suffix;
}

// `x` read back from text, rounded to the element type: numpy prints the
// fewest digits that survive this round trip (its "unique" mode).
double round_to(double x, DType dtype) {
  switch (dtype) {
    case DType::f32: return static_cast<float>(x);
    case DType::f16: return static_cast<float>(float16(static_cast<float>(x)));
    case DType::bf16: return static_cast<float>(bfloat16(static_cast<float>(x)));
    default: return x;
  }
}

std::string format_float(double x, const FloatStyle& style, DType dtype) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  for (int digits = 0; digits <= 8; ++digits) {
    std::snprintf(buf, sizeof buf, style.scientific ? "%.*e" : "%.*f", digits, x);
    if (round_to(std::strtod(buf, nullptr), dtype) == x) break;
  }
  std::string text = buf;
  if (text.find('.') == std::string::npos) {  // numpy keeps the point: "2.", "1.e-05"
    const auto e = std::min(text.find('e'), text.size());
    std::string with_point(text, 0, e);
    with_point.push_back('.');
    with_point.append(text, e, std::string::npos);
    text.swap(with_point);
  }
  return trim_fraction(text);
}

FloatStyle choose_style(const std::vector<double>& values) {
  FloatStyle style;
  double max_abs = 0, min_abs = INFINITY;
  for (double v : values) {
    if (!std::isfinite(v)) continue;
    const double a = std::fabs(v);
    max_abs = std::max(max_abs, a);
    if (a > 0) min_abs = std::min(min_abs, a);
    if (v != std::floor(v)) style.integral = false;
  }
  style.scientific = max_abs >= 1e8 || (min_abs < 1e-4 && !style.integral) ||
                     (min_abs != INFINITY && max_abs / min_abs > 1e3 && !style.integral);
  return style;
}

// Row-major indices to print along one dim ("..." is -1).
std::vector<int64_t> shown_indices(int64_t n, bool summarize) {
  std::vector<int64_t> out;
  if (!summarize || n <= 2 * kEdgeItems) {
    for (int64_t i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  for (int64_t i = 0; i < kEdgeItems; ++i) out.push_back(i);
  out.push_back(-1);
  for (int64_t i = n - kEdgeItems; i < n; ++i) out.push_back(i);
  return out;
}

class Printer {
 public:
  Printer(const Tensor& t, bool summarize) : t_(t), summarize_(summarize) {}

  std::string print(size_t indent) {
    collect(0);
    if (is_floating(t_.dtype())) style_ = choose_style(numbers_);
    measure();
    std::string out;
    index_.assign(t_.shape().size(), 0);
    emit(0, indent, out);
    return out;
  }

 private:
  void collect(size_t d) {
    if (d == t_.shape().size()) {
      numbers_.push_back(t_.item(index_));
      return;
    }
    index_.resize(t_.shape().size());
    for (int64_t i : shown_indices(t_.shape()[d], summarize_)) {
      if (i < 0) continue;
      index_[d] = i;
      collect(d + 1);
    }
  }

  std::string element(double v) const {
    if (t_.dtype() == DType::b8) return v != 0 ? " True" : "False";
    if (!is_floating(t_.dtype())) return std::to_string(static_cast<int64_t>(v));
    return format_float(v, style_, t_.dtype());
  }

  // Fixed-point floats align on the decimal point (numpy pads the fraction on
  // the right); everything else is right-aligned.
  std::string padded(double v) const {
    std::string s = element(v);
    const auto dot = s.find('.');
    if (aligned_ && dot != std::string::npos) {
      s += std::string(frac_width_ - (s.size() - dot - 1), ' ');
      return std::string(int_width_ - dot, ' ') + s;
    }
    return std::string(width_ - std::min(width_, s.size()), ' ') + s;
  }

  void measure() {
    aligned_ = is_floating(t_.dtype()) && !style_.scientific;
    for (double v : numbers_) {
      const std::string s = element(v);
      const auto dot = s.find('.');
      if (aligned_ && dot != std::string::npos) {
        int_width_ = std::max(int_width_, dot);
        frac_width_ = std::max(frac_width_, s.size() - dot - 1);
      } else {
        width_ = std::max(width_, s.size());
      }
    }
    if (aligned_) width_ = std::max(width_, int_width_ + 1 + frac_width_);
  }

  void emit(size_t d, size_t indent, std::string& out) {
    const size_t nd = t_.shape().size();
    if (nd == 0) {
      out += element(numbers_[0]);
      return;
    }
    out += '[';
    const auto shown = shown_indices(t_.shape()[d], summarize_);
    size_t line_start = out.rfind('\n') == std::string::npos ? 0 : out.rfind('\n') + 1;
    for (size_t k = 0; k < shown.size(); ++k) {
      if (k > 0) {
        out += ',';
        if (d + 1 < nd) {
          out += std::string(nd - d - 1, '\n');
          out += std::string(indent + d + 1, ' ');
        } else if (out.size() - line_start + width_ + 2 > kLineWidth) {
          out += '\n' + std::string(indent + d + 1, ' ');
          line_start = out.size() - indent - d - 1;
        } else {
          out += ' ';
        }
      }
      if (shown[k] < 0) {
        out += "...";
        continue;
      }
      if (d + 1 == nd) {
        out += padded(numbers_[next_++]);
      } else {
        emit(d + 1, indent, out);
      }
    }
    out += ']';
  }

  const Tensor& t_;
  bool summarize_;
  FloatStyle style_;
  std::vector<int64_t> index_;
  std::vector<double> numbers_;
  size_t next_ = 0;
  size_t width_ = 0;
  bool aligned_ = false;
  size_t int_width_ = 0, frac_width_ = 0;
};

}  // namespace

std::string Tensor::to_string() const {
  require_cpu("to_string", {this});
  const bool default_dtype = dtype_ == DType::f64 || dtype_ == DType::i64 || dtype_ == DType::b8;
  std::string out = "array(";
  out += Printer(*this, numel_ > kSummarizeAbove).print(out.size());
  if (numel_ == 0 || numel_ > kSummarizeAbove) out += ", shape=" + shape_str(shape_);
  if (!default_dtype || numel_ == 0) out += ", dtype=" + std::string(dtype_name(dtype_));
  return out + ")";
}

}  // namespace qkv
