// The fused CPU attention (scaled_dot_product_attention on f32) against the
// float64 reference, with FlashAttention's criterion: the fused kernel's max
// error against float64 is at most twice that of a naive float32 (unfused)
// implementation against float64, over random configurations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "attention/attention_cpu.h"
#include "attention/attention_test_configs.h"
#include "attention/naive_f32.h"
#include "attention/problem.h"
#include "common/attention_oracle.h"
#include "common/expect.h"
#include "qkv/attention.h"
#include "qkv/io.h"
#include "qkv/parallel.h"

#include <nlohmann/json.hpp>

namespace qkv {
namespace {

using test::Config;
using test::Inputs;
using test::make_inputs;
using test::MaskKind;
using test::max_abs;
using test::max_abs_diff;
using test::random_config;

// The naive float32 attention on one thread (threaded oneDNN calls on small
// matrices only cost time, the more so on a loaded machine).
AttentionResult naive_f32(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
  const int threads = get_num_threads();
  set_num_threads(1);
  AttentionResult r = attention::attention_naive_f32(q, k, v, o);
  set_num_threads(threads);
  return r;
}

// Restores the thread count when a test ends.
class FlashAttention : public ::testing::Test {
 protected:
  void SetUp() override { threads_ = get_num_threads(); }
  void TearDown() override { set_num_threads(threads_); }
  int threads_ = 1;
};

// err(fused) <= 2 * err(naive f32) + a floor of one f32 ulp of the largest |v|
// (for configurations where both are exact, e.g. Lk = 1).
void expect_within_criterion(const Config& c, const Tensor& fused, const Tensor& naive, const Tensor& ref, double v_max,
                             double* worst_ratio = nullptr) {
  const double e_fused = max_abs_diff(fused, ref), e_naive = max_abs_diff(naive, ref);
  const double floor = 0x1.0p-23 * v_max;
  EXPECT_LE(e_fused, 2.0 * e_naive + floor) << c.str() << " fused " << e_fused << " naive " << e_naive;
  if (worst_ratio && e_naive > floor) *worst_ratio = std::max(*worst_ratio, e_fused / e_naive);
}

TEST_F(FlashAttention, MatchesReferenceWithinTwiceNaiveF32Error) {
  std::mt19937_64 rng(20261122);
  double worst = 0.0;
  for (int i = 0; i < 240; ++i) {
    const Config c = random_config(rng, i);
    const Inputs in = make_inputs(c);
    const AttentionResult fused = scaled_dot_product_attention(in.q, in.k, in.v, in.options);
    const Tensor naive = naive_f32(in.q, in.k, in.v, in.options).output;
    const Tensor ref = attention_reference(in.q, in.k, in.v, in.options).output;
    ASSERT_EQ(fused.output.shape(), ref.shape()) << c.str();
    expect_within_criterion(c, fused.output, naive, ref, max_abs(in.v), &worst);
  }
  RecordProperty("worst_error_ratio", std::to_string(worst));
  std::printf("worst fused/naive error ratio over 240 configurations: %.3f\n", worst);
}

TEST_F(FlashAttention, WeightsMatchReferenceWithinTwiceNaiveF32Error) {
  std::mt19937_64 rng(7);
  double worst = 0.0;
  for (int i = 0; i < 60; ++i) {
    const Config c = random_config(rng, i);
    Inputs in = make_inputs(c);
    in.options.return_weights = true;
    const AttentionResult fused = scaled_dot_product_attention(in.q, in.k, in.v, in.options);
    const AttentionResult naive = naive_f32(in.q, in.k, in.v, in.options);
    const AttentionResult ref = attention_reference(in.q, in.k, in.v, in.options);
    ASSERT_TRUE(fused.weights.has_value());
    const double keep = c.dropout > 0 ? 1.0 / (1.0 - c.dropout) : 1.0;
    expect_within_criterion(c, *fused.weights, *naive.weights, *ref.weights, keep, &worst);
    expect_within_criterion(c, fused.output, naive.output, ref.output, max_abs(in.v));
  }
  std::printf("worst fused/naive weight error ratio over 60 configurations: %.3f\n", worst);
}

// float64 runs the same fused kernel in double (OpenBLAS tile GEMMs): it must agree
// with the float64 reference up to the order of the sums. Bound: 1e-12 of the output's
// scale (max |v|), or of the weights' (1) — times the score magnitude for the "big"
// configurations (q, k x1000: scores ~1e6, so rounding the score moves exp by ~1e-10).
// Worst seen (AVX2 EPYC, 80 configurations, not big): 7.6e-16.
TEST_F(FlashAttention, Float64MatchesTheFloat64Reference) {
  std::mt19937_64 rng(64);
  double worst = 0.0;
  for (int i = 0; i < 80; ++i) {
    const Config c = random_config(rng, i);
    Inputs in = make_inputs(c);
    in.q = in.q.to(DType::f64), in.k = in.k.to(DType::f64), in.v = in.v.to(DType::f64);
    if (in.options.attn_mask && in.options.attn_mask->dtype() != DType::b8) {
      in.options.attn_mask = in.options.attn_mask->to(DType::f64);
    }
    in.options.return_weights = true;
    in.options.return_logsumexp = true;
    // The kernel itself (the dispatcher sends f64 to it too; this cannot silently test the reference).
    const AttentionResult fused =
        attention::flash_attention_cpu(attention::make_problem(in.q, in.k, in.v, in.options, "test"), in.options);
    const AttentionResult ref = attention_reference(in.q, in.k, in.v, in.options);
    ASSERT_EQ(fused.output.dtype(), DType::f64);
    ASSERT_EQ(fused.logsumexp->dtype(), DType::f64);
    const double keep = c.dropout > 0 ? 1.0 / (1.0 - c.dropout) : 1.0;
    const double tol = 1e-12 * (c.big ? 1e6 : 1.0);
    const double e_out = max_abs_diff(fused.output, ref.output) / std::max(max_abs(in.v), 1e-300);
    const double e_w = max_abs_diff(*fused.weights, *ref.weights) / keep;
    const double e_lse = max_abs_diff(*fused.logsumexp, *ref.logsumexp) / std::max(max_abs(*ref.logsumexp), 1.0);
    EXPECT_LE(e_out, tol) << c.str();
    EXPECT_LE(e_w, tol) << c.str();
    EXPECT_LE(e_lse, tol) << c.str();
    if (!c.big) worst = std::max({worst, e_out, e_w, e_lse});
  }
  std::printf("float64 fused vs reference, worst relative error (not big): %.3g\n", worst);
}

TEST_F(FlashAttention, ResultsDoNotDependOnThreadCount) {
  std::mt19937_64 rng(99);
  for (int i = 0; i < 40; ++i) {
    const Config c = random_config(rng, i);
    const Inputs in = make_inputs(c);
    const Tensor naive = naive_f32(in.q, in.k, in.v, in.options).output;
    const Tensor ref = attention_reference(in.q, in.k, in.v, in.options).output;
    set_num_threads(1);
    const Tensor one = scaled_dot_product_attention(in.q, in.k, in.v, in.options).output;
    set_num_threads(3);
    const Tensor three = scaled_dot_product_attention(in.q, in.k, in.v, in.options).output;
    set_num_threads(threads_);
    expect_within_criterion(c, one, naive, ref, max_abs(in.v));
    expect_within_criterion(c, three, naive, ref, max_abs(in.v));
    EXPECT_LE(max_abs_diff(one, three), max_abs_diff(naive, ref) + 0x1.0p-23 * max_abs(in.v)) << c.str();
  }
}

// Float Q K^T tiles on K packed once per call in gemm panels (attention_cpu_panels.h: tiles
// a multiple of 64 keys wide, each head's K read by at least four query tiles): Lk not a
// multiple of 64 (a last partial panel), Dk not a multiple of 16 (padded panel rows), GQA,
// k/v broadcast over the batch (zero stride), k rows apart by more than Dk, causal key tiles
// that start on a panel or between two and partial tiles (both read unpacked), masks, dropout and the
// weights' second pass; against the float64 reference with the criterion above.
TEST_F(FlashAttention, PackedKeysMatchReferenceWithinTwiceNaiveF32Error) {
  std::mt19937_64 rng(14);
  double worst = 0.0;
  for (const FlashTiles tiles : {FlashTiles{64, 64}, FlashTiles{32, 128}, FlashTiles{64, 192}}) {
    for (int i = 0; i < 12; ++i) {
      Config c = random_config(rng, i);
      c.lq = test::pick<int64_t>(rng, {200, 257, 300}), c.lk = test::pick<int64_t>(rng, {200, 257, 300, 384});
      if (i % 8 == 2 && c.lq == c.lk) c.lk += 37;  // causal with Lq != Lk
      Inputs in = make_inputs(c);
      in.options.tuning.flash_tiles = tiles;
      in.options.return_weights = i % 4 == 3;
      if (i % 3 == 0) {  // k rows 8 elements apart beyond Dk
        Shape wide = in.k.shape();
        wide.back() += 8;
        in.k = Tensor::randn(wide, c.seed + 5).slice(-1, 0, c.dk);
      }
      const AttentionResult fused = scaled_dot_product_attention(in.q, in.k, in.v, in.options);
      const AttentionResult naive = naive_f32(in.q, in.k, in.v, in.options);
      const AttentionResult ref = attention_reference(in.q, in.k, in.v, in.options);
      expect_within_criterion(c, fused.output, naive.output, ref.output, max_abs(in.v), &worst);
      if (in.options.return_weights) {
        ASSERT_TRUE(fused.weights.has_value());
        expect_within_criterion(c, *fused.weights, *naive.weights, *ref.weights, 1.0 / (1.0 - c.dropout));
      }
    }
  }
  std::printf("packed keys: worst fused/naive error ratio over 36 configurations: %.3f\n", worst);
}

TEST_F(FlashAttention, MatchesTorchFixturesWithinTwiceNaiveF32Error) {
  // PyTorch's float64 results for the inputs of tests/fixtures/sdpa (see
  // reference_torch_test.cc). f32: the criterion; f16/bf16 outputs are rounded
  // to their dtype, so one ulp of it at |want| is added.
  namespace fs = std::filesystem;
  int checked = 0;
  for (const auto& entry : fs::directory_iterator(fs::path(QKV_SOURCE_DIR) / "tests" / "fixtures" / "sdpa")) {
    if (entry.path().extension() != ".safetensors") continue;
    const auto file = io::load_safetensors(entry.path());
    const auto options = nlohmann::json::parse(file.metadata.at("options"));
    const DType dt = dtype_from_name(options.at("dtype").get<std::string>());
    if (dt == DType::f64) continue;  // the reference's path
    AttentionOptions o;
    o.is_causal = options.at("is_causal").get<bool>();
    o.enable_gqa = options.at("enable_gqa").get<bool>();
    if (!options.at("scale").is_null()) o.scale = options.at("scale").get<double>();
    if (auto it = file.tensors.find("attn_mask"); it != file.tensors.end()) o.attn_mask = it->second;
    const Tensor &q = file.tensors.at("q"), &k = file.tensors.at("k"), &v = file.tensors.at("v");
    const Tensor& want = file.tensors.at("out");
    const Tensor got = scaled_dot_product_attention(q, k, v, o).output;
    ASSERT_EQ(got.dtype(), dt) << entry.path();
    const double e_naive = max_abs_diff(naive_f32(q, k, v, o).output, want);
    const double ulp = dt == DType::f16 ? 0x1.0p-10 : dt == DType::bf16 ? 0x1.0p-7 : 0.0;
    const double bound = 2.0 * e_naive + (ulp + 0x1.0p-23) * max_abs(want);
    EXPECT_LE(max_abs_diff(got, want), bound) << entry.path().filename() << " naive " << e_naive;
    ++checked;
  }
  EXPECT_GE(checked, 8);  // the f32, f16 and bf16 fixtures (the rest are f64)
}

TEST_F(FlashAttention, SmallAndOddTilesMatchReference) {
  // Many tile boundaries: lengths straddle tiles of every shape.
  std::mt19937_64 rng(5);
  for (const FlashTiles tiles : {FlashTiles{1, 3}, FlashTiles{5, 7}, FlashTiles{16, 8}, FlashTiles{32, 64}}) {
    for (int i = 0; i < 12; ++i) {
      Config c = random_config(rng, i);
      c.lq = std::min<int64_t>(c.lq, 70), c.lk = std::min<int64_t>(c.lk, 90);  // tiny tiles: many GEMM calls
      Inputs in = make_inputs(c);
      in.options.tuning.flash_tiles = tiles;
      const Tensor fused = scaled_dot_product_attention(in.q, in.k, in.v, in.options).output;
      const Tensor naive = naive_f32(in.q, in.k, in.v, in.options).output;
      const Tensor ref = attention_reference(in.q, in.k, in.v, in.options).output;
      expect_within_criterion(c, fused, naive, ref, max_abs(in.v));
    }
  }
}

TEST_F(FlashAttention, DropoutMaskMatchesReferenceBitForBit) {
  Config c;
  c.b = 2, c.hq = 4, c.hk = 2, c.lq = 70, c.lk = 300, c.dk = 32, c.dv = 24, c.dropout = 0.3, c.gqa = true;
  c.mask = MaskKind::bool_broadcast;
  const Inputs in = make_inputs(c);
  AttentionOptions o = in.options;
  o.return_weights = true;
  const AttentionResult fused = scaled_dot_product_attention(in.q, in.k, in.v, o);
  const AttentionResult ref = attention_reference(in.q, in.k, in.v, o);
  const auto fw = fused.weights->to_vector<double>(), rw = ref.weights->to_vector<double>();
  int64_t dropped = 0;
  for (size_t i = 0; i < fw.size(); ++i) {
    ASSERT_EQ(fw[i] == 0.0, rw[i] == 0.0) << "element " << i;
    dropped += fw[i] == 0.0;
  }
  EXPECT_GT(dropped, static_cast<int64_t>(fw.size() / 5));
  expect_within_criterion(c, fused.output, naive_f32(in.q, in.k, in.v, o).output, ref.output, max_abs(in.v));
  o.dropout_p = 1.0;  // everything dropped
  EXPECT_EQ(max_abs(scaled_dot_product_attention(in.q, in.k, in.v, o).output), 0.0);
}

TEST_F(FlashAttention, FullyMaskedRowsGiveZeroOutputWeightsAndMinusInfLogsumexp) {
  Config c;
  c.lq = 40, c.lk = 270, c.dk = 16, c.dv = 8, c.mask = MaskKind::bool_masked_rows;
  const Inputs in = make_inputs(c);
  AttentionOptions o = in.options;
  o.return_weights = o.return_logsumexp = true;
  const AttentionResult r = scaled_dot_product_attention(in.q, in.k, in.v, o);
  const AttentionResult ref = attention_reference(in.q, in.k, in.v, o);
  int64_t masked_rows = 0;
  for (int64_t i = 0; i < c.lq; ++i) {
    if (in.options.attn_mask->select(-2, i).to(DType::f64).to_vector<double>() != std::vector<double>(c.lk, 0.0)) {
      continue;
    }
    ++masked_rows;
    EXPECT_EQ(r.logsumexp->item({0, 0, i}), -INFINITY);
    EXPECT_EQ(max_abs(r.output.select(-2, i)), 0.0);
    EXPECT_EQ(max_abs(r.weights->select(-2, i)), 0.0);
  }
  EXPECT_GT(masked_rows, 0);
  EXPECT_LT(max_abs_diff(r.output, ref.output), 1e-5);
}

TEST_F(FlashAttention, LogsumexpMatchesFloat64) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 30; ++i) {
    Config c = random_config(rng, i);
    c.dropout = 0.0;  // lse is of the scores, before dropout
    Inputs in = make_inputs(c);
    in.options.return_logsumexp = true;
    const AttentionResult r = scaled_dot_product_attention(in.q, in.k, in.v, in.options);
    // The long double oracle (tests/common/attention_oracle.h), not qkv's code.
    const std::vector<long double> exp = attention_oracle::oracle(in.q, in.k, in.v, in.options).lse;
    ASSERT_EQ(r.logsumexp->numel(), static_cast<int64_t>(exp.size())) << c.str();
    ASSERT_EQ(r.logsumexp->dtype(), DType::f32);
    const auto got = r.logsumexp->to_vector<double>();
    for (size_t j = 0; j < got.size(); ++j) {
      if (std::isinf(exp[j])) {
        EXPECT_EQ(got[j], exp[j]) << c.str();
      } else {
        EXPECT_NEAR(got[j], static_cast<double>(exp[j]), 1e-5 * (1.0 + std::fabs(static_cast<double>(exp[j]))))
            << c.str() << " row " << j;
      }
    }
  }
}

// The naive attention in the half dtype `dt`, as PyTorch's standard (unfused)
// attention runs on f16/bf16 tensors: each matrix product accumulates in f32
// and its result is rounded to dt (scores, weights, output); the softmax runs
// in f32 on the rounded scores. 4-D contiguous inputs, no mask. Returns
// {output, weights} holding dt values as f32 tensors.
std::pair<Tensor, Tensor> naive_half(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o,
                                     DType dt) {
  const int64_t bh = q.size(0) * q.size(1), lq = q.size(2), dk = q.size(3), lk = k.size(2), dv = v.size(3);
  auto round = [dt](const std::vector<float>& x) {
    return Tensor::from_vector(x, {static_cast<int64_t>(x.size())}).to(dt).to_vector<float>();
  };
  const std::vector<float> qx = q.to_vector<float>(), kx = k.to_vector<float>(), vx = v.to_vector<float>();
  const float scale = static_cast<float>(o.scale ? *o.scale : 1.0 / std::sqrt(static_cast<double>(dk)));
  std::vector<float> out, weights;
  for (int64_t b = 0; b < bh; ++b) {
    std::vector<float> s(static_cast<size_t>(lq * lk));  // [Lq, Lk]
    for (int64_t i = 0; i < lq; ++i) {
      for (int64_t j = 0; j < lk; ++j) {
        float acc = 0.0f;
        for (int64_t d = 0; d < dk; ++d) acc += qx[(b * lq + i) * dk + d] * kx[(b * lk + j) * dk + d];
        s[i * lk + j] = o.is_causal && j > i ? -INFINITY : acc * scale;
      }
    }
    s = round(s);
    for (int64_t i = 0; i < lq; ++i) {
      float* row = s.data() + i * lk;
      const float mx = *std::max_element(row, row + lk);
      float sum = 0.0f;
      for (int64_t j = 0; j < lk; ++j) sum += (row[j] = std::exp(row[j] - mx));
      for (int64_t j = 0; j < lk; ++j) row[j] /= sum;
    }
    s = round(s);
    weights.insert(weights.end(), s.begin(), s.end());
    for (int64_t i = 0; i < lq; ++i) {
      for (int64_t d = 0; d < dv; ++d) {
        float acc = 0.0f;
        for (int64_t j = 0; j < lk; ++j) acc += s[i * lk + j] * vx[(b * lk + j) * dv + d];
        out.push_back(acc);
      }
    }
  }
  return {Tensor::from_vector(round(out), {q.size(0), q.size(1), lq, dv}),
          Tensor::from_vector(weights, {q.size(0), q.size(1), lq, lk})};
}

TEST_F(FlashAttention, HalfAndBFloat16WithinTwiceNaiveSamePrecisionError) {
  // FlashAttention's criterion in the input dtype: against float64 (the reference
  // on the f64 upcast of the stored inputs), the fused kernel's error is at most
  // twice that of the naive attention in that dtype (naive_half).
  double worst = 0.0;
  for (DType dt : {DType::f16, DType::bf16}) {
    for (bool causal : {false, true}) {
      Config c;
      c.b = 1, c.hq = 2, c.hk = 2, c.lq = 33, c.lk = 65, c.dk = 16, c.dv = 8, c.causal = causal;
      Inputs in = make_inputs(c);
      in.options.return_weights = true;
      const Tensor q = in.q.to(dt), k = in.k.to(dt), v = in.v.to(dt);
      const AttentionResult r = scaled_dot_product_attention(q, k, v, in.options);
      const AttentionResult ref = attention_reference(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64), in.options);
      const auto [naive_out, naive_w] = naive_half(q, k, v, in.options, dt);
      EXPECT_EQ(r.output.dtype(), dt);
      EXPECT_EQ(r.weights->dtype(), dt);
      const double e_out = max_abs_diff(r.output, ref.output), n_out = max_abs_diff(naive_out, ref.output);
      const double e_w = max_abs_diff(*r.weights, *ref.weights), n_w = max_abs_diff(naive_w, *ref.weights);
      EXPECT_LE(e_out, 2.0 * n_out) << dtype_name(dt) << " causal " << causal << " naive " << n_out;
      EXPECT_LE(e_w, 2.0 * n_w) << dtype_name(dt) << " causal " << causal << " naive " << n_w;
      EXPECT_GT(n_out, 0.0);
      worst = std::max({worst, e_out / n_out, e_w / n_w});
    }
  }
  std::printf("worst fused/naive same-precision error ratio (f16, bf16): %.3f\n", worst);
}

TEST_F(FlashAttention, StridedInputsAreReadInPlaceOrCopied) {
  // q/k/v laid out [B, L, H, D] (a view with row stride H*D), and k with Dk strided.
  const Tensor q = Tensor::randn({2, 37, 4, 16}, 1).permute({0, 2, 1, 3});
  const Tensor k = Tensor::randn({2, 4, 16, 50}, 2).transpose(-1, -2);  // last stride 50
  const Tensor v = Tensor::randn({2, 50, 4, 8}, 3).permute({0, 2, 1, 3});
  AttentionOptions o;
  o.is_causal = true;
  const Tensor fused = scaled_dot_product_attention(q, k, v, o).output;
  const Tensor naive = naive_f32(q, k, v, o).output;
  const Tensor ref = attention_reference(q, k, v, o).output;
  expect_within_criterion(Config{}, fused, naive, ref, max_abs(v));
}

// f64 inputs and every logsumexp: float64_oracle_test.cc.

TEST_F(FlashAttention, ErrorsNameScaledDotProductAttention) {
  const Tensor q = Tensor::randn({4, 8}, 1), k = Tensor::randn({6, 7}, 2), v = Tensor::randn({6, 3}, 3);
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, v), ShapeError,
                    "scaled_dot_product_attention: q and k must have the same last dim (Dk), got q [4, 8], "
                    "k [6, 7], v [6, 3]");
  AttentionOptions o;
  o.is_causal = true;
  o.attn_mask = Tensor::ones({4, 6}, DType::b8);
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, Tensor::randn({6, 8}, 2), v, o), ValueError,
                    "scaled_dot_product_attention: attn_mask and is_causal cannot both be set");
  EXPECT_THROW_WITH(scaled_dot_product_attention(q.to(DType::f16), Tensor::randn({6, 8}, 2), v), DTypeError,
                    "scaled_dot_product_attention: q, k and v must have the same dtype");
}

TEST_F(FlashAttention, EmptyLengthsGiveEmptyOrZeroOutputs) {
  const Tensor q = Tensor::randn({2, 3, 8}, 1), v0 = Tensor::randn({2, 0, 4}, 3);
  const AttentionResult r = scaled_dot_product_attention(q, Tensor::randn({2, 0, 8}, 2), v0);  // Lk = 0
  EXPECT_EQ(r.output.shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(max_abs(r.output), 0.0);
  const Tensor q0 = Tensor::randn({2, 0, 8}, 1);
  EXPECT_EQ(scaled_dot_product_attention(q0, Tensor::randn({2, 5, 8}, 2), Tensor::randn({2, 5, 4}, 3)).output.shape(),
            (Shape{2, 0, 4}));
}

// ---- Calls inside a parallel region (the backward's: attention_backward_cpu_test.cc) ----
// The forward called from each worker of parallel_for (which runs nested calls inline, on one
// worker): three row tiles, so that a call at top level on 2 threads has fewer items than 4 a
// worker. Its result is the one-thread result bit for bit whatever set_num_threads says: the
// work a call divides among workers (items, and any split of an item's keys) must follow the
// workers that really run there, one, not get_num_threads().
TEST_F(FlashAttention, InsideAParallelRegionRunsAsOneWorker) {
  Config c;
  c.lq = 96, c.lk = 160, c.dk = 24, c.dv = 16, c.seed = 34;
  for (const bool causal : {false, true}) {
    c.causal = causal;
    Inputs in = make_inputs(c);
    in.options.tuning.flash_tiles = FlashTiles{32, 16};  // 3 row tiles, 10 key tiles
    in.options.return_logsumexp = true;
    set_num_threads(1);
    const AttentionResult one = scaled_dot_product_attention(in.q, in.k, in.v, in.options);
    for (const int n : {2, 3}) {
      set_num_threads(n);
      std::vector<AttentionResult> got(static_cast<size_t>(n));
      parallel_for(0, n, 1, [&](int64_t lo, int64_t hi) {
        for (int64_t i = lo; i < hi; ++i) {
          got[static_cast<size_t>(i)] = scaled_dot_product_attention(in.q, in.k, in.v, in.options);
        }
      });
      for (const AttentionResult& r : got) {
        EXPECT_EQ(r.output.to_vector<double>(), one.output.to_vector<double>()) << c.str() << ", " << n << " threads";
        EXPECT_EQ(r.logsumexp->to_vector<double>(), one.logsumexp->to_vector<double>())
            << c.str() << ", " << n << " threads";
      }
    }
  }
}

}  // namespace
}  // namespace qkv
