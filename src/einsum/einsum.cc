// einsum: the public entry points. parse -> plan -> contract, plus the path report.
#include "qkv/einsum.h"

#include <algorithm>
#include <cstdio>

#include "einsum/contract.h"
#include "einsum/parse.h"
#include "einsum/plan.h"
#include "qkv/ascii.h"

namespace qkv {

namespace ed = einsum_detail;

namespace {

struct OptimizeName {
  const char* name;
  EinsumOptimize value;
};
constexpr OptimizeName kOptimizeNames[] = {
    {"false", EinsumOptimize::none},
    {"none", EinsumOptimize::none},
    {"auto", EinsumOptimize::auto_},
    {"true", EinsumOptimize::auto_},
    {"greedy", EinsumOptimize::greedy},
    {"optimal", EinsumOptimize::optimal},
    {"dp", EinsumOptimize::dp},
    {"branch-all", EinsumOptimize::branch_all},
    {"branch-2", EinsumOptimize::branch_2},
    {"branch-1", EinsumOptimize::branch_1},
};

// The path: explicit (checked) or found by the chosen optimizer.
ed::Path resolve_path(const ed::Spec& spec, const EinsumOptions& options) {
  const size_t n = spec.inputs.size();
  if (!options.path) {
    std::vector<ed::LabelSet> sets;
    for (size_t i = 0; i < n; ++i) sets.push_back(spec.input_set(i));
    return ed::find_path(sets, spec.output_set(), spec.sizes, options.optimize, options.memory_limit);
  }
  size_t count = n;
  for (size_t s = 0; s < options.path->size(); ++s) {
    std::vector<int> step = (*options.path)[s];
    std::sort(step.begin(), step.end());
    const bool bad = step.empty() || step.front() < 0 || static_cast<size_t>(step.back()) >= count ||
                     std::adjacent_find(step.begin(), step.end()) != step.end();
    if (bad) {
      ed::fail_eq<ValueError>(spec.equation, spec.shapes, "invalid explicit path: step ", s,
                              " does not name distinct positions among the ", count, " current operands");
    }
    count = count - step.size() + 1;
  }
  if (count != 1) {
    ed::fail_eq<ValueError>(spec.equation, spec.shapes, "invalid explicit path: ", count - 1,
                            " more operand(s) would still have to be contracted");
  }
  if (options.path->empty()) return {{0}};  // one operand, no steps given: its own step
  return *options.path;
}

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

// Kernel a step would use on contiguous inputs (opt_einsum's can_blas, with batch labels).
std::string classify(const std::vector<ed::LabelSet>& step, ed::LabelSet keep, double flops) {
  if (step.size() == 1) return (step[0] - keep).empty() ? "VIEW" : "DIRECT";
  if (step.size() > 2) return "PAIRWISE";
  const ed::LabelSet k = (step[0] & step[1]) - keep;
  return (k.empty() || flops < 2 * 4096) ? "DIRECT" : "GEMM";
}

std::string report(const EinsumPath& p) {
  std::string r = "  Complete contraction:  " + p.equation + "\n";
  r += "         Naive scaling:  " + std::to_string(p.naive_scaling) + "\n";
  r += "     Optimized scaling:  " + std::to_string(p.optimized_scaling) + "\n";
  r += "      Naive FLOP count:  " + fmt("%.3e", p.naive_flops) + "\n";
  r += "  Optimized FLOP count:  " + fmt("%.3e", p.optimized_flops) + "\n";
  r += "   Theoretical speedup:  " + fmt("%3.3f", p.naive_flops / std::max(p.optimized_flops, 1.0)) + "\n";
  r += "  Largest intermediate:  " + fmt("%.3e", p.largest_intermediate) + " elements\n";
  r += std::string(74, '-') + "\n";
  char line[256];
  std::snprintf(line, sizeof line, "%6s %24s %40s\n", "scaling", "current", "remaining");
  r += line + std::string(74, '-');
  return r;
}

EinsumPath describe(const ed::Spec& spec, const ed::Path& path) {
  EinsumPath p;
  p.path = path;
  p.equation = spec.full_equation();
  std::vector<ed::LabelSet> sets;
  std::vector<std::string> terms;
  ed::LabelSet all;
  int set_sizes = 0;
  for (size_t i = 0; i < spec.inputs.size(); ++i) {
    sets.push_back(spec.input_set(i));
    terms.push_back(spec.term(spec.inputs[i]));
    all = all | sets.back();
    set_sizes += sets.back().count();
  }
  p.naive_scaling = all.count();
  p.naive_flops = ed::flop_count(all, set_sizes > all.count(), static_cast<int>(sets.size()), spec.sizes);
  const ed::LabelSet out = spec.output_set();
  std::string rows;
  for (size_t s = 0; s < path.size(); ++s) {
    std::vector<int> ids = path[s];
    std::sort(ids.rbegin(), ids.rend());
    std::vector<ed::LabelSet> step;
    std::string current;
    ed::LabelSet contract;
    for (int id : ids) {
      step.push_back(sets[static_cast<size_t>(id)]);
      contract = contract | step.back();
      current += (id == ids.front() ? "" : ",") + terms[static_cast<size_t>(id)];  // a scalar's term is ""
      sets.erase(sets.begin() + id);
      terms.erase(terms.begin() + id);
    }
    ed::LabelSet keep = out;
    for (const auto& x : sets) keep = keep | x;
    const ed::LabelSet result = contract & keep;
    std::string result_term;
    if (s + 1 == path.size()) {
      result_term = spec.term(spec.output);
    } else {  // numpy's order: by (size, letter)
      std::vector<std::pair<int64_t, char>> labels;
      for (int l : result.ids())
        labels.emplace_back(spec.sizes[static_cast<size_t>(l)], spec.symbols[static_cast<size_t>(l)]);
      std::sort(labels.begin(), labels.end());
      for (const auto& label : labels) result_term += label.second;
    }
    EinsumStep st;
    st.operands = path[s];
    std::sort(st.operands.begin(), st.operands.end());
    st.einsum = current + "->" + result_term;
    st.scaling = contract.count();
    st.flops = ed::flop_count(contract, !(contract - keep).empty(), static_cast<int>(ids.size()), spec.sizes);
    st.size = ed::size_of(result, spec.sizes);
    st.kernel = classify(step, keep, st.flops);
    sets.push_back(result);
    terms.push_back(result_term);
    p.optimized_flops += st.flops;
    p.optimized_scaling = std::max(p.optimized_scaling, st.scaling);
    p.largest_intermediate = std::max(p.largest_intermediate, st.size);
    std::string remaining;
    for (size_t t = 0; t < terms.size(); ++t) remaining += (t == 0 ? "" : ",") + terms[t];
    char line[512];
    std::snprintf(line, sizeof line, "\n%4d    %24s %40s", st.scaling, st.einsum.c_str(),
                  (remaining + "->" + spec.term(spec.output)).c_str());
    rows += line;
    p.steps.push_back(std::move(st));
  }
  p.report = report(p) + rows;
  return p;
}

}  // namespace

EinsumOptimize einsum_optimize_from_name(std::string_view name) {
  const std::string lower = ascii_lower(name);
  if (lower == "dynamic-programming") return EinsumOptimize::dp;
  for (const auto& o : kOptimizeNames)
    if (lower == o.name) return o.value;
  fail<ValueError>("einsum: unknown optimize option '", name,
                   "' (expected false, true, auto, greedy, optimal, dp, branch-all, branch-2, branch-1)");
}

std::string_view einsum_optimize_name(EinsumOptimize optimize) {
  for (const auto& o : kOptimizeNames)
    if (o.value == optimize && std::string_view(o.name) != "none" && std::string_view(o.name) != "true") return o.name;
  return "false";
}

Tensor einsum(std::string_view equation, std::span<const Tensor> operands, const EinsumOptions& options) {
  require_cpu("einsum", operands);  // the CPU kernels below; another device's would be picked here
  const std::vector<Shape> shapes = ed::shapes_of(operands);
  const AllocationScope scope("einsum", equation, shapes);  // names the call in size errors
  try {
    const ed::Spec spec = ed::parse(equation, shapes);
    return ed::execute(spec, operands, resolve_path(spec, options), nullptr);
  } catch (const std::bad_alloc&) {
    scope.fail_bad_alloc();
  }
}

Tensor einsum(std::string_view equation, std::initializer_list<Tensor> operands, const EinsumOptions& options) {
  return einsum(equation, std::span<const Tensor>(operands.begin(), operands.size()), options);
}

EinsumPath einsum_path(std::string_view equation, std::span<const Shape> shapes, const EinsumOptions& options) {
  const ed::Spec spec = ed::parse(equation, shapes);
  return describe(spec, resolve_path(spec, options));
}

EinsumPath einsum_path(std::string_view equation, std::span<const Tensor> operands, const EinsumOptions& options) {
  const std::vector<Shape> shapes = ed::shapes_of(operands);
  return einsum_path(equation, std::span<const Shape>(shapes), options);
}

}  // namespace qkv
