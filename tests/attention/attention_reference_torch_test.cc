// qkv::attention_reference against PyTorch's scaled_dot_product_attention.
//
// The fixtures (tests/fixtures/sdpa/*.safetensors) come from
// tests/attention/make_sdpa_fixtures.py; see docs/testing.md. Each holds q, k,
// v, an optional attn_mask, torch's float64 output `out` and float64 attention
// `weights` computed from the stored inputs, and the options as JSON in
// __metadata__["options"].
//
// Tolerances, by input dtype (scale = largest |expected| of the tensor):
//   float64           |got - want| <= 1e-10 * scale
//   float32           |got - want| <= 1e-6 * scale (an f32 result)
//   float16/bfloat16  |got - want| <= half an ulp of the dtype at |want|
//                     + 1e-6 * scale (room for an f32 internal computation)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <iomanip>
#include <stdexcept>
#include <string>
#include <system_error>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/sdpa_fixtures.h"
#include "qkv/attention.h"
#include "qkv/io.h"
#include "qkv/tensor.h"

namespace {

namespace fs = std::filesystem;
using qkv::DType;
using qkv::Tensor;
using qkv::sdpa_fixtures::Fixture;
using qkv::sdpa_fixtures::half_ulp;
using qkv::sdpa_fixtures::index_str;
using qkv::sdpa_fixtures::load_fixture;
using qkv::sdpa_fixtures::test_name;

fs::path fixture_dir() { return qkv::sdpa_fixtures::fixture_dir("sdpa"); }
std::vector<fs::path> fixture_files() { return qkv::sdpa_fixtures::fixture_files(fixture_dir()); }

// Compares `got` with torch's float64 `want` under the input dtype's tolerance.
::testing::AssertionResult matches(const char* what, const Tensor& want, const Tensor& got, DType input_dtype) {
  if (got.shape() != want.shape()) {
    return ::testing::AssertionFailure() << what << ": shape " << qkv::shape_str(got.shape()) << ", torch "
                                         << qkv::shape_str(want.shape());
  }
  const std::vector<double> w = want.to_vector<double>();
  const std::vector<double> g = got.to_vector<double>();
  double scale = 0.0;
  for (double x : w) scale = std::max(scale, std::fabs(x));
  size_t worst = 0;
  double worst_excess = -1.0, worst_err = 0.0, worst_tol = 0.0, max_err = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    double tol = 0.0;
    switch (input_dtype) {
      case DType::f64: tol = 1e-10 * scale; break;
      case DType::f32: tol = 1e-6 * scale; break;
      default: tol = half_ulp(input_dtype, w[i]) + 1e-6 * scale; break;
    }
    const double err = std::fabs(g[i] - w[i]);
    const double excess = std::isnan(err) ? INFINITY : err - tol;
    max_err = std::max(max_err, std::isnan(err) ? INFINITY : err);
    if (excess > worst_excess) {
      worst_excess = excess;
      worst = i;
      worst_err = err;
      worst_tol = tol;
    }
  }
  if (worst_excess > 0.0) {
    return ::testing::AssertionFailure() << what << ": at " << index_str(want.shape(), worst) << " got "
                                         << std::setprecision(17) << g[worst] << ", torch " << w[worst] << " (|err| "
                                         << worst_err << " > tol " << worst_tol << "; max |err| " << max_err
                                         << ", scale " << scale << ")";
  }
  return ::testing::AssertionSuccess() << what << ": max |err| " << max_err << " (scale " << scale << ")";
}

class ReferenceTorchTest : public ::testing::TestWithParam<fs::path> {};

TEST_P(ReferenceTorchTest, MatchesTorch) {
  const Fixture f = load_fixture(GetParam());
  SCOPED_TRACE(f.name + ": " + f.options.dump());
  ASSERT_EQ(f.attention.dropout_p, 0.0) << "dropout cannot be compared with torch's RNG";
  const Tensor& q = f.tensor("q");
  const Tensor& k = f.tensor("k");
  const Tensor& v = f.tensor("v");
  ASSERT_EQ(q.dtype(), f.dtype);
  ASSERT_EQ(k.dtype(), f.dtype);
  ASSERT_EQ(v.dtype(), f.dtype);

  const qkv::AttentionResult r = qkv::attention_reference(q, k, v, f.attention);
  EXPECT_EQ(r.output.dtype(), f.dtype) << "output must have q's dtype";
  ASSERT_TRUE(r.weights.has_value()) << "return_weights = true gave no weights";

  const ::testing::AssertionResult out_ok = matches("out", f.tensor("out"), r.output, f.dtype);
  const ::testing::AssertionResult weights_ok = matches("weights", f.tensor("weights"), *r.weights, f.dtype);
  EXPECT_TRUE(out_ok);
  EXPECT_TRUE(weights_ok);
  RecordProperty("out", out_ok.message());
  RecordProperty("weights", weights_ok.message());
}

std::string param_name(const ::testing::TestParamInfo<fs::path>& info) { return test_name(info.param); }

INSTANTIATE_TEST_SUITE_P(Torch, ReferenceTorchTest, ::testing::ValuesIn(fixture_files()), param_name);

// A missing or emptied fixture directory must fail, not pass with no cases.
TEST(ReferenceTorchFixtures, AtLeastThirty) {
  EXPECT_GE(fixture_files().size(), 30u) << "fixtures in " << fixture_dir() << " (regenerate with `make fixtures`)";
}

// Rows whose every key is masked (bool False / float -inf everywhere) give
// weights and output of exactly 0, as torch >= 2.5 (_safe_softmax) does.
TEST(ReferenceTorchFixtures, FullyMaskedRowsAreExactlyZero) {
  int64_t masked_rows = 0;
  for (const fs::path& path : fixture_files()) {
    const Fixture f = load_fixture(path);
    SCOPED_TRACE(f.name);
    const Tensor& want_w = f.tensor("weights");
    const Tensor& want_out = f.tensor("out");
    const int64_t lk = want_w.size(-1), dv = want_out.size(-1);
    const int64_t rows = lk == 0 ? 0 : want_w.numel() / lk;
    const std::vector<double> ww = want_w.to_vector<double>();
    const std::vector<double> wo = want_out.to_vector<double>();
    std::vector<int64_t> dead;
    for (int64_t r = 0; r < rows; ++r) {
      bool all_zero = true;
      for (int64_t j = 0; j < lk && all_zero; ++j) all_zero = ww[static_cast<size_t>(r * lk + j)] == 0.0;
      if (!all_zero) continue;
      dead.push_back(r);
      for (int64_t d = 0; d < dv; ++d) {
        ASSERT_EQ(wo[static_cast<size_t>(r * dv + d)], 0.0) << "torch's output is not 0 on masked row " << r;
      }
    }
    if (dead.empty()) continue;
    masked_rows += static_cast<int64_t>(dead.size());
    const qkv::AttentionResult res = qkv::attention_reference(f.tensor("q"), f.tensor("k"), f.tensor("v"), f.attention);
    ASSERT_TRUE(res.weights.has_value());
    ASSERT_EQ(res.output.shape(), want_out.shape());
    ASSERT_EQ(res.weights->shape(), want_w.shape());
    const std::vector<double> go = res.output.to_vector<double>();
    const std::vector<double> gw = res.weights->to_vector<double>();
    for (int64_t r : dead) {
      for (int64_t j = 0; j < lk; ++j) {
        // Bitwise 0.0 (not NaN, not a tiny value); -0.0 compares equal and is accepted.
        EXPECT_EQ(gw[static_cast<size_t>(r * lk + j)], 0.0) << "weights row " << r << " key " << j;
      }
      for (int64_t d = 0; d < dv; ++d) {
        EXPECT_EQ(go[static_cast<size_t>(r * dv + d)], 0.0) << "output row " << r << " column " << d;
      }
    }
  }
  EXPECT_GT(masked_rows, 0) << "no fixture has a fully masked row";
}

}  // namespace
