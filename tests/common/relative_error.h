// max |got - want| / max |want| over every element (NaN-aware): the relative error most
// kernel-vs-oracle tests bound; and max |got - want| itself, for tests that bound the
// absolute error.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "qkv/tensor.h"

namespace qkv::testing {

// Shapes must agree (a mismatch fails the test and returns infinity); a NaN where the oracle
// has a number counts as infinite error.
inline double max_relative_error(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  if (got.shape() != want.shape()) return std::numeric_limits<double>::infinity();
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double err = 0, scale = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const double d = std::fabs(g[i] - w[i]);
    err = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(err, d);
    scale = std::max(scale, std::fabs(w[i]));
  }
  return err / std::max(scale, 1e-300);
}

// max |got - want| over every element (shapes must agree, as above). Equal infinities (the
// -inf logsumexp of a row with no visible key) differ by 0; a NaN on either side, or opposite
// infinities, count as infinite error.
inline double max_abs_error(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  if (got.shape() != want.shape()) return std::numeric_limits<double>::infinity();
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double err = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    if (std::isinf(g[i]) && g[i] == w[i]) continue;
    const double d = std::fabs(g[i] - w[i]);
    err = std::isnan(d) ? std::numeric_limits<double>::infinity() : std::max(err, d);
  }
  return err;
}

}  // namespace qkv::testing
