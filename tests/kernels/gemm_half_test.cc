// qkv::gemm on bfloat16 / float16 operands (float32 C) against gemm_reference on the
// same 16-bit operands (double accumulation of the exact products), on oneDNN's native
// kernel where this CPU has one and on the widening path (forced, so both run on every
// machine); plus the dispatch facts the attention kernel relies on.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/gemm_test_util.h"
#include "qkv/gemm.h"

namespace qkv {
namespace {

using test::Case;
using test::plain;

// Restores the native dispatch when a test ends, also on failure.
struct WideningGuard {
  explicit WideningGuard(bool on) { detail::force_gemm_widening(on); }
  ~WideningGuard() { detail::force_gemm_widening(false); }
};

template <class H>
std::vector<H> to_half(const std::vector<float>& x) {
  std::vector<H> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = H(x[i]);
  return out;
}

// Same comparison as gemm_test_util.h's expect_matches_reference (float32
// accumulation of exact products: 1e-6 sqrt(K) of the sum of |terms|), with A and B
// rounded to H first and C in float.
template <class H>
void expect_half_matches_reference(const Case& c, uint32_t seed) {
  SCOPED_TRACE(test::describe(c));
  std::mt19937 rng(seed);
  const GemmShape& s = c.s;
  test::Buffer<float> a = test::make_buffer<float>(
      test::matrix_span(s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k, s.lda), c.batch.shape, c.batch.stride_a, rng);
  test::Buffer<float> b = test::make_buffer<float>(
      test::matrix_span(s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, s.ldb), c.batch.shape, c.batch.stride_b, rng);
  test::Buffer<float> out =
      test::make_buffer<float>(test::matrix_span(s.m, s.n, s.ldc), c.batch.shape, c.batch.stride_c, rng);
  const std::vector<H> ha = to_half<H>(a.data), hb = to_half<H>(b.data);
  test::Buffer<float> expected = out, bound = out;
  gemm(s, c.alpha, ha.data() + a.base, hb.data() + b.base, c.beta, out.ptr(), c.batch);
  gemm_reference(s, c.alpha, ha.data() + a.base, hb.data() + b.base, c.beta, expected.ptr(), c.batch);
  std::vector<H> abs_a(ha.size()), abs_b(hb.size());
  for (size_t i = 0; i < ha.size(); ++i) abs_a[i] = H(std::fabs(static_cast<float>(ha[i])));
  for (size_t i = 0; i < hb.size(); ++i) abs_b[i] = H(std::fabs(static_cast<float>(hb[i])));
  for (float& x : bound.data) x = std::fabs(x);
  gemm_reference(s, std::fabs(c.alpha), abs_a.data() + a.base, abs_b.data() + b.base, std::fabs(c.beta), bound.ptr(),
                 c.batch);
  const double rel = 1e-6 * std::sqrt(static_cast<double>(std::max<int64_t>(s.k, 1)));
  int failures = 0;
  for (size_t i = 0; i < out.data.size() && failures < 5; ++i) {
    if (std::fabs(out.data[i] - expected.data[i]) <= rel * bound.data[i]) continue;
    ++failures;
    ADD_FAILURE() << "element " << i << ": gemm " << out.data[i] << ", reference " << expected.data[i];
  }
}

// Plain cases of every transpose, padding and alpha/beta, and the batched layouts
// attention and einsum pass (heads as a batch dim with broadcast B).
template <class H>
void expect_cases_match(uint32_t seed) {
  const int64_t sizes[] = {1, 3, 16, 17, 64, 100, 129};
  const float scalars[][2] = {{1, 0}, {0.5f, 0}, {1, 1}, {-1.5f, 0.25f}};
  std::mt19937 rng(seed);
  auto pick = [&](auto& arr) { return arr[rng() % std::size(arr)]; };
  for (int trial = 0; trial < 40; ++trial) {
    Case c = plain(pick(sizes), pick(sizes), pick(sizes), rng() & 1, rng() & 2, trial % 3 == 0 ? 3 : 0);
    c.alpha = pick(scalars)[0];
    c.beta = pick(scalars)[1];
    expect_half_matches_reference<H>(c, static_cast<uint32_t>(trial));
  }
  Case batched = plain(32, 48, 64, false, true);
  batched.batch = {{3, 4}, {4 * 32 * 64, 32 * 64}, {0, 48 * 64}, {4 * 32 * 48, 32 * 48}};  // B broadcast over dim 0
  expect_half_matches_reference<H>(batched, 7);
}

class GemmHalf : public ::testing::TestWithParam<bool> {};  // param: force the widening path

TEST_P(GemmHalf, Bfloat16MatchesReference) {
  const WideningGuard guard(GetParam());
  expect_cases_match<bfloat16>(11);
}

TEST_P(GemmHalf, Float16MatchesReference) {
  const WideningGuard guard(GetParam());
  expect_cases_match<float16>(12);
}

TEST_P(GemmHalf, EmptyAndScaleOnlyCallsFollowBlasRules) {
  const WideningGuard guard(GetParam());
  float c[4] = {1, 2, 3, 4};
  gemm({false, false, 2, 2, 0, 1, 2, 2}, 1.0f, static_cast<const bfloat16*>(nullptr),
       static_cast<const bfloat16*>(nullptr), 2.0f,
       c);  // K == 0
  EXPECT_EQ(std::vector<float>(c, c + 4), (std::vector<float>{2, 4, 6, 8}));
  const float16 one(1.0f);
  gemm({false, false, 2, 2, 1, 1, 2, 2}, 0.0f, &one, &one, 0.0f, c);  // alpha == 0: C = beta C
  EXPECT_EQ(std::vector<float>(c, c + 4), (std::vector<float>{0, 0, 0, 0}));
}

TEST_P(GemmHalf, BadArgumentsNameGemm) {
  const WideningGuard guard(GetParam());
  bfloat16 a[4]{};
  float c[4];
  try {
    gemm({false, false, 2, 2, 2, /*lda=*/1, 2, 2}, 1.0f, a, a, 0.0f, c);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("gemm: lda=1"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, GemmHalf, ::testing::Values(false, true),
                         [](const auto& param) { return std::string(param.param ? "Widened" : "AsDispatched"); });

TEST(GemmHalfDispatch, NativeAnswersFollowTheCpuAndTheHook) {
  EXPECT_TRUE(gemm_has_native(DType::f32));
  EXPECT_FALSE(gemm_has_native(DType::f64));  // OpenBLAS, not oneDNN
  const bool bf16 = gemm_has_native(DType::bf16);
  std::printf("gemm_has_native: bf16 %d, f16 %d\n", bf16, gemm_has_native(DType::f16));
  {
    const WideningGuard guard(true);
    EXPECT_FALSE(gemm_has_native(DType::bf16));
    EXPECT_FALSE(gemm_has_native(DType::f16));
  }
  EXPECT_EQ(gemm_has_native(DType::bf16), bf16);
}

}  // namespace
}  // namespace qkv
