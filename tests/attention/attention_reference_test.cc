// Hand-computed cases, equivalences and error messages of attention_reference.
// (Agreement with real PyTorch is in reference_torch_test.cc.)
#include <gtest/gtest.h>

#include <cmath>

#include "common/expect.h"
#include "qkv/attention.h"
#include "qkv/parallel.h"
#include "qkv/random.h"

namespace qkv {
namespace {

Tensor f64(std::vector<double> v, Shape s) { return Tensor::from_vector<double>(v, s); }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

AttentionOptions with_weights() {
  AttentionOptions o;
  o.return_weights = true;
  return o;
}

TEST(AttentionReference, TwoKeysByHand) {
  // scores = [1, 0] (scale 1) -> weights [e/(e+1), 1/(e+1)].
  const Tensor q = f64({1, 0}, {1, 2}), k = f64({1, 0, 0, 1}, {2, 2}), v = f64({1, 2, 3, 4}, {2, 2});
  AttentionOptions o = with_weights();
  o.scale = 1.0;
  const auto r = attention_reference(q, k, v, o);
  const double w0 = std::exp(1.0) / (std::exp(1.0) + 1.0), w1 = 1.0 - w0;
  EXPECT_NEAR(r.weights->item({0, 0}), w0, 1e-15);
  EXPECT_NEAR(r.weights->item({0, 1}), w1, 1e-15);
  EXPECT_NEAR(r.output.item({0, 0}), w0 * 1 + w1 * 3, 1e-15);
  EXPECT_NEAR(r.output.item({0, 1}), w0 * 2 + w1 * 4, 1e-15);
}

TEST(AttentionReference, DefaultScaleIsInverseSqrtDk) {
  // Dk = 4, q.k = [4, 0] -> scaled scores [2, 0].
  const Tensor q = f64({1, 1, 1, 1}, {1, 4}), k = f64({1, 1, 1, 1, 0, 0, 0, 0}, {2, 4}), v = f64({1, 0}, {2, 1});
  const auto r = attention_reference(q, k, v, with_weights());
  EXPECT_NEAR(r.weights->item({0, 0}), std::exp(2.0) / (std::exp(2.0) + 1.0), 1e-15);
}

TEST(AttentionReference, EqualScoresAverageTheValues) {
  const Tensor q = Tensor::zeros({3, 5}, DType::f64), k = Tensor::randn({4, 5}, 1, DType::f64);
  const Tensor v = f64({1, 10, 2, 20, 3, 30, 4, 40}, {4, 2});
  const auto r = attention_reference(q, k, v);
  EXPECT_EQ(r.output.shape(), (Shape{3, 2}));  // Lq != Lk, Dk != Dv
  for (int64_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(r.output.item({i, 0}), 2.5, 1e-14);
    EXPECT_NEAR(r.output.item({i, 1}), 25.0, 1e-14);
  }
}

TEST(AttentionReference, CausalIsTopLeftAligned) {
  const Tensor q = Tensor::randn({2, 3, 4}, 2, DType::f64), k = Tensor::randn({2, 5, 4}, 3, DType::f64);
  const Tensor v = Tensor::randn({2, 5, 6}, 4, DType::f64);
  AttentionOptions o = with_weights();
  o.is_causal = true;
  const auto r = attention_reference(q, k, v, o);
  // Row 0 sees only key 0, so its output is v[0]; row i ignores keys j > i.
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t d = 0; d < 6; ++d) EXPECT_NEAR(r.output.item({b, 0, d}), v.item({b, 0, d}), 1e-14);
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = i + 1; j < 5; ++j) EXPECT_EQ(r.weights->item({b, i, j}), 0.0);
  }
  // Equivalent to the explicit lower-triangular boolean mask.
  Tensor tril = Tensor::zeros({3, 5}, DType::b8);
  for (int64_t i = 0; i < 3; ++i)
    for (int64_t j = 0; j <= i; ++j) tril.set_item({i, j}, 1);
  AttentionOptions m = with_weights();
  m.attn_mask = tril;
  EXPECT_EQ(max_abs_diff(attention_reference(q, k, v, m).output, r.output), 0.0);
}

TEST(AttentionReference, BoolMaskEqualsAdditiveInfMask) {
  const Tensor q = Tensor::randn({2, 3, 4, 8}, 5, DType::f64), k = Tensor::randn({2, 3, 6, 8}, 6, DType::f64);
  const Tensor v = Tensor::randn({2, 3, 6, 8}, 7, DType::f64);
  const Tensor keep = Tensor::uniform({2, 1, 4, 6}, 8, 0, 1, DType::f64);
  Tensor boolean = Tensor::empty({2, 1, 4, 6}, DType::b8), additive = Tensor::empty({2, 1, 4, 6}, DType::f64);
  for (int64_t i = 0; i < keep.numel(); ++i) {
    const bool on = keep.data<double>()[i] > 0.3;
    boolean.data<bool>()[i] = on;
    additive.data<double>()[i] = on ? 0.0 : -INFINITY;
  }
  AttentionOptions a, b;
  a.attn_mask = boolean;
  b.attn_mask = additive;
  EXPECT_EQ(max_abs_diff(attention_reference(q, k, v, a).output, attention_reference(q, k, v, b).output), 0.0);
}

TEST(AttentionReference, FullyMaskedRowGivesZeros) {
  const Tensor q = Tensor::randn({2, 4}, 9, DType::f64), k = Tensor::randn({3, 4}, 10, DType::f64);
  const Tensor v = Tensor::randn({3, 5}, 11, DType::f64);
  Tensor mask = Tensor::ones({2, 3}, DType::b8);
  for (int64_t j = 0; j < 3; ++j) mask.set_item({1, j}, 0);
  AttentionOptions o = with_weights();
  o.attn_mask = mask;
  const auto r = attention_reference(q, k, v, o);
  for (int64_t d = 0; d < 5; ++d) EXPECT_EQ(r.output.item({1, d}), 0.0);
  for (int64_t j = 0; j < 3; ++j) EXPECT_EQ(r.weights->item({1, j}), 0.0);
  EXPECT_NE(r.output.item({0, 0}), 0.0);
}

TEST(AttentionReference, AdditiveMaskShiftsScores) {
  const Tensor q = Tensor::randn({1, 4}, 12, DType::f64), k = Tensor::randn({2, 4}, 13, DType::f64);
  const Tensor v = Tensor::randn({2, 3}, 14, DType::f64);
  AttentionOptions o = with_weights();
  o.scale = 1.0;
  o.attn_mask = f64({0.0, std::log(3.0)}, {2});  // 1-D mask broadcasts over rows
  const auto r = attention_reference(q, k, v, o);
  double s0 = 0, s1 = 0;
  for (int64_t d = 0; d < 4; ++d) {
    s0 += q.item({0, d}) * k.item({0, d});
    s1 += q.item({0, d}) * k.item({1, d});
  }
  const double e0 = std::exp(s0), e1 = 3.0 * std::exp(s1);
  EXPECT_NEAR(r.weights->item({0, 1}), e1 / (e0 + e1), 1e-14);
}

TEST(AttentionReference, GqaEqualsRepeatedHeads) {
  const Tensor q = Tensor::randn({2, 8, 5, 4}, 15, DType::f64);
  const Tensor k = Tensor::randn({2, 2, 7, 4}, 16, DType::f64), v = Tensor::randn({2, 2, 7, 3}, 17, DType::f64);
  AttentionOptions o;
  o.enable_gqa = true;
  const auto r = attention_reference(q, k, v, o);
  // repeat_interleave(4, dim=1): q head h uses kv head h / 4.
  auto repeat = [](const Tensor& t) {
    return t.unsqueeze(2).expand({2, 2, 4, 7, t.size(-1)}).reshape({2, 8, 7, t.size(-1)});
  };
  EXPECT_LT(max_abs_diff(r.output, attention_reference(q, repeat(k), repeat(v)).output), 1e-15);
}

TEST(AttentionReference, LeadingDimsBroadcast) {
  const Tensor q = Tensor::randn({2, 3, 4, 8}, 18, DType::f64);
  const Tensor k = Tensor::randn({1, 3, 6, 8}, 19, DType::f64), v = Tensor::randn({3, 6, 5}, 20, DType::f64);
  const auto r = attention_reference(q, k, v);
  EXPECT_EQ(r.output.shape(), (Shape{2, 3, 4, 5}));
  const auto explicit_r =
      attention_reference(q, k.expand({2, 3, 6, 8}).contiguous(), v.expand({2, 3, 6, 5}).contiguous());
  EXPECT_EQ(max_abs_diff(r.output, explicit_r.output), 0.0);
}

TEST(AttentionReference, DropoutZeroesOrRescalesWeights) {
  const Tensor q = Tensor::randn({4, 32, 16}, 21, DType::f64), k = Tensor::randn({4, 64, 16}, 22, DType::f64);
  const Tensor v = Tensor::randn({4, 64, 8}, 23, DType::f64);
  const auto plain = attention_reference(q, k, v, with_weights());
  AttentionOptions o = with_weights();
  o.dropout_p = 0.25;
  o.seed = 1234;
  const auto r = attention_reference(q, k, v, o);
  const auto w = r.weights->to_vector<double>(), w0 = plain.weights->to_vector<double>();
  int64_t dropped = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    const bool keep = random::dropout_keep(1234, i, 0.25);
    EXPECT_NEAR(w[i], keep ? w0[i] / 0.75 : 0.0, 1e-15);
    dropped += !keep;
  }
  // 8192 Bernoulli(0.25) draws: 5 sigma = 196.
  EXPECT_NEAR(static_cast<double>(dropped), 0.25 * static_cast<double>(w.size()), 196.0);
  // The output is the dropped-out weights times v.
  for (int64_t b = 0; b < 4; ++b) {
    double o00 = 0;
    for (int64_t j = 0; j < 64; ++j) o00 += r.weights->item({b, 0, j}) * v.item({b, j, 0});
    EXPECT_NEAR(r.output.item({b, 0, 0}), o00, 1e-13);
  }
  // Same seed, same mask; another seed, another mask.
  EXPECT_EQ(max_abs_diff(attention_reference(q, k, v, o).output, r.output), 0.0);
  o.seed = 99;
  EXPECT_GT(max_abs_diff(attention_reference(q, k, v, o).output, r.output), 0.0);
  o.dropout_p = 1.0;
  EXPECT_EQ(max_abs_diff(attention_reference(q, k, v, o).output, Tensor::zeros({4, 32, 8}, DType::f64)), 0.0);
}

TEST(AttentionReference, LargeLogitsStayFinite) {
  const Tensor q = Tensor::randn({2, 6, 8}, 24).to(DType::f64), k = Tensor::randn({2, 6, 8}, 25, DType::f64);
  Tensor big_q = Tensor::empty({2, 6, 8}, DType::f64);
  big_q.copy_from(q);
  for (int64_t i = 0; i < big_q.numel(); ++i) big_q.data<double>()[i] *= 1000.0;
  const auto r = attention_reference(big_q, k, Tensor::randn({2, 6, 3}, 26, DType::f64), with_weights());
  for (double x : r.output.to_vector<double>()) EXPECT_TRUE(std::isfinite(x));
}

TEST(AttentionReference, KeepsInputDtype) {
  for (DType t : {DType::f32, DType::f16, DType::bf16}) {
    const Tensor q = Tensor::randn({2, 3, 4}, 27, t), k = Tensor::randn({2, 5, 4}, 28, t),
                 v = Tensor::randn({2, 5, 4}, 29, t);
    const auto r = attention_reference(q, k, v, with_weights());
    EXPECT_EQ(r.output.dtype(), t);
    EXPECT_EQ(r.weights->dtype(), t);
    const auto exact = attention_reference(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64));
    const double tol = t == DType::f32 ? 1e-6 : (t == DType::f16 ? 2e-3 : 1.6e-2);
    EXPECT_LT(max_abs_diff(r.output.to(DType::f64), exact.output), tol) << dtype_name(t);
  }
}

TEST(AttentionReference, ErrorsNameTheShapes) {
  const Tensor q = Tensor::randn({2, 4, 3, 8}, 1), k = Tensor::randn({2, 4, 5, 8}, 2),
               v = Tensor::randn({2, 4, 5, 6}, 3);
  AttentionOptions both;
  both.is_causal = true;
  both.attn_mask = Tensor::ones({3, 5}, DType::b8);
  EXPECT_THROW_WITH(attention_reference(q, k, v, both), ValueError, "attn_mask and is_causal cannot both be set");
  EXPECT_THROW_WITH(attention_reference(q, Tensor::randn({2, 4, 5, 7}, 2), v), ShapeError,
                    "q and k must have the same last dim (Dk), got q [2, 4, 3, 8], k [2, 4, 5, 7]");
  EXPECT_THROW_WITH(attention_reference(q, k, Tensor::randn({2, 4, 6, 6}, 3)), ShapeError,
                    "k and v must have the same length");
  EXPECT_THROW_WITH(attention_reference(q, k.to(DType::f64), v), DTypeError, "same dtype");
  EXPECT_THROW_WITH(attention_reference(q.to(DType::i32), k, v), DTypeError, "floating point");
  EXPECT_THROW_WITH(attention_reference(Tensor::randn({8}, 1), k, v), ShapeError, "at least 2 dims");
  EXPECT_THROW_WITH(attention_reference(q, Tensor::randn({2, 3, 5, 8}, 2), Tensor::randn({2, 3, 5, 6}, 3)), ShapeError,
                    "cannot be broadcast");
  AttentionOptions gqa;
  gqa.enable_gqa = true;
  EXPECT_THROW_WITH(attention_reference(q, Tensor::randn({2, 3, 5, 8}, 2), Tensor::randn({2, 3, 5, 6}, 3), gqa),
                    ShapeError, "q heads (4) must be a multiple of k/v heads (3)");
  AttentionOptions bad_mask;
  bad_mask.attn_mask = Tensor::ones({4, 5}, DType::b8);
  EXPECT_THROW_WITH(attention_reference(q, k, v, bad_mask), ShapeError,
                    "attn_mask of shape [4, 5] does not broadcast to the scores [2, 4, 3, 5]");
  bad_mask.attn_mask = Tensor::ones({3, 5}, DType::i32);
  EXPECT_THROW_WITH(attention_reference(q, k, v, bad_mask), DTypeError, "attn_mask must be bool or floating");
  AttentionOptions drop;
  drop.dropout_p = 1.5;
  EXPECT_THROW_WITH(attention_reference(q, k, v, drop), ValueError, "dropout_p must be in [0, 1], got 1.5");
}

TEST(AttentionReference, EmptyKeysGiveZeros) {
  const auto r = attention_reference(Tensor::randn({3, 4}, 1), Tensor::zeros({0, 4}), Tensor::zeros({0, 2}));
  EXPECT_EQ(r.output.shape(), (Shape{3, 2}));
  for (float x : r.output.to_vector<float>()) EXPECT_EQ(x, 0.0f);
}

// Ctrl-C (qkv::request_interrupt) stops the single-threaded reference at its next row
// with Interrupted; once cleared the same call computes again.
TEST(AttentionReference, StopsWithInterruptedWhenTheFlagIsSet) {
  const Tensor q = Tensor::ones({1, 2, 8, 4}, DType::f64);
  request_interrupt();
  EXPECT_THROW_WITH(attention_reference(q, q, q), Interrupted, "interrupted");
  EXPECT_THROW(scaled_dot_product_attention(q, q, q), Interrupted);  // f64 runs the reference
  clear_interrupt();
  EXPECT_EQ(attention_reference(q, q, q).output.shape(), (Shape{1, 2, 8, 4}));
}

}  // namespace
}  // namespace qkv
