// Random valid equations (>= 1,000) with random sizes, broadcasting, diagonals,
// ellipses and strided operands: einsum (f64) against the naive reference.
#include <gtest/gtest.h>

#include <random>

#include "einsum/contract.h"
#include "einsum/einsum_test_util.h"
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
                                 EinsumOptimize::dp, EinsumOptimize::auto_, EinsumOptimize::branch_2};
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

}  // namespace
}  // namespace qkv
