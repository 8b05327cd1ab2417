// bf16/f16 attention computed in its type (attention_cpu.cc, issue 14): the fused kernel
// on oneDNN's 16-bit tiles where this CPU has them (gemm_has_native) and on float32 tiles
// widened per tile (forced with detail::force_gemm_widening, so both paths run on every
// machine), against the float64 reference on the upcast of the same 16-bit inputs.
//   * PyTorch's criterion (tests/fixtures/sdpa_half, make_sdpa_half_fixtures.py): the
//     output's max error is at most twice PyTorch's own bf16/f16 SDPA error.
//   * Random configurations (every mask kind, GQA, causal, Lq != Lk, weights and
//     logsumexp): the error of rounding the output to the dtype (half an ulp) plus, on
//     16-bit tiles, that of rounding P to it (half an ulp of each weight, summed over
//     |v|), with a factor 2 of margin.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "attention/attention_test_configs.h"
#include "common/sdpa_fixtures.h"
#include "kernels/cpu/gemm_internal.h"
#include "qkv/attention.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"

namespace qkv {
namespace {

using test::max_abs;
using test::max_abs_diff;

// param: force the widening path (float32 tiles) even where 16-bit tiles are native.
class MixedPrecision : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override { detail::force_gemm_widening(GetParam()); }
  void TearDown() override { detail::force_gemm_widening(false); }
  // Whether this run computes on 16-bit tiles (and so rounds P) for dtype dt.
  static bool native(DType dt) { return gemm_has_native(dt); }
};

double half_ulp(DType dt) { return dt == DType::bf16 ? 0x1.0p-8 : 0x1.0p-11; }

Tensor upcast(const Tensor& t) { return t.to(DType::f64); }

TEST_P(MixedPrecision, WithinTwiceTorchsOwnHalfPrecisionError) {
  int checked = 0;
  double worst = 0.0;
  for (const auto& path : sdpa_fixtures::fixture_files(sdpa_fixtures::fixture_dir("sdpa_half"))) {
    sdpa_fixtures::Fixture f = sdpa_fixtures::load_fixture(path);
    const AttentionOptions& o = f.attention;
    f.attention.return_weights = false;
    const Tensor &q = f.tensor("q"), &k = f.tensor("k"), &v = f.tensor("v");
    const double torch_error = f.options.at("torch_error").get<double>();
    const Tensor got = scaled_dot_product_attention(q, k, v, o).output;
    ASSERT_EQ(got.dtype(), q.dtype()) << f.name;
    const Tensor want = attention_reference(upcast(q), upcast(k), upcast(v), o).output;
    const double error = max_abs_diff(got, want);
    EXPECT_LE(error, 2.0 * torch_error) << f.name << " torch " << torch_error;
    worst = std::max(worst, error / torch_error);
    ++checked;
  }
  EXPECT_EQ(checked, 16);
  std::printf("worst qkv/torch half-precision error ratio (%s tiles): %.3f\n", GetParam() ? "float32" : "native",
              worst);
}

TEST_P(MixedPrecision, RandomConfigurationsWithinRoundingBounds) {
  std::mt19937_64 rng(20261125);
  double worst = 0.0;
  for (int i = 0; i < 48; ++i) {
    test::Config c = test::random_config(rng, i);
    c.big = false;    // x1000 logits: the inputs' own rounding dominates; the fixtures cover scale
    c.dropout = 0.0;  // the dropout mask is the f32 kernel's (attention_cpu_test.cc)
    const DType dt = i % 2 ? DType::bf16 : DType::f16;
    test::Inputs in = test::make_inputs(c);
    in.options.return_weights = i % 3 == 0;
    in.options.return_logsumexp = true;
    const Tensor q = in.q.to(dt), k = in.k.to(dt), v = in.v.to(dt);
    const AttentionResult got = scaled_dot_product_attention(q, k, v, in.options);
    const AttentionResult want = attention_reference(upcast(q), upcast(k), upcast(v), in.options);
    const double v_max = max_abs(v);
    // Output rounded once to dt; P rounded to dt on 16-bit tiles: |sum (p' - p) v| <= half_ulp max|v|.
    const double bound = 2.0 * half_ulp(dt) * v_max * (native(dt) ? 2.0 : 1.0) + 0x1.0p-20 * v_max;
    const double e_out = max_abs_diff(got.output, want.output);
    EXPECT_LE(e_out, bound) << dtype_name(dt) << " " << c.str();
    worst = std::max(worst, e_out / (half_ulp(dt) * std::max(v_max, 1e-30)));
    if (got.weights) {
      EXPECT_LE(max_abs_diff(*got.weights, *want.weights), 2.0 * half_ulp(dt)) << c.str();
    }
    // logsumexp stays float32 (torch's convention for 16-bit inputs): only the f32 scores' error.
    ASSERT_TRUE(got.logsumexp.has_value());
    EXPECT_EQ(got.logsumexp->dtype(), DType::f32);
    const double lse_scale = std::max(max_abs(*want.logsumexp), 1.0);
    EXPECT_LE(max_abs_diff(*got.logsumexp, *want.logsumexp), 1e-5 * lse_scale) << c.str();
  }
  std::printf("worst output error / (half ulp x max|v|) (%s tiles): %.3f\n", GetParam() ? "float32" : "as dispatched",
              worst);
}

INSTANTIATE_TEST_SUITE_P(Paths, MixedPrecision, ::testing::Values(false, true),
                         [](const auto& param) { return std::string(param.param ? "Float32Tiles" : "AsDispatched"); });

TEST(MixedPrecisionFloat32Tiles, AreTheF32KernelOnTheUpcastInputs) {
  // On float32 tiles nothing is rounded but the output: the result is the f32 kernel's
  // on the upcast inputs, rounded to the dtype (same tiles, same summation order): with each
  // head's K and V widened once per worker (the automatic budget: workers then take whole
  // entries, and at the end the row tiles others left) and tile by tile (budget 0), on 1, 2
  // and 4 workers (6 entries of 3 row tiles or more: every worker helps at the end on 4).
  detail::force_gemm_widening(true);
  const int threads = get_num_threads();
  for (DType dt : {DType::bf16, DType::f16}) {
    const Tensor q = Tensor::randn({2, 3, 300, 40}, 1).to(dt), k = Tensor::randn({2, 3, 330, 40}, 2).to(dt),
                 v = Tensor::randn({2, 3, 330, 24}, 3).to(dt);
    for (bool causal : {true, false}) {
      AttentionOptions o;
      o.is_causal = causal;
      for (int workers : {1, 2, 4}) {
        set_num_threads(workers);  // the f32 call too: items whose keys are cut into parts depend on the workers
        o.tuning.widen_head_bytes = -1;
        const Tensor f32 =
            scaled_dot_product_attention(q.to(DType::f32), k.to(DType::f32), v.to(DType::f32), o).output.to(dt);
        for (int64_t budget : {int64_t{-1}, int64_t{0}}) {
          o.tuning.widen_head_bytes = budget;
          const Tensor got = scaled_dot_product_attention(q, k, v, o).output;
          EXPECT_EQ(max_abs_diff(got, f32), 0.0)
              << dtype_name(dt) << " causal " << causal << " workers " << workers << " budget " << budget;
        }
      }
      set_num_threads(threads);
    }
  }
  detail::force_gemm_widening(false);
  AttentionOptions bad;
  bad.tuning.widen_head_bytes = -2;
  const Tensor x = Tensor::randn({1, 4, 8}, 4);
  EXPECT_THROW((void)scaled_dot_product_attention(x, x, x, bad), ValueError);
}

TEST(MixedPrecisionFloat32Tiles, OverwrittenInputsAndNestedCallsEqualFreshCalls) {
  // A worker widens an entry's K and V once and keeps them while its items read the same
  // rows (widen_head), and 16-bit outputs are rounded item by item into the output: a call on
  // new values at the same address (k and v overwritten in place), calls of other sizes in
  // between, and calls nested in parallel_for all equal a call on fresh copies.
  detail::force_gemm_widening(true);
  const Tensor q = Tensor::randn({1, 4, 300, 32}, 1).to(DType::bf16);
  const Tensor k = Tensor::randn({1, 4, 300, 32}, 2).to(DType::bf16),
               v = Tensor::randn({1, 4, 300, 32}, 3).to(DType::bf16);
  const Tensor k2 = Tensor::randn({1, 4, 300, 32}, 4).to(DType::bf16),
               v2 = Tensor::randn({1, 4, 300, 32}, 5).to(DType::bf16);
  const Tensor small = Tensor::randn({2, 3, 70, 16}, 6).to(DType::bf16);
  AttentionOptions o;
  o.is_causal = true;
  const Tensor first = scaled_dot_product_attention(q, k, v, o).output;
  const Tensor want2 = scaled_dot_product_attention(q, k2.clone(), v2.clone(), o).output;
  const Tensor want_small = scaled_dot_product_attention(small, small.clone(), small.clone(), o).output;
  k.copy_from(k2), v.copy_from(v2);  // the same buffers, new values
  EXPECT_EQ(max_abs_diff(scaled_dot_product_attention(q, k, v, o).output, want2), 0.0);
  EXPECT_EQ(max_abs_diff(scaled_dot_product_attention(small, small, small, o).output, want_small), 0.0);
  std::vector<Tensor> nested(4);
  parallel_for(0, 4, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      nested[static_cast<size_t>(i)] = i % 2 == 0 ? scaled_dot_product_attention(q, k, v, o).output
                                                  : scaled_dot_product_attention(small, small, small, o).output;
    }
  });
  for (size_t i = 0; i < nested.size(); ++i) {
    EXPECT_EQ(max_abs_diff(nested[i], i % 2 == 0 ? want2 : want_small), 0.0) << "nested call " << i;
  }
  EXPECT_GT(max_abs_diff(first, want2), 0.0);  // the overwrite changed the problem
  detail::force_gemm_widening(false);
}

TEST(MatmulPrecision, MediumIsTheBf16KernelOnF32InputsWhereNative) {
  // "medium" rounds Q, K, V tiles to bf16 exactly as converting the inputs first would (round
  // to nearest even), and P as the bf16 path does; only the output stays float32. So it
  // equals the bf16 kernel on the rounded inputs up to that kernel's output rounding (half an
  // ulp of max|v|), and it differs from exact f32. Without native bf16 it is exact f32.
  const Tensor q = Tensor::randn({2, 4, 100, 64}, 1), k = Tensor::randn({2, 4, 150, 64}, 2),
               v = Tensor::randn({2, 4, 150, 48}, 3);
  AttentionOptions o;
  o.is_causal = true;
  const Tensor exact = scaled_dot_product_attention(q, k, v, o).output;
  const Tensor ref = attention_reference(q, k, v, o).output;
  o.matmul_precision = MatmulPrecision::medium;
  for (bool widen : {false, true}) {
    detail::force_gemm_widening(widen);
    const Tensor medium = scaled_dot_product_attention(q, k, v, o).output;
    EXPECT_EQ(medium.dtype(), DType::f32);
    if (gemm_has_native(DType::bf16)) {
      const Tensor bf16 =
          scaled_dot_product_attention(q.to(DType::bf16), k.to(DType::bf16), v.to(DType::bf16), o).output;
      EXPECT_LE(max_abs_diff(medium, bf16.to(DType::f32)), half_ulp(DType::bf16) * max_abs(v));
      EXPECT_GT(max_abs_diff(medium, exact), 0.0);
      std::printf("matmul_precision=medium: max error vs float64 %.3e (exact f32 %.3e), max|v| %.2f\n",
                  max_abs_diff(medium, ref), max_abs_diff(exact, ref), max_abs(v));
    } else {
      EXPECT_EQ(max_abs_diff(medium, exact), 0.0);
    }
  }
  detail::force_gemm_widening(false);
}

TEST(MatmulPrecision, NamesRoundTripAndUnknownOnesAreValueErrors) {
  for (MatmulPrecision p : {MatmulPrecision::highest, MatmulPrecision::high, MatmulPrecision::medium}) {
    EXPECT_EQ(matmul_precision_from_name(matmul_precision_name(p)), p);
  }
  EXPECT_THROW(matmul_precision_from_name("low"), ValueError);
  const Tensor q = Tensor::randn({1, 8, 16}, 1);
  AttentionOptions o;
  o.matmul_precision = MatmulPrecision::high;  // exact f32 on CPUs
  EXPECT_EQ(max_abs_diff(scaled_dot_product_attention(q, q, q, o).output, scaled_dot_product_attention(q, q, q).output),
            0.0);
}

}  // namespace
}  // namespace qkv
