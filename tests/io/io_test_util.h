// Shared helpers of the tests/io tests: fixture paths, the fixture value formula
// (mirrors tests/io/make_io_fixtures.py) and byte-building helpers.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "common/expect.h"
#include "qkv/io.h"
#include "qkv/tensor.h"

namespace qkv::io::testing {

// Keras MultiHeadAttention's weights in get_weights() order, as TensorFlow writes them:
// spelled out here, not taken from qkv (kKerasMhaWeightNames is what the tests check).
inline const std::vector<std::string> kKerasMhaWeightsAsTfWrites = {"query/kernel",
                                                                    "query/bias",
                                                                    "key/kernel",
                                                                    "key/bias",
                                                                    "value/kernel",
                                                                    "value/bias",
                                                                    "attention_output/kernel",
                                                                    "attention_output/bias"};

inline std::filesystem::path fixture(const std::string& name) {
  return std::filesystem::path(QKV_SOURCE_DIR) / "tests" / "fixtures" / "io" / name;
}

// tests/fixtures/<dir>/<name>.
inline std::filesystem::path fixture(const std::string& dir, const std::string& name) {
  return std::filesystem::path(QKV_SOURCE_DIR) / "tests" / "fixtures" / dir / name;
}

// Same dtype, shape and every value (compared as doubles, exactly).
inline void expect_same_values(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], w[i]) << what << " element " << i;
}

inline std::vector<std::byte> read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> out(chars.size());
  if (!chars.empty()) std::memcpy(out.data(), chars.data(), chars.size());
  return out;
}

inline std::vector<std::byte> to_bytes(const std::string& s) {
  std::vector<std::byte> out(s.size());
  if (!s.empty()) std::memcpy(out.data(), s.data(), s.size());
  return out;
}

inline std::string to_string(const std::vector<std::byte>& b) {
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

// A fresh path in the test temp dir (unique per call).
inline std::filesystem::path temp_path(const std::string& name) {
  static std::atomic<int> counter{0};
  const auto dir = std::filesystem::path(::testing::TempDir()) /
                   ("qkv_io_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  std::filesystem::create_directories(dir);
  return dir / name;
}

// The value of element `i` (row-major flat index) in the fixtures.
inline double expected_value(DType dtype, int64_t i) {
  switch (dtype) {
    case DType::i8: return static_cast<double>(i - 3);
    case DType::i32: return static_cast<double>(i * 100000 - 7);
    case DType::i64: return static_cast<double>(i * (int64_t{1} << 40) - 7);
    case DType::b8: return i % 3 == 0 ? 1.0 : 0.0;
    default: return static_cast<double>(i) * 0.5 - 1.0;
  }
}

// The raw little-endian bytes of the first n f32 fixture values.
inline std::string f32_data(int n) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    const float v = static_cast<float>(expected_value(DType::f32, i));
    s.append(reinterpret_cast<const char*>(&v), 4);
  }
  return s;
}

// A contiguous tensor holding the fixture values.
inline Tensor formula_tensor(DType dtype, const Shape& shape) {
  std::vector<double> values(static_cast<size_t>(shape_numel(shape)));
  for (size_t i = 0; i < values.size(); ++i) values[i] = expected_value(dtype, static_cast<int64_t>(i));
  return Tensor::from_vector(values, shape).to(dtype);
}

// Checks every element of `t` (any strides) against the fixture formula.
inline void expect_formula(const Tensor& t, DType dtype, const Shape& shape) {
  ASSERT_EQ(t.dtype(), dtype);
  ASSERT_EQ(t.shape(), shape);
  const std::vector<double> got = t.to_vector<double>();
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], expected_value(dtype, static_cast<int64_t>(i))) << "element " << i << " of " << dtype_name(dtype);
  }
}

inline const std::vector<std::pair<std::string, DType>>& fixture_dtypes() {
  static const std::vector<std::pair<std::string, DType>> kAll = {
      {"f32", DType::f32}, {"f64", DType::f64}, {"f16", DType::f16}, {"bf16", DType::bf16},
      {"i8", DType::i8},   {"i32", DType::i32}, {"i64", DType::i64}, {"bool", DType::b8}};
  return kAll;
}

}  // namespace qkv::io::testing
