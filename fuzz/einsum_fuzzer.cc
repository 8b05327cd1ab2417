// libFuzzer target: qkv's einsum equation parser and path planner over random
// equations and operand shapes (0, huge dims near 2^62 / 2^63, negative ones),
// every optimizer, memory limits and explicit paths; and, when the operands and
// the work are small, qkv::einsum itself on small integer-valued tensors of any
// dtype and layout, compared exactly with qkv::einsum_reference (float64 loops).
//
// A qkv::Error is a normal outcome; a crash, a sanitizer report, another exception,
// a path inconsistent with its report, or a result that differs from the
// reference is a finding (std::abort).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "qkv/einsum.h"

namespace {

using qkv::Shape;

constexpr qkv::EinsumOptimize kOptimizers[] = {
    qkv::EinsumOptimize::auto_,    qkv::EinsumOptimize::greedy,     qkv::EinsumOptimize::optimal,
    qkv::EinsumOptimize::dp,       qkv::EinsumOptimize::branch_all, qkv::EinsumOptimize::branch_2,
    qkv::EinsumOptimize::branch_1, qkv::EinsumOptimize::none,
};

// Letters and "..." per input term, read loosely from the equation (the fuzzer's
// guess at the ranks that fit, so that most inputs get past the rank checks).
struct TermGuess {
  int letters = 0;
  bool ellipsis = false;
};

std::vector<TermGuess> guess_terms(const std::string& equation) {
  std::vector<TermGuess> terms(1);
  for (size_t i = 0; i < equation.size(); ++i) {
    const char c = equation[i];
    if (c == '-' && i + 1 < equation.size() && equation[i + 1] == '>') break;
    if (c == ',') terms.emplace_back();
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) ++terms.back().letters;
    if (equation.compare(i, 3, "...") == 0) terms.back().ellipsis = true, i += 2;
  }
  return terms;
}

int label_of(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  return -1;
}

// One shape per term: each label keeps one size across operands (drawn once), the
// "..." covers 0-3 dims (rarely up to 90), and now and then a dim is 1 (broadcast),
// redrawn, or the operand count / a rank is off by one.
std::vector<Shape> draw_shapes(FuzzedDataProvider& fdp, const std::string& equation) {
  std::vector<TermGuess> terms = guess_terms(equation);
  const uint8_t count_tweak = fdp.ConsumeIntegral<uint8_t>();
  if (count_tweak == 255 && terms.size() > 1) terms.pop_back();
  if (count_tweak == 254) terms.emplace_back();
  std::vector<int64_t> label_size(52, -1), ellipsis_size(96, -1);
  std::vector<Shape> shapes;
  size_t pos = 0;  // scans the equation's terms alongside
  for (size_t t = 0; t < terms.size(); ++t) {
    int ell = 0;
    if (terms[t].ellipsis) {
      const uint8_t e = fdp.ConsumeIntegral<uint8_t>();
      ell = e < 250 ? e % 4 : 4 + e % 87;
    }
    Shape shape;
    bool ellipsis_done = false;
    for (; pos < equation.size() && equation[pos] != ',' && equation.compare(pos, 2, "->") != 0; ++pos) {
      const int l = label_of(equation[pos]);
      if (equation.compare(pos, 3, "...") == 0 && !ellipsis_done) {
        for (int j = 0; j < ell; ++j) {
          int64_t& s = ellipsis_size[static_cast<size_t>(ell - 1 - j)];  // right-aligned, as numpy
          if (s < 0) s = qkv_fuzz::draw_dim(fdp, j);
          shape.push_back(s);
        }
        ellipsis_done = true;
        pos += 2;
        continue;
      }
      if (l < 0) continue;
      int64_t& s = label_size[static_cast<size_t>(l)];
      if (s < 0) s = qkv_fuzz::draw_dim(fdp, l);
      const uint8_t tweak = fdp.ConsumeIntegral<uint8_t>();
      shape.push_back(tweak < 240 ? s : tweak < 248 ? 1 : qkv_fuzz::draw_dim(fdp, l));
    }
    if (pos < equation.size() && equation[pos] == ',') ++pos;
    const uint8_t rank_tweak = fdp.ConsumeIntegral<uint8_t>();
    if (rank_tweak == 255 && !shape.empty()) shape.pop_back();
    if (rank_tweak == 254) shape.push_back(2);
    shapes.push_back(std::move(shape));
  }
  return shapes;
}

qkv::EinsumOptions draw_options(FuzzedDataProvider& fdp, size_t n_operands) {
  qkv::EinsumOptions o;
  o.optimize = kOptimizers[fdp.ConsumeIntegral<uint8_t>() % 8];
  // optimal and branch-all are exhaustive searches and branch-2 visits 2^(n-1) paths:
  // exponential in the operand count by design (as opt_einsum's, whose "auto" picks
  // them for <= 6 and <= 8 operands only); past that a fuzz input would only time out.
  const bool exhaustive = o.optimize == qkv::EinsumOptimize::optimal || o.optimize == qkv::EinsumOptimize::branch_all;
  if ((exhaustive && n_operands > 6) || (o.optimize == qkv::EinsumOptimize::branch_2 && n_operands > 10)) {
    o.optimize = qkv::EinsumOptimize::greedy;
  }
  const uint8_t limit = fdp.ConsumeIntegral<uint8_t>();
  if (limit >= 200) {
    static constexpr int64_t kLimits[] = {0, 1, 2, 16, 1000, int64_t{1} << 20, -1, INT64_MAX};
    o.memory_limit = limit < 248 ? kLimits[limit % 8] : fdp.ConsumeIntegral<int64_t>();
  }
  if (fdp.ConsumeIntegral<uint8_t>() >= 240) {  // an explicit path, valid or not
    std::vector<std::vector<int>> path(fdp.ConsumeIntegralInRange<size_t>(0, n_operands + 1));
    for (auto& step : path) {
      step.resize(fdp.ConsumeIntegralInRange<size_t>(0, 3));
      for (int& i : step) i = fdp.ConsumeIntegralInRange<int>(-1, static_cast<int>(n_operands));
    }
    o.path = std::move(path);
  }
  return o;
}

void check_path(const qkv::EinsumPath& p) {
  if (p.steps.size() != p.path.size() || p.report.empty() || p.equation.find("->") == std::string::npos) {
    std::fprintf(stderr, "einsum_path: %zu steps for a path of %zu, report of %zu chars\n", p.steps.size(),
                 p.path.size(), p.report.size());
    std::abort();
  }
}

// Runs einsum and the float64 reference on small integer-valued tensors; both see
// the same (possibly strided) operands and must agree exactly.
void run_small(FuzzedDataProvider& fdp, const std::string& equation, const std::vector<Shape>& shapes,
               const qkv::EinsumOptions& options) {
  std::vector<qkv::Tensor> operands;
  for (const Shape& s : shapes) operands.push_back(qkv_fuzz::make_tensor(fdp, s, qkv_fuzz::draw_dtype(fdp)));
  const qkv::Tensor got = qkv::einsum(equation, operands, options);
  const qkv::Tensor want = qkv::einsum_reference(equation, operands);
  if (got.shape() != want.shape() || got.dtype() != want.dtype() ||
      got.to_vector<double>() != want.to_vector<double>()) {
    std::fprintf(stderr, "einsum('%s'): result differs from einsum_reference\n got  %s\n want %s\n", equation.c_str(),
                 got.to_string().c_str(), want.to_string().c_str());
    std::abort();
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  qkv_fuzz::init_process();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  const std::string equation = fdp.ConsumeRandomLengthString(256);
  try {
    const std::vector<Shape> shapes = draw_shapes(fdp, equation);
    if (shapes.size() > 24) return 0;  // past this the planners' cost is the whole story
    const qkv::EinsumOptions options = draw_options(fdp, shapes.size());
    const qkv::EinsumPath path = qkv::einsum_path(equation, shapes, options);
    check_path(path);
    // Small enough to run: every operand <= 256 elements, the reference's loop over
    // all labels <= 2e5 iterations and the chosen path <= 2e6 flops.
    for (const Shape& s : shapes) {
      const auto n = qkv_fuzz::checked_numel(s);
      if (!n || *n > 256) return 0;
    }
    if (path.naive_flops > 2e5 || path.optimized_flops > 2e6) return 0;
    run_small(fdp, equation, shapes, options);
  } catch (const qkv::Error&) {
  }
  return 0;
}
