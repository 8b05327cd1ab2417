// einsum stage 2: opt_einsum's greedy path (ssa_greedy_optimize): eager Hadamard
// products of equal label sets, then the pair removing the most memory, then
// outer products from the smallest.
#include <algorithm>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <tuple>

#include "einsum/plan.h"

namespace qkv::einsum_detail {

namespace {

// (cost, id2, id1) breaks ties deterministically, as opt_einsum does.
using Candidate = std::tuple<double, int, int, LabelSet, LabelSet, LabelSet>;  // cost, id2, id1, k1, k2, k12

struct Greedy {
  LabelSet output;
  const std::vector<int64_t>& sizes;
  std::map<LabelSet, int> remaining;  // key -> ssa id
  std::map<int, std::set<LabelSet>> dim_to_keys;
  LabelSet ref2, ref3;  // dims used by >= 2 / >= 3 keys
  std::map<LabelSet, double> footprints;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;

  Candidate candidate(LabelSet k1, LabelSet k2) {
    const LabelSet either = k1 | k2, two = k1 & k2, one = either - two;
    const LabelSet k12 = (either & output) | (two & ref3) | (one & ref2);
    const double cost = size_of(k12, sizes) - footprints[k1] - footprints[k2];
    int id1 = remaining[k1], id2 = remaining[k2];
    if (id1 > id2) std::swap(k1, k2), std::swap(id1, id2);
    return {cost, id2, id1, k1, k2, k12};
  }

  void push_best(LabelSet k1, const std::vector<LabelSet>& k2s) {
    std::optional<Candidate> best;
    for (const LabelSet& k2 : k2s) {
      Candidate c = candidate(k1, k2);
      if (!best || c < *best) best = c;
    }
    if (best) queue.push(*best);
  }

  void update_ref_counts(LabelSet dims) {
    for (int d : dims.ids()) {
      const size_t count = dim_to_keys[d].size();
      LabelSet bit;
      bit.add(d);
      ref2 = count >= 2 ? ref2 | bit : ref2 - bit;
      ref3 = count >= 3 ? ref3 | bit : ref3 - bit;
    }
  }
};

}  // namespace

Path greedy_path(const std::vector<LabelSet>& inputs, LabelSet output, const std::vector<int64_t>& sizes) {
  if (inputs.size() == 1) return {{0}};
  LabelSet common = inputs[0];
  for (const LabelSet& s : inputs) common = common & s;
  Greedy g{output | common, sizes, {}, {}, {}, {}, {}, {}};
  int next_id = static_cast<int>(inputs.size());
  Path ssa;
  std::vector<LabelSet> order;  // keys by first insertion, for the initial candidates
  for (size_t id = 0; id < inputs.size(); ++id) {
    const LabelSet key = inputs[id];
    if (auto it = g.remaining.find(key); it != g.remaining.end()) {
      ssa.push_back({it->second, static_cast<int>(id)});
      it->second = next_id++;
    } else {
      g.remaining[key] = static_cast<int>(id);
      order.push_back(key);
    }
  }
  for (const LabelSet& key : order)
    for (int d : (key - g.output).ids()) g.dim_to_keys[d].insert(key);
  for (const auto& [d, keys] : g.dim_to_keys) {
    LabelSet bit;
    bit.add(d);
    if (keys.size() >= 2) g.ref2 = g.ref2 | bit;
    if (keys.size() >= 3) g.ref3 = g.ref3 | bit;
  }
  for (const LabelSet& key : order) g.footprints[key] = size_of(key, sizes);
  for (const auto& [d, keys] : g.dim_to_keys) {
    std::vector<LabelSet> sorted(keys.begin(), keys.end());
    std::sort(sorted.begin(), sorted.end(),
              [&](const LabelSet& a, const LabelSet& b) { return g.remaining[a] < g.remaining[b]; });
    for (size_t i = 0; i + 1 < sorted.size(); ++i) {
      g.push_best(sorted[i], std::vector<LabelSet>(sorted.begin() + static_cast<std::ptrdiff_t>(i) + 1, sorted.end()));
    }
  }
  while (!g.queue.empty()) {
    const auto [cost, id2, id1, k1, k2, k12] = g.queue.top();
    g.queue.pop();
    if (!g.remaining.count(k1) || !g.remaining.count(k2)) continue;  // obsolete
    const int s1 = g.remaining[k1], s2 = g.remaining[k2];
    g.remaining.erase(k1);
    g.remaining.erase(k2);
    for (int d : (k1 - g.output).ids()) g.dim_to_keys[d].erase(k1);
    for (int d : (k2 - g.output).ids()) g.dim_to_keys[d].erase(k2);
    ssa.push_back({s1, s2});
    if (auto it = g.remaining.find(k12); it != g.remaining.end()) {
      ssa.push_back({it->second, next_id++});
    } else {
      for (int d : (k12 - g.output).ids()) g.dim_to_keys[d].insert(k12);
    }
    g.remaining[k12] = next_id++;
    g.update_ref_counts(k1 | (k2 - g.output));
    g.footprints[k12] = size_of(k12, sizes);
    std::set<LabelSet> k2s;
    for (int d : k12.ids())
      if (auto it = g.dim_to_keys.find(d); it != g.dim_to_keys.end()) k2s.insert(it->second.begin(), it->second.end());
    k2s.erase(k12);
    if (!k2s.empty()) g.push_best(k12, std::vector<LabelSet>(k2s.begin(), k2s.end()));
  }
  // Outer products, smallest first.
  using Item = std::tuple<double, int, LabelSet>;
  std::priority_queue<Item, std::vector<Item>, std::greater<>> final_queue;
  for (const auto& [key, id] : g.remaining) final_queue.emplace(size_of(key & g.output, sizes), id, key);
  auto [c1, id1, k1] = final_queue.top();
  final_queue.pop();
  while (!final_queue.empty()) {
    const auto [c2, id2, k2] = final_queue.top();
    final_queue.pop();
    ssa.push_back({std::min(id1, id2), std::max(id1, id2)});
    const LabelSet k12 = (k1 | k2) & g.output;
    final_queue.emplace(size_of(k12, sizes), next_id++, k12);
    std::tie(c1, id1, k1) = final_queue.top();
    final_queue.pop();
  }
  return ssa_to_linear(ssa);
}

}  // namespace qkv::einsum_detail
