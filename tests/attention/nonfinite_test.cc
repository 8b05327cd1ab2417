// NaN and Inf through attention (the contract in qkv/attention.h).
//
// Against PyTorch: tests/fixtures/sdpa_nonfinite (tests/attention/
// make_sdpa_nonfinite_fixtures.py, see docs/testing.md) puts a NaN or Inf in q,
// k, v or a mask, masks whole rows, or hides keys causally, for every dtype.
// attention_reference, scaled_dot_product_attention (the fused kernel for
// f32/f16/bf16, the reference for f64) and the naive f32 kernel of the
// FlashAttention criterion must give NaN exactly where torch does,
// the same infinities, exact zeros where torch has zeros (masked rows and
// keys), and the finite values within the dtype's tolerance: the output, the
// weights and the logsumexp. Then the fused kernel across many tiles, where no
// fixture reaches, against the reference under the same rules.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <set>
#include <string>
#include <vector>

#include "attention/naive_f32.h"
#include "common/sdpa_fixtures.h"
#include "qkv/attention.h"
#include "qkv/gemm.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;
using sdpa_fixtures::Fixture;

std::vector<fs::path> fixture_files() {
  return sdpa_fixtures::fixture_files(sdpa_fixtures::fixture_dir("sdpa_nonfinite"));
}

// NaN where want is NaN and only there; equal infinities; exactly 0 where want
// is 0; elsewhere |got - want| <= tol(want, scale), scale = the largest finite |want|.
template <class Tol>
::testing::AssertionResult same_nonfinite(const char* what, const Tensor& want, const Tensor& got, Tol tol) {
  if (got.shape() != want.shape()) {
    return ::testing::AssertionFailure() << what << ": shape " << shape_str(got.shape()) << ", torch "
                                         << shape_str(want.shape());
  }
  const std::vector<double> w = want.to_vector<double>(), g = got.to_vector<double>();
  double scale = 0.0;
  for (double x : w) scale = std::isfinite(x) ? std::max(scale, std::fabs(x)) : scale;
  for (size_t i = 0; i < w.size(); ++i) {
    bool ok = false;
    if (std::isnan(w[i])) {
      ok = std::isnan(g[i]);
    } else if (std::isinf(w[i]) || w[i] == 0.0) {
      ok = g[i] == w[i];
    } else {
      ok = std::isfinite(g[i]) && std::fabs(g[i] - w[i]) <= tol(w[i], scale);
    }
    if (!ok) {
      return ::testing::AssertionFailure()
             << what << ": at " << sdpa_fixtures::index_str(want.shape(), i) << " got " << std::setprecision(17) << g[i]
             << ", torch " << w[i] << " (scale " << scale << ")";
    }
  }
  return ::testing::AssertionSuccess();
}

// Output and weights: the input dtype's rounding (f16/bf16 results are rounded to
// it) plus room for an f32 computation; f64 to 1e-12.
auto value_tol(DType dt) {
  // On native 16-bit tiles P is rounded to the dtype for P V (attention_cpu.cc):
  // |sum_j (p'_j - p_j) v_j| <= half an ulp of 1 times max|v|, given twice here.
  const double p_rounding =
      dt != DType::f32 && dt != DType::f64 && gemm_has_native(dt) ? 2.0 * sdpa_fixtures::half_ulp(dt, 1.0) : 0.0;
  return [dt, p_rounding](double w, double scale) {
    if (dt == DType::f64) return 1e-12 * scale;
    const double computed = 4e-6 * scale;
    return dt == DType::f32 ? computed : sdpa_fixtures::half_ulp(dt, w) + computed + p_rounding * scale;
  };
}

// The logsumexp is f32 (f64 for f64 inputs) whatever the input dtype.
auto lse_tol(DType dt) {
  return [dt](double w, double) { return (dt == DType::f64 ? 1e-12 : 4e-6) * (1.0 + std::fabs(w)); };
}

void expect_matches_torch(const Fixture& f, const AttentionResult& r) {
  ASSERT_TRUE(r.weights.has_value());
  ASSERT_TRUE(r.logsumexp.has_value());
  EXPECT_EQ(r.output.dtype(), f.dtype);
  EXPECT_EQ(r.logsumexp->dtype(), f.dtype == DType::f64 ? DType::f64 : DType::f32);
  EXPECT_TRUE(same_nonfinite("out", f.tensor("out"), r.output, value_tol(f.dtype)));
  EXPECT_TRUE(same_nonfinite("weights", f.tensor("weights"), *r.weights, value_tol(f.dtype)));
  EXPECT_TRUE(same_nonfinite("lse", f.tensor("lse"), *r.logsumexp, lse_tol(f.dtype)));
}

class NonFiniteTorch : public ::testing::TestWithParam<fs::path> {
 protected:
  Fixture load() const {
    Fixture f = sdpa_fixtures::load_fixture(GetParam());
    f.attention.return_logsumexp = true;
    return f;
  }
};

TEST_P(NonFiniteTorch, ReferenceMatchesTorch) {
  const Fixture f = load();
  SCOPED_TRACE(f.name + ": " + f.options.dump());
  expect_matches_torch(f, attention_reference(f.tensor("q"), f.tensor("k"), f.tensor("v"), f.attention));
}

TEST_P(NonFiniteTorch, ScaledDotProductAttentionMatchesTorch) {
  const Fixture f = load();
  SCOPED_TRACE(f.name + ": " + f.options.dump());
  expect_matches_torch(f, scaled_dot_product_attention(f.tensor("q"), f.tensor("k"), f.tensor("v"), f.attention));
}

// The naive float32 kernel (attention_cpu_test.cc's yardstick) under the same rules:
// f32 output and weights whatever the input dtype, so an f32 tolerance.
TEST_P(NonFiniteTorch, NaiveF32MatchesTorch) {
  const Fixture f = load();
  SCOPED_TRACE(f.name + ": " + f.options.dump());
  const AttentionResult r = attention::attention_naive_f32(f.tensor("q"), f.tensor("k"), f.tensor("v"), f.attention);
  ASSERT_TRUE(r.weights.has_value());
  const auto tol = [](double, double scale) { return 4e-6 * scale; };
  EXPECT_TRUE(same_nonfinite("out", f.tensor("out"), r.output, tol));
  EXPECT_TRUE(same_nonfinite("weights", f.tensor("weights"), *r.weights, tol));
}

std::string param_name(const ::testing::TestParamInfo<fs::path>& info) { return sdpa_fixtures::test_name(info.param); }

INSTANTIATE_TEST_SUITE_P(Torch, NonFiniteTorch, ::testing::ValuesIn(fixture_files()), param_name);

// A missing or emptied fixture directory fails instead of passing with no cases;
// every dtype is there, and most fixtures do have NaN in torch's output.
TEST(NonFiniteTorchFixtures, EveryDtypeAndNaNsPresent) {
  std::set<std::string> dtypes;
  int with_nan = 0, files = 0;
  for (const fs::path& path : fixture_files()) {
    const Fixture f = sdpa_fixtures::load_fixture(path);
    dtypes.insert(f.options.at("dtype").get<std::string>());
    bool nan = false;
    for (double x : f.tensor("out").to_vector<double>()) nan = nan || std::isnan(x);
    with_nan += nan;
    ++files;
  }
  EXPECT_GE(files, 80);
  EXPECT_EQ(dtypes, (std::set<std::string>{"bfloat16", "float16", "float32", "float64"}));
  EXPECT_GE(with_nan, 60);
}

// ---- the fused kernel over many tiles, against the reference -------------------------

// NaN in exactly the same elements of a and b.
::testing::AssertionResult same_nans(const char* what, const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  if (a.shape() != b.shape()) return ::testing::AssertionFailure() << what << ": shapes differ";
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i]) != std::isnan(y[i])) {
      return ::testing::AssertionFailure()
             << what << ": at " << sdpa_fixtures::index_str(a.shape(), i) << " " << x[i] << " vs " << y[i];
    }
  }
  return ::testing::AssertionSuccess();
}

Tensor with_value(const Tensor& t, const std::vector<int64_t>& index, double value) {
  Tensor c = t.clone();
  c.set_item(index, value);
  return c;
}

// One problem, f32: q [1, 2, 300, 16], k/v [1, 2, 700, 16/8], with the edits of the
// test; small tiles (AttentionOptions::tuning) make every edit land in a different tile.
struct Big {
  Tensor q = Tensor::randn({1, 2, 300, 16}, 1), k = Tensor::randn({1, 2, 700, 16}, 2);
  Tensor v = Tensor::randn({1, 2, 700, 8}, 3);
  AttentionOptions o;
  Big() { o.return_weights = o.return_logsumexp = true; }
};

void expect_fused_equals_reference_nan_pattern(const Big& in) {
  for (const FlashTiles tiles : {FlashTiles{}, FlashTiles{16, 32}, FlashTiles{64, 128}}) {
    AttentionOptions o = in.o;
    o.tuning.flash_tiles = tiles;
    const AttentionResult fused = scaled_dot_product_attention(in.q, in.k, in.v, o);
    const AttentionResult ref = attention_reference(in.q, in.k, in.v, in.o);
    ASSERT_TRUE(ref.weights && ref.logsumexp && fused.weights && fused.logsumexp);
    EXPECT_TRUE(same_nans("weights", *ref.weights, *fused.weights)) << "tiles " << tiles.br << "x" << tiles.bc;
    const auto tol = [](double, double scale) { return 1e-5 * scale; };
    EXPECT_TRUE(same_nonfinite("out", ref.output, fused.output, tol)) << "tiles " << tiles.br << "x" << tiles.bc;
    EXPECT_TRUE(same_nonfinite("lse", *ref.logsumexp, *fused.logsumexp, tol))
        << "tiles " << tiles.br << "x" << tiles.bc;
  }
}

TEST(NonFiniteFused, NaNInQKOrMaskAcrossTiles) {
  Big in;
  in.q = with_value(in.q, {0, 0, 130, 5}, NAN);                      // row 130 of head 0
  in.k = with_value(in.k, {0, 1, 650, 0}, NAN);                      // every row of head 1
  std::vector<float> mask(300 * 700, 0.0f);                          // [300, 700] float
  for (int64_t j = 0; j < 700; ++j) mask[77 * 700 + j] = -INFINITY;  // row 77: every key masked
  mask[200 * 700 + 333] = NAN;                                       // row 200 of both heads
  in.o.attn_mask = Tensor::from_vector(mask, {300, 700});
  expect_fused_equals_reference_nan_pattern(in);
  const AttentionResult r = scaled_dot_product_attention(in.q, in.k, in.v, in.o);
  EXPECT_TRUE(std::isnan(r.output.item({0, 0, 130, 0})));
  EXPECT_TRUE(std::isnan(r.output.item({0, 1, 5, 0})));
  EXPECT_TRUE(std::isnan(r.output.item({0, 0, 200, 3})));
  EXPECT_EQ(r.output.item({0, 0, 77, 0}), 0.0);
  EXPECT_EQ(r.logsumexp->item({0, 0, 77}), -INFINITY);
  EXPECT_FALSE(std::isnan(r.output.item({0, 0, 131, 0})));
}

TEST(NonFiniteFused, NonFiniteVReachesEveryRowOfItsKeyMaskedRowsIncluded) {
  Big in;
  in.v = with_value(in.v, {0, 0, 500, 2}, NAN);
  in.v = with_value(in.v, {0, 1, 10, 6}, INFINITY);
  Tensor mask = Tensor::ones({300, 700}, DType::b8);
  for (int64_t j = 0; j < 700; ++j) mask.set_item({42, j}, 0);  // row 42: every key masked
  in.o.attn_mask = mask;
  expect_fused_equals_reference_nan_pattern(in);
  const AttentionResult r = scaled_dot_product_attention(in.q, in.k, in.v, in.o);
  for (int64_t i : {0, 42, 299}) {
    EXPECT_TRUE(std::isnan(r.output.item({0, 0, i, 2}))) << i;
    // +inf times a positive weight stays +inf; times the 0 of a masked row, NaN.
    if (i == 42) {
      EXPECT_TRUE(std::isnan(r.output.item({0, 1, i, 6})));
    } else {
      EXPECT_EQ(r.output.item({0, 1, i, 6}), INFINITY) << i;
    }
  }
  EXPECT_EQ(r.output.item({0, 0, 42, 1}), 0.0);  // the masked row's finite columns stay 0
}

TEST(NonFiniteFused, CausalNaNReachesRowsAtAndAfterItsKey) {
  Big in;
  in.o.is_causal = true;
  in.k = with_value(in.k, {0, 0, 250, 3}, NAN);  // key 250: rows >= 250 are NaN, rows < 250 never see it
  in.v = with_value(in.v, {0, 1, 100, 4}, NAN);  // rows >= 100 NaN in column 4; rows < 100 unspecified
  for (const FlashTiles tiles : {FlashTiles{}, FlashTiles{16, 32}}) {
    AttentionOptions o = in.o;
    o.tuning.flash_tiles = tiles;
    const AttentionResult fused = scaled_dot_product_attention(in.q, in.k, in.v, o);
    for (int64_t i : {0, 100, 249, 250, 299}) {
      EXPECT_EQ(std::isnan(fused.output.item({0, 0, i, 0})), i >= 250) << tiles.br << "x" << tiles.bc << " row " << i;
      EXPECT_EQ(std::isnan(fused.logsumexp->item({0, 0, i})), i >= 250) << tiles.br << "x" << tiles.bc << " row " << i;
      if (i >= 100) {
        EXPECT_TRUE(std::isnan(fused.output.item({0, 1, i, 4}))) << tiles.br << "x" << tiles.bc << " row " << i;
      }
      EXPECT_FALSE(std::isnan(fused.output.item({0, 1, i, 3}))) << tiles.br << "x" << tiles.bc << " row " << i;
    }
    // A NaN row's keys after the diagonal still weigh 0.
    EXPECT_EQ(fused.weights->item({0, 0, 260, 261}), 0.0);
    EXPECT_TRUE(std::isnan(fused.weights->item({0, 0, 260, 260})));
  }
  const AttentionResult ref = attention_reference(in.q, in.k, in.v, in.o);
  ASSERT_TRUE(ref.logsumexp.has_value());
  EXPECT_TRUE(same_nans("lse", *ref.logsumexp, *scaled_dot_product_attention(in.q, in.k, in.v, in.o).logsumexp));
  EXPECT_FALSE(std::isnan(ref.output.item({0, 1, 99, 4})));  // the reference never multiplies v[100] into row 99
  EXPECT_TRUE(std::isnan(ref.output.item({0, 1, 100, 4})));
}

}  // namespace
}  // namespace qkv
