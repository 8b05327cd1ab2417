// Central differences for the backward tests (tests/nn/*_finite_difference_test.cc): float32
// layers stepped by +-h in float32 (the step taken as the difference of the two rounded values),
// the loss sum(y * g) accumulated in double; Comparison holds the analytic and numeric gradients
// of one configuration and checks the largest difference against kTolerance of its largest
// gradient (the measured worst cases and why h = 1e-2: mha_finite_difference_test.cc's header).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::test {

constexpr double kStep = 1e-2;
constexpr double kTolerance = 5e-4;  // of the configuration's largest gradient

// d f / d x at every element of x by central differences (float32 steps, double loss).
inline std::vector<double> numeric_grad(const Tensor& x, const std::function<double(const Tensor&)>& f) {
  Tensor xc = x.contiguous().clone();
  float* p = xc.data<float>();
  std::vector<double> out(static_cast<size_t>(xc.numel()));
  for (int64_t i = 0; i < xc.numel(); ++i) {
    const float orig = p[i];
    const float up = orig + static_cast<float>(kStep), down = orig - static_cast<float>(kStep);
    p[i] = up;
    const double f_up = f(xc);
    p[i] = down;
    const double f_down = f(xc);
    p[i] = orig;
    out[static_cast<size_t>(i)] = (f_up - f_down) / (static_cast<double>(up) - static_cast<double>(down));
  }
  return out;
}

inline double dot(const Tensor& y, const Tensor& g) {
  const auto a = y.to_vector<double>(), b = g.to_vector<double>();
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// The analytic and numeric gradients of named tensors of one configuration: the largest
// difference over the configuration's largest gradient, checked against kTolerance.
struct Comparison {
  std::map<std::string, std::pair<std::vector<double>, std::vector<double>>> grads;  // analytic, numeric
  double worst = 0;

  void add(const std::string& name, const Tensor& analytic, std::vector<double> numeric) {
    EXPECT_EQ(analytic.numel(), static_cast<int64_t>(numeric.size())) << name;
    grads[name] = {analytic.to_vector<double>(), std::move(numeric)};
  }
  void check(const std::string& what) {
    double scale = 1e-30;
    for (const auto& [name, g] : grads) {
      for (double x : g.second) scale = std::max(scale, std::fabs(x));
    }
    for (const auto& [name, g] : grads) {
      double err = 0;
      for (size_t i = 0; i < g.first.size() && i < g.second.size(); ++i) {
        const double d = std::fabs(g.first[i] - g.second[i]);
        err = std::isnan(d) ? INFINITY : std::max(err, d);
      }
      EXPECT_LE(err / scale, kTolerance) << what << ": " << name;
      worst = std::max(worst, err / scale);
    }
    std::printf("%s: worst %.2e of the largest gradient (%zu tensors)\n", what.c_str(), worst, grads.size());
  }
};

}  // namespace qkv::test
