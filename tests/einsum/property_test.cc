// Random valid equations (>= 1,000) with random sizes, broadcasting, diagonals,
// ellipses and strided operands: einsum (f64) against the naive reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>

#include "einsum/contract.h"
#include "einsum/einsum_test_util.h"
#include "einsum/parse.h"
#include "einsum/plan.h"
#include "qkv/einsum.h"

namespace qkv {
namespace {

struct RandomCase {
  std::string equation;
  std::vector<Tensor> operands;
};

// Up to 4 operands over 7 letters; each letter has a size 1..4; operands may repeat
// letters (diagonals), use size 1 for a letter (broadcast), carry '...', be scalars,
// or be strided views.
RandomCase random_case(std::mt19937& rng, DType dtype, int max_size) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  const std::string letters = "abcdefg";
  std::vector<int64_t> size(7);
  for (auto& s : size) s = pick(1, max_size);
  const int n_ops = pick(1, 4);
  const bool ellipsis = pick(0, 3) == 0;
  Shape ell_dims(static_cast<size_t>(pick(0, 2)));  // the dims '...' covers, right-aligned
  for (auto& d : ell_dims) d = pick(2, 3);
  std::string eq, used;
  RandomCase c;
  for (int i = 0; i < n_ops; ++i) {
    const int rank = pick(0, 4);
    std::string term;
    Shape shape;
    for (int d = 0; d < rank; ++d) {
      const int l = pick(0, 6);
      term += letters[static_cast<size_t>(l)];
      // size-1 broadcasting, except for a repeated letter (a diagonal needs equal sizes)
      const bool repeated = term.find(letters[static_cast<size_t>(l)]) != term.size() - 1;
      shape.push_back(!repeated && pick(0, 7) == 0 ? 1 : size[static_cast<size_t>(l)]);
      if (repeated) {
        for (size_t e = 0; e + 1 < term.size(); ++e)
          if (term[e] == term.back()) shape.back() = shape[e];
      }
    }
    if (ellipsis) {
      const size_t at = static_cast<size_t>(pick(0, static_cast<int>(term.size())));
      term.insert(at, "...");
      const size_t r = static_cast<size_t>(pick(0, static_cast<int>(ell_dims.size())));
      Shape ell(ell_dims.end() - static_cast<std::ptrdiff_t>(r), ell_dims.end());
      for (auto& d : ell) d = pick(0, 2) == 0 ? 1 : d;
      shape.insert(shape.begin() + static_cast<std::ptrdiff_t>(at), ell.begin(), ell.end());
    }
    used += term;
    eq += (i ? "," : "") + term;
    Tensor t = Tensor::randn(shape, rng(), dtype);
    if (t.dim() >= 2 && pick(0, 2) == 0) {  // a transposed view with the same logical shape
      Shape st = shape;
      std::swap(st[0], st[1]);
      t = Tensor::randn(st, rng(), dtype).transpose(0, 1);
    }
    c.operands.push_back(t);
  }
  if (pick(0, 1) == 0) {  // explicit output: a random subset of the used letters, shuffled
    std::string out;
    for (char l : letters)
      if (used.find(l) != std::string::npos && pick(0, 1) == 0) out += l;
    std::shuffle(out.begin(), out.end(), rng);
    if (ellipsis) out.insert(static_cast<size_t>(pick(0, static_cast<int>(out.size()))), "...");
    eq += "->" + out;
  }
  c.equation = eq;
  return c;
}

void run_random(int count, uint32_t seed, DType dtype, int max_size, double tol) {
  std::mt19937 rng(seed);
  const EinsumOptimize opts[] = {EinsumOptimize::none, EinsumOptimize::greedy, EinsumOptimize::optimal,
                                 EinsumOptimize::dp,   EinsumOptimize::auto_,  EinsumOptimize::branch_2};
  for (int n = 0; n < count; ++n) {
    const RandomCase c = random_case(rng, dtype, max_size);
    EinsumOptions options;
    options.optimize = opts[n % 6];
    const Tensor want = einsum_reference(c.equation, c.operands);
    const Tensor got = einsum(c.equation, c.operands, options);
    ASSERT_TRUE(einsum_test::all_close(got, want, tol, tol))
        << "case " << n << ": " << c.equation << " " << einsum_optimize_name(options.optimize);
  }
}

// GEMM calls of einsum's execution of `c` (its own path, its own DIRECT/GEMM choice).
int gemm_calls(const RandomCase& c, EinsumOptimize optimize) {
  const einsum_detail::Spec spec = einsum_detail::parse(c.equation, einsum_detail::shapes_of(c.operands));
  std::vector<einsum_detail::LabelSet> sets;
  for (size_t i = 0; i < c.operands.size(); ++i) sets.push_back(spec.input_set(i));
  const auto path = einsum_detail::find_path(sets, spec.output_set(), spec.sizes, optimize, {});
  einsum_detail::ExecTrace trace;
  (void)einsum_detail::execute(spec, c.operands, path, &trace);
  return trace.gemm_calls;
}

// A batched contraction A [batch, m, k] x B [batch, k, n] (-> [batch, m, n]), each
// group 0..2 letters in a random order per term, with sizes around einsum's
// DIRECT/GEMM threshold (einsum_detail::direct_flops_threshold(), 4096
// multiply-adds; all letters together at most 200,000: the naive reference loops
// over them): transposed and strided views, a size-1 (broadcast) batch dim in one
// operand, sometimes a third operand, a vector over an n letter.
RandomCase random_gemm_case(std::mt19937& rng, DType dtype) {
  auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  std::string letters = "abcdefgh";  // up to 2 letters in each of the 4 groups
  std::shuffle(letters.begin(), letters.end(), rng);
  std::string batch, m, n, k;
  std::vector<int64_t> size(128, 1);
  int64_t all = 0;
  do {
    size_t at = 0;
    auto take = [&](std::string& group, int count, int lo, int hi) {
      group.clear();
      for (int i = 0; i < count; ++i, ++at) group += letters[at], size[static_cast<size_t>(letters[at])] = pick(lo, hi);
    };
    take(batch, pick(0, 2), 1, 5);
    take(m, pick(1, 2), 2, 24);
    take(n, pick(1, 2), 2, 24);
    take(k, pick(1, 2), 2, 24);
    all = 1;
    for (char c : batch + m + n + k) all *= size[static_cast<size_t>(c)];
  } while (all > 200'000);
  auto term = [&](std::string t) {
    std::shuffle(t.begin(), t.end(), rng);
    return t;
  };
  const std::string ta = term(batch + m + k), tb = term(batch + k + n), out = term(batch + m + n);
  const char broadcast = batch.empty() || pick(0, 3) != 0 ? 0 : batch[0];  // size 1 in A
  auto operand = [&](const std::string& t, bool in_a) {
    Shape shape;
    for (char l : t) shape.push_back(in_a && l == broadcast ? 1 : size[static_cast<size_t>(l)]);
    if (shape.size() >= 2 && pick(0, 2) == 0) {  // a transposed view
      Shape st = shape;
      std::swap(st[0], st.back());
      return Tensor::randn(st, rng(), dtype).transpose(0, static_cast<int64_t>(st.size()) - 1);
    }
    if (!shape.empty() && pick(0, 3) == 0) {  // every other element of a dim twice as long
      Shape wide = shape;
      wide[0] *= 2;
      return Tensor::randn(wide, rng(), dtype).slice(0, 0, wide[0], 2);
    }
    return Tensor::randn(shape, rng(), dtype);
  };
  RandomCase c;
  c.operands = {operand(ta, true), operand(tb, false)};
  c.equation = ta + "," + tb;
  if (pick(0, 3) == 0) {
    c.operands.push_back(Tensor::randn({size[static_cast<size_t>(n[0])]}, rng(), dtype));
    c.equation += std::string(",") + n[0];
  }
  c.equation += "->" + out;
  return c;
}

// Runs `count` random batched contractions against the reference; returns how
// many of them einsum ran with a GEMM.
int run_random_gemm(int count, uint32_t seed, DType dtype, double tol) {
  std::mt19937 rng(seed);
  const EinsumOptimize opts[] = {EinsumOptimize::none, EinsumOptimize::greedy, EinsumOptimize::optimal,
                                 EinsumOptimize::auto_};
  int with_gemm = 0;
  for (int i = 0; i < count; ++i) {
    const RandomCase c = random_gemm_case(rng, dtype);
    EinsumOptions options;
    options.optimize = opts[i % 4];
    const Tensor want = einsum_reference(c.equation, c.operands);
    const Tensor got = einsum(c.equation, c.operands, options);
    EXPECT_TRUE(einsum_test::all_close(got, want, tol, tol)) << "case " << i << ": " << c.equation;
    with_gemm += gemm_calls(c, options.optimize) > 0;
  }
  return with_gemm;
}

TEST(EinsumProperty, ThousandRandomEquationsMatchReference) { run_random(1200, 2026, DType::f64, 4, 1e-12); }

TEST(EinsumProperty, RandomEquationsThroughGemmLayouts) {
  // Force every pairwise contraction with a contracted label through the GEMM layout logic.
  double& threshold = einsum_detail::direct_flops_threshold();
  const double saved = threshold;
  threshold = 0;
  run_random(600, 7, DType::f64, 4, 1e-12);
  run_random(300, 8, DType::f32, 5, 1e-4);
  threshold = saved;
}

TEST(EinsumProperty, RandomContractionsAcrossTheGemmThresholdAsEinsumChoosesIt) {
  // The random equations above use sizes 1..4, so einsum's own choice kept
  // nearly all of them DIRECT; here a good share of the cases take the GEMM path
  // (batch strides, transposed and strided operands, broadcast batch dims).
  ASSERT_EQ(einsum_detail::direct_flops_threshold(), 4096.0);
  const int f64_gemm = run_random_gemm(200, 41, DType::f64, 1e-11);
  const int f32_gemm = run_random_gemm(100, 42, DType::f32, 2e-4);
  std::printf("cases run with a GEMM: %d of 200 (f64), %d of 100 (f32)\n", f64_gemm, f32_gemm);
  EXPECT_GE(f64_gemm, 60);
  EXPECT_GE(f32_gemm, 30);
  EXPECT_LE(f64_gemm, 180);  // and some stay DIRECT: both sides of the threshold
}

}  // namespace
}  // namespace qkv
