// The float64 attention-backward oracle against central finite differences of the
// float64 forward oracle (attention_reference), one test per forward option, and
// the public backward's checks. Criterion: |fd - grad| <= 1e-7 * max(1, max|grad|)
// with step h = 1e-5 (truncation ~h^2, rounding ~1e-16 |loss| / h: both ~1e-10).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "common/expect.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"

namespace qkv {
namespace {

// loss = sum(out * g): its gradient with respect to out is g.
double loss(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& g, const AttentionOptions& o) {
  const auto out = attention_reference(q, k, v, o).output.to_vector<double>();
  const auto gv = g.to_vector<double>();
  double sum = 0.0;
  for (size_t i = 0; i < out.size(); ++i) sum += out[i] * gv[i];
  return sum;
}

// Compares `grad` (of operand `which` of {q, k, v}) with central differences.
void expect_matches_fd(std::array<Tensor, 3> qkv, int which, const Tensor& grad, const Tensor& g,
                       const AttentionOptions& o, const char* name) {
  const Tensor x = qkv[static_cast<size_t>(which)];  // contiguous f64, perturbed in place
  const auto gr = grad.to_vector<double>();
  ASSERT_EQ(grad.shape(), x.shape()) << name;
  double scale = 1.0;
  for (double v : gr) scale = std::max(scale, std::fabs(v));
  constexpr double h = 1e-5;
  auto* data = x.data<double>();
  for (int64_t e = 0; e < x.numel(); ++e) {
    const double saved = data[e];
    data[e] = saved + h;
    const double up = loss(qkv[0], qkv[1], qkv[2], g, o);
    data[e] = saved - h;
    const double down = loss(qkv[0], qkv[1], qkv[2], g, o);
    data[e] = saved;
    EXPECT_NEAR(gr[static_cast<size_t>(e)], (up - down) / (2 * h), 1e-7 * scale) << name << " element " << e;
  }
}

void check_fd(const Shape& qs, const Shape& ks, const Shape& vs, const AttentionOptions& o, uint64_t seed = 1) {
  const Tensor q = Tensor::randn(qs, seed, DType::f64), k = Tensor::randn(ks, seed + 1, DType::f64);
  const Tensor v = Tensor::randn(vs, seed + 2, DType::f64);
  const Tensor out = attention_reference(q, k, v, o).output;
  const Tensor g = Tensor::randn(out.shape(), seed + 3, DType::f64);
  const AttentionGradients grads = attention_backward_reference(q, k, v, g, o);
  expect_matches_fd({q, k, v}, 0, grads.dq, g, o, "dq");
  expect_matches_fd({q, k, v}, 1, grads.dk, g, o, "dk");
  expect_matches_fd({q, k, v}, 2, grads.dv, g, o, "dv");
}

TEST(AttentionBackwardReference, PlainMatchesFiniteDifferences) { check_fd({2, 3, 4}, {2, 5, 4}, {2, 5, 4}, {}); }

TEST(AttentionBackwardReference, DkNeDvLqNeLkAndScale) {
  AttentionOptions o;
  o.scale = 0.7;
  check_fd({1, 2, 4, 3}, {1, 2, 6, 3}, {1, 2, 6, 5}, o);
  o.scale = 0.0;  // every score 0: dq and dk are 0, dv the average's gradient
  check_fd({2, 3, 2}, {2, 4, 2}, {2, 4, 3}, o);
}

TEST(AttentionBackwardReference, Causal) {
  AttentionOptions o;
  o.is_causal = true;
  check_fd({2, 5, 3}, {2, 5, 3}, {2, 5, 2}, o);
  check_fd({1, 6, 3}, {1, 4, 3}, {1, 4, 2}, o);  // Lq > Lk: top-left aligned
}

TEST(AttentionBackwardReference, BoolMaskBroadcastWithFullyMaskedRow) {
  AttentionOptions o;
  // [Lq=3, Lk=4] broadcast over the batch; row 1 masks every key (zero gradient).
  o.attn_mask =
      Tensor::from_vector<bool>({true, false, true, true, false, false, false, false, true, true, false, true}, {3, 4});
  check_fd({2, 3, 3}, {2, 4, 3}, {2, 4, 2}, o);
  const Tensor q = Tensor::randn({2, 3, 3}, 5, DType::f64), k = Tensor::randn({2, 4, 3}, 6, DType::f64);
  const Tensor v = Tensor::randn({2, 4, 2}, 7, DType::f64), g = Tensor::randn({2, 3, 2}, 8, DType::f64);
  const auto grads = attention_backward_reference(q, k, v, g, o);
  for (int64_t b = 0; b < 2; ++b) {
    for (int64_t d = 0; d < 3; ++d) EXPECT_EQ(grads.dq.item({b, 1, d}), 0.0);
  }
}

TEST(AttentionBackwardReference, FloatMask) {
  AttentionOptions o;
  o.attn_mask = Tensor::randn({1, 3, 4}, 9, DType::f64);
  check_fd({2, 3, 3}, {2, 4, 3}, {2, 4, 2}, o);
}

TEST(AttentionBackwardReference, GqaSumsOverTheGroup) {
  AttentionOptions o;
  o.enable_gqa = true;
  check_fd({1, 4, 3, 2}, {1, 2, 4, 2}, {1, 2, 4, 3}, o);
}

TEST(AttentionBackwardReference, BroadcastBatchSumsOverReaders) {
  check_fd({2, 1, 3, 2}, {1, 3, 4, 2}, {1, 3, 4, 2}, {});  // batch [2, 3]
}

TEST(AttentionBackwardReference, DropoutFromTheSeed) {
  AttentionOptions o;
  o.dropout_p = 0.4;
  o.seed = 17;
  check_fd({2, 4, 3}, {2, 5, 3}, {2, 5, 2}, o);
}

TEST(AttentionBackwardReference, PublicBackwardChecksSavedShapes) {
  const Tensor q = Tensor::randn({2, 3, 4}, 1), k = Tensor::randn({2, 5, 4}, 2), v = Tensor::randn({2, 5, 6}, 3);
  AttentionOptions o;
  o.return_logsumexp = true;
  const auto fwd = scaled_dot_product_attention(q, k, v, o);
  const Tensor g = Tensor::randn({2, 3, 6}, 4);
  const auto grads = scaled_dot_product_attention_backward(q, k, v, fwd.output, g, *fwd.logsumexp, o);
  const auto ref = attention_backward_reference(q, k, v, g, o);
  EXPECT_EQ(grads.dq.dtype(), DType::f32);
  EXPECT_EQ(grads.dv.shape(), v.shape());
  const auto got = grads.dq.to_vector<double>(), want = ref.dq.to_vector<double>();  // the fused f32 kernel
  for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5) << i;
  EXPECT_THROW_WITH(scaled_dot_product_attention_backward(q, k, v, fwd.output, g.slice(2, 0, 5), *fwd.logsumexp, o),
                    ShapeError, "scaled_dot_product_attention_backward: grad_out must have shape [2, 3, 6]");
  EXPECT_THROW_WITH(scaled_dot_product_attention_backward(q, k, v, fwd.output, g, fwd.output, o), ShapeError,
                    "logsumexp must have shape [2, 3] (q [2, 3, 4], k [2, 5, 4], v [2, 5, 6]), got [2, 3, 6]");
  EXPECT_THROW_WITH(attention_backward_reference(q, k, v.slice(1, 0, 4), g, o), ShapeError,
                    "attention_backward_reference");
}

}  // namespace
}  // namespace qkv
