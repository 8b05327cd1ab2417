// einsum stage 2: path finders, ported from opt_einsum's paths.py (optimal, branch
// and bound, greedy) plus an exact dynamic program over operand subsets.
#include "einsum/plan.h"

#include <algorithm>
#include <limits>
#include <map>
#include <numeric>
#include <queue>
#include <set>
#include <tuple>

namespace qkv::einsum_detail {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr int kMaxDpOperands = 14;

LabelSet union_of(const std::vector<LabelSet>& sets, const std::vector<int>& ids, int skip1, int skip2) {
  LabelSet u;
  for (int r : ids)
    if (r != skip1 && r != skip2) u = u | sets[static_cast<size_t>(r)];
  return u;
}

// opt_einsum's calc_k12_flops: result labels and cost of contracting i and j. The
// search heuristics count an inner product when a shared label is summed (as
// opt_einsum's search does); `exact` counts any summed label, as contract_path's
// reported cost does (they differ when a label of only one operand is summed).
std::pair<LabelSet, double> calc_k12(const std::vector<LabelSet>& inputs, LabelSet output,
                                     const std::vector<int>& remaining, int i, int j, const std::vector<int64_t>& sizes,
                                     bool exact = false) {
  const LabelSet k1 = inputs[static_cast<size_t>(i)], k2 = inputs[static_cast<size_t>(j)];
  const LabelSet keep = output | union_of(inputs, remaining, i, j);
  const LabelSet either = k1 | k2;
  const LabelSet summed = (exact ? either : (k1 & k2)) - keep;
  return {either & keep, flop_count(either, !summed.empty(), 2, sizes)};
}

double oversize_flops(const std::vector<LabelSet>& inputs, const std::vector<int>& remaining, LabelSet output,
                      const std::vector<int64_t>& sizes) {
  const LabelSet all = union_of(inputs, remaining, -1, -1);
  return flop_count(all, !(all - output).empty(), static_cast<int>(remaining.size()), sizes);
}

std::vector<int> without_pair_plus(const std::vector<int>& remaining, int i, int j, int added) {
  std::vector<int> out;
  for (int r : remaining)
    if (r != i && r != j) out.push_back(r);
  out.push_back(added);
  return out;
}

// ---- optimal -------------------------------------------------------------------
struct Optimal {
  LabelSet output;
  const std::vector<int64_t>& sizes;
  std::optional<int64_t> limit;
  double best_flops = kInf;
  Path best;

  void iterate(const Path& path, const std::vector<int>& remaining, std::vector<LabelSet>& inputs, double flops) {
    if (remaining.size() == 1) {
      best_flops = flops;
      best = path;
      return;
    }
    for (size_t a = 0; a < remaining.size(); ++a) {
      for (size_t b = a + 1; b < remaining.size(); ++b) {
        const int i = remaining[a], j = remaining[b];
        const auto [k12, flops12] = calc_k12(inputs, output, remaining, i, j, sizes, /*exact=*/true);
        double new_flops = flops + flops12;
        if (new_flops >= best_flops) continue;
        if (limit && size_of(k12, sizes) > static_cast<double>(*limit)) {
          new_flops = flops + oversize_flops(inputs, remaining, output, sizes);
          if (new_flops < best_flops) {
            best_flops = new_flops;
            best = path;
            best.push_back(remaining);
          }
          continue;
        }
        Path next = path;
        next.push_back({i, j});
        inputs.push_back(k12);
        iterate(next, without_pair_plus(remaining, i, j, static_cast<int>(inputs.size() - 1)), inputs, new_flops);
        inputs.pop_back();
      }
    }
  }
};

// ---- branch and bound ---------------------------------------------------------------
struct Branch {
  LabelSet output;
  const std::vector<int64_t>& sizes;
  std::optional<int64_t> limit;
  int nbranch;
  double best_flops = kInf, best_size = kInf;
  Path best;
  std::map<size_t, double> best_progress;

  using Candidate = std::tuple<double, double, double, double, std::pair<int, int>, LabelSet>;

  std::optional<Candidate> assess(const Path& path, const std::vector<LabelSet>& inputs,
                                  const std::vector<int>& remaining, int i, int j, double flops, double size) {
    const auto [k12, flops12] = calc_k12(inputs, output, remaining, i, j, sizes);
    const double size12 = size_of(k12, sizes);
    const double new_flops = flops + flops12, new_size = std::max(size, size12);
    if (!(std::make_pair(new_flops, new_size) < std::make_pair(best_flops, best_size))) return std::nullopt;
    auto [it, inserted] = best_progress.try_emplace(inputs.size(), kInf);
    if (new_flops < it->second) {
      it->second = new_flops;
    } else if (new_flops > 4 * it->second) {
      return std::nullopt;
    }
    if (limit && size12 > static_cast<double>(*limit)) {
      const double all = flops + oversize_flops(inputs, remaining, output, sizes);
      if (all < best_flops) {
        best_flops = all;
        best = path;
        best.push_back(remaining);
      }
      return std::nullopt;
    }
    const double cost =
        size12 - size_of(inputs[static_cast<size_t>(i)], sizes) - size_of(inputs[static_cast<size_t>(j)], sizes);
    return Candidate{cost, flops12, new_flops, new_size, {i, j}, k12};
  }

  void iterate(const Path& path, std::vector<LabelSet>& inputs, const std::vector<int>& remaining, double flops,
               double size) {
    if (remaining.size() == 1) {
      best_size = size;
      best_flops = flops;
      best = path;
      return;
    }
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> candidates;
    for (bool outer : {false, true}) {
      for (size_t a = 0; a < remaining.size(); ++a) {
        for (size_t b = a + 1; b < remaining.size(); ++b) {
          const int i = remaining[a], j = remaining[b];
          if (!outer && (inputs[static_cast<size_t>(i)] & inputs[static_cast<size_t>(j)]).empty()) continue;
          if (auto c = assess(path, inputs, remaining, i, j, flops, size)) candidates.push(*c);
        }
      }
      if (!candidates.empty()) break;
    }
    for (int bi = 0; (nbranch == 0 || bi < nbranch) && !candidates.empty(); ++bi) {
      const Candidate c = candidates.top();
      candidates.pop();
      const auto [i, j] = std::get<4>(c);
      Path next = path;
      next.push_back({i, j});
      inputs.push_back(std::get<5>(c));
      iterate(next, inputs, without_pair_plus(remaining, i, j, static_cast<int>(inputs.size() - 1)), std::get<2>(c),
              std::get<3>(c));
      inputs.pop_back();
    }
  }
};

std::vector<int> iota_ids(size_t n) {
  std::vector<int> ids(n);
  std::iota(ids.begin(), ids.end(), 0);
  return ids;
}

}  // namespace

// Without ids()' vector: the dp planner calls this for every split of every subset (3^14
// times for 14 operands), and the allocations made one such plan take 4 s under ASan
// (an einsum fuzz timeout).
double size_of(LabelSet s, const std::vector<int64_t>& sizes) {
  double n = 1;
  s.for_each([&](int l) { n *= static_cast<double>(sizes[static_cast<size_t>(l)]); });
  return n;
}

double flop_count(LabelSet idx, bool inner, int num_terms, const std::vector<int64_t>& sizes) {
  return size_of(idx, sizes) * (std::max(1, num_terms - 1) + (inner ? 1 : 0));
}

Path ssa_to_linear(const Path& ssa) {
  size_t n = 1;
  for (const auto& step : ssa) n += step.size() - 1;
  std::vector<int> ids = iota_ids(n);
  int next = static_cast<int>(n);
  Path out;
  for (const auto& step : ssa) {
    std::vector<int> con;
    for (int s : step) con.push_back(static_cast<int>(std::lower_bound(ids.begin(), ids.end(), s) - ids.begin()));
    std::sort(con.begin(), con.end());
    for (auto it = con.rbegin(); it != con.rend(); ++it) ids.erase(ids.begin() + *it);
    ids.push_back(next++);
    out.push_back(std::move(con));
  }
  return out;
}

Path optimal_path(const std::vector<LabelSet>& inputs, LabelSet output, const std::vector<int64_t>& sizes,
                  std::optional<int64_t> memory_limit) {
  Optimal search{output, sizes, memory_limit, kInf, {iota_ids(inputs.size())}};
  std::vector<LabelSet> work = inputs;
  search.iterate({}, iota_ids(inputs.size()), work, 0.0);
  return ssa_to_linear(search.best);
}

Path branch_path(const std::vector<LabelSet>& inputs, LabelSet output, const std::vector<int64_t>& sizes,
                 std::optional<int64_t> memory_limit, int nbranch) {
  Branch search{output, sizes, memory_limit, nbranch, kInf, kInf, {iota_ids(inputs.size())}, {}};
  std::vector<LabelSet> work = inputs;
  search.iterate({}, work, iota_ids(inputs.size()), 0.0, 0.0);
  return ssa_to_linear(search.best);
}

Path find_path(const std::vector<LabelSet>& inputs, LabelSet output, const std::vector<int64_t>& sizes,
               EinsumOptimize optimize, std::optional<int64_t> memory_limit) {
  const size_t n = inputs.size();
  if (optimize == EinsumOptimize::none || n <= 2) return {iota_ids(n)};
  if (optimize == EinsumOptimize::auto_) {
    optimize = n <= 4    ? EinsumOptimize::optimal
               : n <= 6  ? EinsumOptimize::branch_all
               : n <= 8  ? EinsumOptimize::branch_2
               : n <= 14 ? EinsumOptimize::branch_1
                         : EinsumOptimize::greedy;
  }
  switch (optimize) {
    case EinsumOptimize::optimal: return optimal_path(inputs, output, sizes, memory_limit);
    case EinsumOptimize::branch_all: return branch_path(inputs, output, sizes, memory_limit, 0);
    case EinsumOptimize::branch_2: return branch_path(inputs, output, sizes, memory_limit, 2);
    case EinsumOptimize::branch_1: return branch_path(inputs, output, sizes, memory_limit, 1);
    case EinsumOptimize::dp: return dp_path(inputs, output, sizes, memory_limit);
    default:
      if (memory_limit) return branch_path(inputs, output, sizes, memory_limit, 1);
      return greedy_path(inputs, output, sizes);
  }
}

// ---- dynamic programming over subsets ---------------------------------------------------
// As opt_einsum's dp, labels found in one operand only (and not in the output) are
// first summed by single-operand steps; then every split of every subset of the
// operands is tried (outer products included), with contract_path's cost.
Path dp_path(const std::vector<LabelSet>& inputs, LabelSet output, const std::vector<int64_t>& sizes,
             std::optional<int64_t> memory_limit) {
  const size_t n = inputs.size();
  if (n > static_cast<size_t>(kMaxDpOperands)) {
    return memory_limit ? branch_path(inputs, output, sizes, memory_limit, 1) : greedy_path(inputs, output, sizes);
  }
  Path ssa;
  int next = static_cast<int>(n);
  std::vector<LabelSet> leaves(n);
  std::vector<int> leaf_id(n);
  for (size_t i = 0; i < n; ++i) {
    LabelSet others = output;
    for (size_t j = 0; j < n; ++j)
      if (j != i) others = others | inputs[j];
    leaves[i] = inputs[i] & others;
    leaf_id[i] = static_cast<int>(i);
    if (leaves[i] != inputs[i]) ssa.push_back({static_cast<int>(i)}), leaf_id[i] = next++;
  }
  const uint32_t full = (uint32_t{1} << n) - 1;
  std::vector<LabelSet> labels(full + 1), keep(full + 1), result(full + 1);
  for (uint32_t s = 1; s <= full; ++s)
    labels[s] = labels[s & (s - 1)] | leaves[static_cast<size_t>(std::countr_zero(s))];
  for (uint32_t s = 1; s <= full; ++s) {
    keep[s] = output | labels[full & ~s];
    result[s] = std::has_single_bit(s) ? leaves[static_cast<size_t>(std::countr_zero(s))] : labels[s] & keep[s];
  }
  std::vector<double> cost(full + 1, kInf);
  std::vector<uint32_t> split(full + 1, 0);
  for (uint32_t s = 1; s <= full; ++s) {
    if (std::has_single_bit(s)) {
      cost[s] = 0;
      continue;
    }
    if (s != full && memory_limit && size_of(result[s], sizes) > static_cast<double>(*memory_limit)) continue;
    const uint32_t low = s & (~s + 1);
    for (uint32_t a = (s - 1) & s; a > 0; a = (a - 1) & s) {
      if (!(a & low)) continue;
      const uint32_t b = s & ~a;
      if (cost[a] == kInf || cost[b] == kInf) continue;
      const LabelSet k1 = result[a], k2 = result[b];
      const double c = cost[a] + cost[b] + flop_count(k1 | k2, !((k1 | k2) - keep[s]).empty(), 2, sizes);
      if (c < cost[s]) cost[s] = c, split[s] = a;
    }
  }
  if (cost[full] == kInf) return {iota_ids(n)};
  auto emit = [&](auto&& self, uint32_t s) -> int {
    if (std::has_single_bit(s)) return leaf_id[static_cast<size_t>(std::countr_zero(s))];
    const int x = self(self, split[s]), y = self(self, s & ~split[s]);
    ssa.push_back({std::min(x, y), std::max(x, y)});
    return next++;
  };
  emit(emit, full);
  return ssa_to_linear(ssa);
}

}  // namespace qkv::einsum_detail
