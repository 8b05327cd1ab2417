// Linear::quantize_dynamic and MultiheadAttention::quantize_dynamic (int8): against a
// float64 model of the same quantization written here from its definition (per-channel
// weight scales, per-token activation scales, round half to even, exact integer dot
// products), and against the float32 layers (the error quantization costs). Linear's
// quantize_static against the same model with the calibrated activation scale (clipped).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "common/expect.h"
#include "common/relative_error.h"
#include "kernels/cpu/gemm_internal.h"
#include "qkv/gemm.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/mha.h"

namespace qkv::nn {
namespace {

// Symmetric int8 of one row, in double: scale = max|x| / qmax (127; 63 for 7-bit weights),
// q = round half even.
std::vector<double> quantized_row(const float* x, int64_t n, double& scale, float qmax = 127.0f) {
  double amax = 0.0;
  for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(static_cast<double>(x[i])));
  scale = amax > 0.0 ? static_cast<double>(static_cast<float>(amax) / qmax) : 1.0;
  std::vector<double> q(static_cast<size_t>(n));
  const float inv = 1.0f / static_cast<float>(scale);
  for (int64_t i = 0; i < n; ++i) q[static_cast<size_t>(i)] = std::nearbyint(std::clamp(x[i] * inv, -qmax, qmax));
  return q;
}

using qkv::testing::max_relative_error;

// ||got - want|| / ||want|| (Frobenius): the relative error issue 14 bounds by 1e-2.
double norm_rel(const Tensor& got, const Tensor& want) {
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < w.size(); ++i) {
    err += (g[i] - w[i]) * (g[i] - w[i]);
    norm += w[i] * w[i];
  }
  return std::sqrt(err / std::max(norm, 1e-300));
}

// quantize_dynamic(bits) against the definition, every output element.
void expect_definition(int bits) {
  const int64_t in = 96, out = 40, rows = 33;
  const float qmax = bits == 7 ? 63.0f : 127.0f;
  const Tensor w = Tensor::randn({out, in}, 1), b = Tensor::randn({out}, 2);
  Tensor x = Tensor::randn({3, 11, in}, 3);
  std::vector<float> xv = x.to_vector<float>();
  std::fill(xv.begin() + 5 * in, xv.begin() + 6 * in, 0.0f);  // an all-zero token
  x = Tensor::from_vector(xv, {3, 11, in});
  const Linear q = Linear::torch(w, b).quantize_dynamic(bits);
  ASSERT_TRUE(q.quantized());
  EXPECT_EQ(q.weight_bits(), bits);
  EXPECT_EQ(q.quantized_weight().dtype(), DType::i8);
  EXPECT_EQ(q.weight_scales().shape(), (Shape{out}));
  const std::vector<int8_t> qw8 = q.quantized_weight().to_vector<int8_t>();
  EXPECT_EQ(*std::max_element(qw8.begin(), qw8.end()), static_cast<int8_t>(qmax));  // each row's max hits it
  const Tensor y = q.forward(x);                                                    // [3, 11, out]
  const std::vector<float> wv = w.to_vector<float>(), bv = b.to_vector<float>(), yv = y.to_vector<float>();
  for (int64_t m = 0; m < rows; ++m) {
    double sx = 0.0;
    const std::vector<double> qx = quantized_row(xv.data() + m * in, in, sx);
    for (int64_t n = 0; n < out; ++n) {
      double sw = 0.0;
      const std::vector<double> qw = quantized_row(wv.data() + n * in, in, sw, qmax);
      double acc = 0.0;
      for (int64_t i = 0; i < in; ++i) acc += qx[static_cast<size_t>(i)] * qw[static_cast<size_t>(i)];
      const double want = acc * sx * sw + bv[static_cast<size_t>(n)];
      EXPECT_NEAR(yv[static_cast<size_t>(m * out + n)], want, 1e-5 * (std::fabs(want) + 1.0)) << m << " " << n;
    }
  }
  // The zero token gives exactly the bias.
  for (int64_t n = 0; n < out; ++n) EXPECT_EQ(yv[static_cast<size_t>(5 * out + n)], bv[static_cast<size_t>(n)]);
  // Against float32: int8 costs ~1e-2 of the output's scale at most (7-bit weights: ~2e-2).
  const double rel = max_relative_error(y, Linear::torch(w, b).forward(x));
  EXPECT_LT(rel, bits == 7 ? 4e-2 : 2e-2);
  EXPECT_GT(rel, 0.0);
}

TEST(LinearQuantized, MatchesTheDefinitionInFloat64) { expect_definition(8); }

TEST(LinearQuantized, SevenBitWeightsMatchTheDefinitionWithoutTheFloat32Path) {
  // 7-bit weights run on oneDNN's int8 kernel on every CPU, with or without VNNI (the ctest
  // avx2.machine runs this under ONEDNN_MAX_CPU_ISA=AVX2): never on the float32-chunk path.
  const int64_t widened = detail::gemm_int8_widened_runs();
  expect_definition(7);
  detail::force_gemm_int8_widening(true);  // as a CPU without VNNI
  expect_definition(7);
  detail::force_gemm_int8_widening(false);
  EXPECT_EQ(detail::gemm_int8_widened_runs(), widened);
  // 8-bit weights there take the exact float32 path.
  detail::force_gemm_int8_widening(true);
  expect_definition(8);
  detail::force_gemm_int8_widening(false);
  EXPECT_GT(detail::gemm_int8_widened_runs(), widened);
}

TEST(LinearQuantized, WeightBitsFollowTheCpu) {
  const Linear f = Linear::torch(Tensor::randn({8, 16}, 1), std::nullopt);
  EXPECT_EQ(f.quantize_dynamic().weight_bits(), gemm_int8_full_range() ? 8 : 7);
  EXPECT_EQ(int8_weight_bits(0, "test"), gemm_int8_full_range() ? 8 : 7);
  detail::force_gemm_int8_widening(true);  // as a CPU without VNNI
  EXPECT_FALSE(gemm_int8_full_range());
  EXPECT_EQ(f.quantize_dynamic().weight_bits(), 7);
  EXPECT_EQ(f.quantize_static(0.5f).weight_bits(), 7);
  EXPECT_EQ(f.quantize_dynamic(8).weight_bits(), 8);
  detail::force_gemm_int8_widening(false);
  EXPECT_EQ(f.quantize_dynamic(7).weight_bits(), 7);
  // A quantized layer asked for the other bits quantizes its float32 weight again.
  const Linear q7 = f.quantize_dynamic(7), q8 = q7.quantize_dynamic(8);
  EXPECT_EQ(q8.weight_bits(), 8);
  EXPECT_EQ(q8.quantized_weight().to_vector<int8_t>(), f.quantize_dynamic(8).quantized_weight().to_vector<int8_t>());
  EXPECT_EQ(q7.quantize_dynamic(7).quantized_weight().data<int8_t>(), q7.quantized_weight().data<int8_t>());
  for (int bad : {-1, 1, 6, 9, 16}) EXPECT_THROW((void)f.quantize_dynamic(bad), ValueError) << bad;
  EXPECT_THROW((void)f.weight_bits(), ValueError);
}

TEST(LinearQuantized, LayoutsAndErrors) {
  const Tensor kernel = Tensor::randn({16, 2, 4}, 4);  // Keras EinsumDense [in, heads, key_dim]
  const Linear f = Linear::keras(kernel, std::nullopt);
  const Linear q = f.quantize_dynamic();
  const Tensor x = Tensor::randn({5, 16}, 5);
  EXPECT_LT(max_relative_error(q.forward(x), f.forward(x)), 2e-2);
  EXPECT_THROW((void)f.quantized_weight(), ValueError);
  EXPECT_THROW((void)q.forward(Tensor::randn({5, 15}, 6)), ShapeError);
}

// Relative error ||int8 - f32|| / ||f32|| of quantize_dynamic(bits) below `bound`, and the
// largest element error below `bound_max` of the output's largest magnitude.
void expect_mha_error(int bits, double bound, double bound_max) {
  MultiheadAttentionConfig c;
  c.embed_dim = 96, c.num_heads = 4, c.batch_first = true;
  const MultiheadAttention f(c, 7);
  const MultiheadAttention q = quantize_dynamic(f, bits);
  EXPECT_TRUE(q.quantized());
  EXPECT_FALSE(f.quantized());
  EXPECT_EQ(q.weight_bits(), bits);
  const Tensor x = Tensor::randn({2, 64, 96}, 8), kv = Tensor::randn({2, 80, 96}, 9);
  MultiheadAttentionOptions o;
  o.need_weights = false;
  double worst = 0.0, worst_max = 0.0;
  for (bool self : {true, false}) {
    const Tensor& k = self ? x : kv;
    const Tensor yq = q.forward(x, k, k, o).output, yf = f.forward(x, k, k, o).output;
    const double rel = norm_rel(yq, yf), rel_max = max_relative_error(yq, yf);
    EXPECT_LT(rel, bound) << "self " << self;
    EXPECT_LT(rel_max, bound_max) << "self " << self;
    worst = std::max(worst, rel), worst_max = std::max(worst_max, rel_max);
  }
  std::printf(
      "int8 MultiheadAttention (%d-bit weights) vs f32: relative error %.2e (largest element error / max|y| "
      "%.2e)\n",
      bits, worst, worst_max);
  // load_state_dict re-quantizes the new weights, with the same bits.
  MultiheadAttention q2 = q;
  q2.load_state_dict(MultiheadAttention(c, 11).state_dict());
  EXPECT_TRUE(q2.quantized());
  EXPECT_EQ(q2.weight_bits(), bits);
  EXPECT_LT(norm_rel(q2.forward(x, x, x, o).output, MultiheadAttention(c, 11).forward(x, x, x, o).output), bound);
}

TEST(MultiheadAttentionQuantized, StaysWithinTwoPercentOfFloat32) {
  // Measured 1.1-1.4% on these random (untrained) weights and inputs, against 3.2-3.5% for
  // torch.ao's quantize_dynamic on the same weights (bench/peers/quant_peers.py); issue 14
  // asks <= 1e-2, which random weights miss. Bounds here: 2e-2, and 3% for the largest element.
  expect_mha_error(8, 2e-2, 3e-2);
}

TEST(MultiheadAttentionQuantized, SevenBitWeightsStayWithinThreePercentOfFloat32) {
  // 7-bit weights double the weights' rounding error (the activations' stays): measured
  // 1.78e-2 (largest element 1.68e-2) here, against 1.29e-2 with 8-bit weights.
  expect_mha_error(7, 3e-2, 4e-2);
}

TEST(ActivationObserver, MinMaxAndPercentileScales) {
  std::vector<float> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * static_cast<float>(i + 1);  // |x| = 1..1000
  ActivationObserver mm;
  mm.observe(Tensor::from_vector(std::vector<float>(x.begin(), x.begin() + 500), {500}));
  mm.observe(Tensor::from_vector(std::vector<float>(x.begin() + 500, x.end()), {5, 100}));
  EXPECT_EQ(mm.count(), 1000);
  EXPECT_FLOAT_EQ(mm.scale(), 1000.0f / 127.0f);
  ActivationObserver pct(ActivationObserver::Kind::percentile, 99.0);
  pct.observe(Tensor::from_vector(x, {1000}));
  EXPECT_FLOAT_EQ(pct.scale(), 990.0f / 127.0f);                 // the 990th smallest |x| of 1000
  EXPECT_THROW((void)ActivationObserver().scale(), ValueError);  // nothing observed
  EXPECT_THROW(ActivationObserver(ActivationObserver::Kind::percentile, 0.0), ValueError);
}

TEST(LinearQuantized, StaticScaleClipsAndEqualsDynamicAtTheRowsOwnScale) {
  const Tensor w = Tensor::randn({24, 32}, 1), x = Tensor::randn({1, 32}, 2);
  const Linear f = Linear::torch(w, std::nullopt);
  const auto xv = x.to_vector<float>();
  float amax = 0.0f;
  for (float e : xv) amax = std::max(amax, std::fabs(e));
  // One token whose own max is the static range: the same arithmetic as dynamic.
  EXPECT_EQ(f.quantize_static(amax / 127.0f).forward(x).to_vector<float>(),
            f.quantize_dynamic().forward(x).to_vector<float>());
  // Half the range: the larger half of x clips to +-127, so the result is no longer close.
  EXPECT_GT(norm_rel(f.quantize_static(amax / 254.0f).forward(x), f.forward(x)), 5e-2);
  EXPECT_THROW((void)f.quantize_static(0.0f), ValueError);
}

// quantize_static(s, bits) against its definition in float64, every output element: each
// activation q = clamp(round_half_even(x / s), -127, 127) at the calibrated scale s whatever
// the token's own range (computed here in double from x / s, not as the layer does it), the
// weights per output channel as quantize_dynamic's (quantized_row, above), exact integer dot
// products, y = acc * s * sw + b. Rows of 200 and 33 tokens: the blocked path (where the CPU
// has VNNI) and one GEMM; 8-bit and 7-bit weights (gemm_int8_narrow_b).
void expect_static_definition(int bits, int64_t rows) {
  const int64_t in = 96, out = 40;
  const float s = 1.5f / 127.0f;  // a calibrated range of 1.5: ~13% of the N(0, 1) inputs clip
  const Tensor w = Tensor::randn({out, in}, 11), b = Tensor::randn({out}, 12);
  std::vector<float> xv = Tensor::randn({rows, in}, 13).to_vector<float>();
  for (int64_t i = 0; i < in; ++i) xv[static_cast<size_t>(2 * in + i)] *= 0.01f;  // a token far below the range
  const Linear q = Linear::torch(w, b).quantize_static(s, bits);
  ASSERT_EQ(q.weight_bits(), bits);
  const std::vector<float> yv = q.forward(Tensor::from_vector(xv, {rows, in})).to_vector<float>();
  const std::vector<float> wv = w.to_vector<float>(), bv = b.to_vector<float>();
  std::vector<std::vector<double>> qw(static_cast<size_t>(out));
  std::vector<double> sw(static_cast<size_t>(out));
  for (int64_t n = 0; n < out; ++n) {
    qw[static_cast<size_t>(n)] = quantized_row(wv.data() + n * in, in, sw[static_cast<size_t>(n)], bits == 7 ? 63.0f : 127.0f);
  }
  int64_t clipped = 0, near_ties = 0;
  for (int64_t m = 0; m < rows; ++m) {
    // The layer computes x * (1 / s) in float32: two roundings, at most 2^-23 of |x / s| <= 127
    // (1.6e-5) from x / s. Within 2e-5 of a half-integer it may round the other way; each such
    // element i widens the tolerance by the one step it can move y: s sw |qw_i| (one of 19,200
    // at these seeds, printed below). Elsewhere q is the definition's exactly.
    std::vector<double> qx(static_cast<size_t>(in)), tie(static_cast<size_t>(in), 0.0);
    for (int64_t i = 0; i < in; ++i) {
      const double r = static_cast<double>(xv[static_cast<size_t>(m * in + i)]) / static_cast<double>(s);
      const double c = std::clamp(r, -127.0, 127.0);
      qx[static_cast<size_t>(i)] = std::nearbyint(c);  // round half to even (the default mode)
      clipped += c != r;
      tie[static_cast<size_t>(i)] = std::fabs(c - std::floor(c) - 0.5) < 2e-5 ? 1.0 : 0.0;
      near_ties += tie[static_cast<size_t>(i)] != 0.0;
    }
    for (int64_t n = 0; n < out; ++n) {
      const std::vector<double>& qn = qw[static_cast<size_t>(n)];
      double acc = 0.0, slack = 0.0;
      for (int64_t i = 0; i < in; ++i) {
        acc += qx[static_cast<size_t>(i)] * qn[static_cast<size_t>(i)];
        slack += tie[static_cast<size_t>(i)] * std::fabs(qn[static_cast<size_t>(i)]);
      }
      const double scale = static_cast<double>(s) * sw[static_cast<size_t>(n)], bias = bv[static_cast<size_t>(n)];
      const double want = acc * scale + bias;
      // The layer's epilogue, float(acc) (exact: |acc| <= 127 * 127 * 96 < 2^24) * float(s * sw)
      // + b, rounds three times, each by at most 2^-24 of |acc s sw| + |b|: 1e-6 of that covers it.
      const double tol = 1e-6 * (std::fabs(acc * scale) + std::fabs(bias)) + slack * scale;
      EXPECT_NEAR(yv[static_cast<size_t>(m * out + n)], want, tol) << "token " << m << " channel " << n;
    }
  }
  EXPECT_GT(clipped, rows * in / 20);  // the clip is exercised: ~13% expected
  std::printf("static int8 Linear (%d-bit weights, %lld tokens): %lld of %lld activations clipped, %lld near a tie\n",
              bits, static_cast<long long>(rows), static_cast<long long>(clipped),
              static_cast<long long>(rows * in), static_cast<long long>(near_ties));
}

TEST(LinearQuantized, StaticMatchesTheDefinitionInFloat64) {
  for (int bits : {8, 7}) {
    for (int64_t rows : {200, 33}) {
      SCOPED_TRACE(std::to_string(bits) + "-bit weights, " + std::to_string(rows) + " tokens");
      expect_static_definition(bits, rows);
    }
  }
}

// A NaN or an inf in a token row makes that row's outputs NaN, as float arithmetic does (the
// float32 layer's row is inf / NaN there); the scale of 1 used for such rows gave finite numbers.
// Other rows are unchanged, and a NaN weight makes its output channel NaN. Rows of 200 and 40
// tokens: the blocked path (>= 2 blocks of 64 per thread where the CPU has VNNI) and one GEMM.
TEST(LinearQuantized, NonFiniteInputsGiveNaNRowsNotFiniteNumbers) {
  for (int64_t rows : {200, 40}) {
    const Tensor w = Tensor::randn({24, 32}, 3), b = Tensor::randn({24}, 4);
    std::vector<float> xv = Tensor::randn({rows, 32}, 5).to_vector<float>();
    const Linear f = Linear::torch(w, b);
    const std::vector<Linear> layers = {f.quantize_dynamic(8), f.quantize_dynamic(7), f.quantize_static(0.03f)};
    std::vector<std::vector<float>> clean;
    for (const Linear& l : layers) clean.push_back(l.forward(Tensor::from_vector(xv, {rows, 32})).to_vector<float>());
    xv[1 * 32 + 5] = std::numeric_limits<float>::infinity();
    xv[(rows - 1) * 32] = std::numeric_limits<float>::quiet_NaN();
    const Tensor x = Tensor::from_vector(xv, {rows, 32});
    for (size_t i = 0; i < layers.size(); ++i) {
      SCOPED_TRACE("rows " + std::to_string(rows) + " layer " + std::to_string(i));
      const std::vector<float> y = layers[i].forward(x).to_vector<float>();  // [rows, 24]
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t n = 0; n < 24; ++n) {
          if (r == 1 || r == rows - 1) {
            EXPECT_TRUE(std::isnan(y[r * 24 + n])) << r << " " << n << " " << y[r * 24 + n];
          } else {
            EXPECT_EQ(y[r * 24 + n], clean[i][r * 24 + n]) << r << " " << n;
          }
        }
      }
    }
  }
  std::vector<float> wv = Tensor::randn({24, 32}, 3).to_vector<float>();
  wv[7 * 32 + 2] = std::numeric_limits<float>::quiet_NaN();  // output channel 7
  const std::vector<float> y = Linear::torch(Tensor::from_vector(wv, {24, 32}), std::nullopt)
                                   .quantize_dynamic()
                                   .forward(Tensor::randn({3, 32}, 6))
                                   .to_vector<float>();
  for (int64_t r = 0; r < 3; ++r) {
    for (int64_t n = 0; n < 24; ++n) EXPECT_EQ(std::isnan(y[r * 24 + n]), n == 7) << r << " " << n;
  }
}

TEST(MultiheadAttentionQuantized, StaticCalibrationStaysWithinThreePercent) {
  MultiheadAttentionConfig c;
  c.embed_dim = 96, c.num_heads = 4, c.batch_first = true;
  const MultiheadAttention f(c, 7);
  std::vector<std::array<Tensor, 3>> calib;
  for (uint64_t i = 0; i < 4; ++i) {
    const Tensor x = Tensor::randn({2, 64, 96}, 100 + i);
    calib.push_back({x, x, x});
  }
  const Tensor x = Tensor::randn({2, 64, 96}, 8);
  MultiheadAttentionOptions o;
  o.need_weights = false;
  const Tensor want = f.forward(x, x, x, o).output;
  for (auto kind : {ActivationObserver::Kind::min_max, ActivationObserver::Kind::percentile}) {
    CalibrationOptions co;
    co.observer = kind;
    const MultiheadAttention q = f.quantize_static(calib, co);
    EXPECT_TRUE(q.quantized());
    const double rel = norm_rel(q.forward(x, x, x, o).output, want);
    EXPECT_LT(rel, 3e-2) << static_cast<int>(kind);
    std::printf("static int8 MultiheadAttention (%s observer) vs f32: relative error %.2e\n",
                kind == ActivationObserver::Kind::min_max ? "min/max" : "99.99th percentile", rel);
  }
  EXPECT_THROW((void)f.quantize_static({}), ValueError);
}

// Calibration runs the inference forward: a layer in training mode with dropout observed
// out_proj's inputs through dropout (kept values scaled by 1 / (1 - p)), so its activation
// scale came out about twice the inference one at p = 0.5.
TEST(MultiheadAttentionQuantized, CalibrationIgnoresTrainingMode) {
  MultiheadAttentionConfig c;
  c.embed_dim = 16, c.num_heads = 2, c.dropout = 0.5;
  MultiheadAttention f(c, 3);
  const Tensor x = Tensor::randn({5, 2, 16}, 4);
  const Tensor eval = f.quantize_static({{x, x, x}}).quantized_state_dict().at("activation_scales");
  f.training = true, f.dropout_seed = 11;
  const MultiheadAttention q = f.quantize_static({{x, x, x}});
  EXPECT_EQ(q.quantized_state_dict().at("activation_scales").to_vector<float>(), eval.to_vector<float>());
  EXPECT_TRUE(q.training);  // the layer's own flag is kept
}

// quantize_dynamic of a statically quantized layer quantizes its activations per token again:
// the Linear and the layer stayed static (a fixed scale, clipping beyond it: outputs far from
// the dynamic layer's) and kept "activation_scales" in quantized_state_dict.
TEST(MultiheadAttentionQuantized, DynamicOfAStaticLayerIsDynamic) {
  const Tensor w = Tensor::randn({24, 32}, 1), x1 = Tensor::randn({3, 32}, 2);
  const Linear l = Linear::torch(w, std::nullopt);
  EXPECT_EQ(l.quantize_static(0.001f).quantize_dynamic().forward(x1).to_vector<float>(),
            l.quantize_dynamic().forward(x1).to_vector<float>());
  MultiheadAttentionConfig c;
  c.embed_dim = 16, c.num_heads = 2;
  const MultiheadAttention f(c, 3);
  const Tensor x = Tensor::randn({5, 2, 16}, 4), small = Tensor::full({5, 2, 16}, 0.05);  // x clips
  const MultiheadAttention s = f.quantize_static({{small, small, small}});
  const MultiheadAttention d = s.quantize_dynamic();
  EXPECT_EQ(d.forward(x, x, x).output.to_vector<float>(),
            f.quantize_dynamic().forward(x, x, x).output.to_vector<float>());
  EXPECT_EQ(d.quantized_state_dict().count("activation_scales"), 0u);
  EXPECT_EQ(s.quantized_state_dict().count("activation_scales"), 1u);
}

// An int8 GEMM takes K <= 131071 (qkv/gemm.h): a deeper Linear quantized without a word, then
// every call failed with gemm's "k=131072 is more than 131071". Refused when quantizing now;
// 131071 itself quantizes and runs.
TEST(LinearQuantized, InFeaturesPastTheInt8DepthAreRefusedWhenQuantizing) {
  const Linear deep = Linear::torch(Tensor::ones({1, 131072}), std::nullopt);
  EXPECT_THROW_WITH(deep.quantize_dynamic(), ValueError,
                    "Linear.quantize_dynamic: in_features 131072 is more than 131071, the depth of the int8 GEMM");
  EXPECT_THROW_WITH(deep.quantize_static(1.0f), ValueError, "Linear.quantize_static: in_features 131072");
  const Linear ok = Linear::torch(Tensor::ones({1, 131071}), std::nullopt);
  EXPECT_FLOAT_EQ(ok.quantize_dynamic(8).forward(Tensor::ones({1, 131071})).to_vector<float>()[0], 131071.0f);
}

// MultiheadAttention.quantize_static ran every calibration batch before a projection deeper than
// the int8 GEMM takes (or a bad weight_bits) was refused, by Linear's name. Refused first now:
// a calibration batch that forward would refuse (query of the wrong width) is never run.
TEST(LinearQuantized, MultiheadAttentionRefusesADeepLayerBeforeCalibrating) {
  MultiheadAttentionConfig c;
  c.embed_dim = 2, c.num_heads = 1, c.kdim = 131072;
  const MultiheadAttention deep(c, 1);
  const Tensor key = Tensor::ones({1, 1, 131072}), value = Tensor::ones({1, 1, 2});
  const Tensor bad_query = Tensor::ones({1, 1, 3});  // forward: a ShapeError
  EXPECT_THROW_WITH(deep.quantize_static({{bad_query, key, value}}), ValueError,
                    "MultiheadAttention.quantize_static: kdim (k_proj's in_features) 131072 is more than 131071");
  EXPECT_THROW_WITH(deep.quantize_dynamic(), ValueError, "MultiheadAttention.quantize_dynamic: kdim");
  c.kdim = 2;
  CalibrationOptions five_bits;
  five_bits.weight_bits = 5;
  EXPECT_THROW_WITH(MultiheadAttention(c, 1).quantize_static({{bad_query, value, value}}, five_bits), ValueError,
                    "MultiheadAttention.quantize_static: weight_bits must be 8, 7 or 0");
}

}  // namespace
}  // namespace qkv::nn
