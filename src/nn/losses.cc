// Training losses (qkv/nn/losses.h): mean reduction, gradient with respect to the first
// input, accumulated in double and returned in float32.
#include "qkv/nn/losses.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "qkv/error.h"

namespace qkv::nn {

namespace {

void same_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) {
    fail<ShapeError>(op, ": input ", shape_str(a.shape()), " and target ", shape_str(b.shape()), " differ");
  }
}

// The mean of `count` terms summing to `sum`: NaN for no terms, as torch's reduction='mean'
// (and numpy's mean) give; dividing by max(count, 1) gave 0, a loss that looked perfect.
double mean_of(double sum, size_t count) {
  return count ? sum / static_cast<double>(count) : std::numeric_limits<double>::quiet_NaN();
}

}  // namespace

LossResult binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets) {
  same_shape("binary_cross_entropy_with_logits", logits, targets);
  const auto x = logits.to_vector<double>(), y = targets.to_vector<double>();
  const auto n = static_cast<double>(x.size());  // only divides when there are elements
  std::vector<float> grad(x.size());
  double sum = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    // torch's form, (1 - y) x - log_sigmoid(x) with log_sigmoid(x) = min(x, 0) - log(1 + e^-|x|):
    // the same number for finite x, and torch's values at infinite x (NaN at x = -inf for every
    // y, inf at x = +inf unless y = 1, NaN there); the form max(x, 0) - x y + ... gave inf at
    // x = -inf, y > 0 and NaN at x = +inf, y = 0.5 (torch: inf).
    sum += (1.0 - y[i]) * x[i] - std::min(x[i], 0.0) + std::log1p(std::exp(-std::fabs(x[i])));
    grad[i] = static_cast<float>((1.0 / (1.0 + std::exp(-x[i])) - y[i]) / n);
  }
  return {mean_of(sum, x.size()), Tensor::from_vector(grad, logits.shape())};
}

LossResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index) {
  if (logits.dim() != 2 || targets.dim() != 1 || targets.size(0) != logits.size(0)) {
    fail<ShapeError>("cross_entropy: expected logits [N, C] and targets [N], got ", shape_str(logits.shape()), " and ",
                     shape_str(targets.shape()));
  }
  // Class indices (torch: "expected scalar type Long"): float targets were truncated to
  // classes (1.9 counted as class 1, NaN as whatever its cast gave) without a word.
  if (is_floating(targets.dtype()) || targets.dtype() == DType::b8) {
    fail<DTypeError>("cross_entropy: targets must be integer class indices, got ", dtype_name(targets.dtype()), " ",
                     shape_str(targets.shape()));
  }
  const int64_t rows = logits.size(0), classes = logits.size(1);
  const auto x = logits.to_vector<double>();
  const auto y = targets.to_vector<int64_t>();
  // Rows whose target is ignore_index (torch's default -100, Hugging Face's label padding) count
  // neither in the sum nor in the mean's count, and their gradient is 0; the others are checked
  // first, so that the count is known before any gradient is written.
  size_t kept = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t label = y[static_cast<size_t>(r)];
    if (label == ignore_index) continue;
    if (label < 0 || label >= classes) {
      fail<ValueError>("cross_entropy: target ", label, " of row ", r, " is not in [0, ", classes,
                       ") nor ignore_index ", ignore_index);
    }
    ++kept;
  }
  std::vector<float> grad(x.size(), 0.0f);
  double sum = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t label = y[static_cast<size_t>(r)];
    if (label == ignore_index) continue;
    const double* row = x.data() + r * classes;
    const double mx = *std::max_element(row, row + classes);
    double z = 0.0;
    for (int64_t c = 0; c < classes; ++c) z += std::exp(row[c] - mx);
    sum += std::log(z) + mx - row[label];
    for (int64_t c = 0; c < classes; ++c) {
      const double p = std::exp(row[c] - mx) / z;
      grad[static_cast<size_t>(r * classes + c)] =
          static_cast<float>((p - (c == label ? 1.0 : 0.0)) / static_cast<double>(kept));
    }
  }
  return {mean_of(sum, kept), Tensor::from_vector(grad, logits.shape())};
}

LossResult mse_loss(const Tensor& input, const Tensor& target) {
  same_shape("mse_loss", input, target);
  const auto x = input.to_vector<double>(), y = target.to_vector<double>();
  const auto n = static_cast<double>(x.size());
  std::vector<float> grad(x.size());
  double sum = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    sum += (x[i] - y[i]) * (x[i] - y[i]);
    grad[i] = static_cast<float>(2.0 * (x[i] - y[i]) / n);
  }
  return {mean_of(sum, x.size()), Tensor::from_vector(grad, input.shape())};
}

}  // namespace qkv::nn
