// Shared helpers for the einsum tests.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "qkv/einsum.h"
#include "qkv/tensor.h"

namespace qkv::einsum_test {

// Random operands for `equation`'s input terms, with `size` per letter.
inline std::vector<Tensor> operands_for(const std::string& equation, const std::vector<Shape>& shapes,
                                        DType dtype = DType::f64, uint64_t seed = 1) {
  std::vector<Tensor> ops;
  for (size_t i = 0; i < shapes.size(); ++i) ops.push_back(Tensor::randn(shapes[i], seed + i, dtype));
  (void)equation;
  return ops;
}

// Shapes for the terms of `equation` (no ellipsis) from a size per letter.
inline std::vector<Shape> shapes_for(const std::string& equation, int (*size)(char)) {
  std::vector<Shape> shapes(1);
  for (char c : equation.substr(0, equation.find("->"))) {
    if (c == ',')
      shapes.emplace_back();
    else if (c != ' ')
      shapes.back().push_back(size(c));
  }
  return shapes;
}

// numpy's test_einsum global_size_dict: a..j -> 2 3 4 5 4 3 2 6 5 4.
inline int numpy_size(char c) {
  static const int sizes[] = {2, 3, 4, 5, 4, 3, 2, 6, 5, 4};
  return c >= 'a' && c <= 'j' ? sizes[c - 'a'] : 3;
}

// |got - want| <= atol + rtol * |want| elementwise, same shape and dtype.
inline ::testing::AssertionResult all_close(const Tensor& got, const Tensor& want, double atol, double rtol) {
  if (got.shape() != want.shape()) {
    return ::testing::AssertionFailure() << "shape " << shape_str(got.shape()) << " vs " << shape_str(want.shape());
  }
  if (got.dtype() != want.dtype()) {
    return ::testing::AssertionFailure() << "dtype " << dtype_name(got.dtype()) << " vs " << dtype_name(want.dtype());
  }
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) {
    if (!(std::abs(g[i] - w[i]) <= atol + rtol * std::abs(w[i]))) {
      return ::testing::AssertionFailure() << "element " << i << ": " << g[i] << " vs " << w[i];
    }
  }
  return ::testing::AssertionSuccess();
}

}  // namespace qkv::einsum_test
