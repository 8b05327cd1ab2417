// einsum stage 2: choosing the pairwise contraction order (opt_einsum's path finders)
// and its cost model (opt_einsum's helpers.flop_count / compute_size_by_dict).
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "einsum/parse.h"
#include "qkv/einsum.h"

namespace qkv::einsum_detail {

using Path = std::vector<std::vector<int>>;  // linear format, as numpy / opt_einsum

// Product of the sizes of the labels in `s` (compute_size_by_dict).
double size_of(LabelSet s, const std::vector<int64_t>& sizes);
// size_of(idx) * (max(1, num_terms - 1) + inner) (flop_count).
double flop_count(LabelSet idx, bool inner, int num_terms, const std::vector<int64_t>& sizes);

// The path for `inputs` (one label set per operand) contracting to `output`.
// One or two operands give the single step [0, .., n-1], as opt_einsum does.
Path find_path(const std::vector<LabelSet>& inputs, LabelSet output, const std::vector<int64_t>& sizes,
               EinsumOptimize optimize, std::optional<int64_t> memory_limit);

// Individual optimizers (exposed for tests).
Path optimal_path(const std::vector<LabelSet>& inputs, LabelSet output, const std::vector<int64_t>& sizes,
                  std::optional<int64_t> memory_limit);
Path branch_path(const std::vector<LabelSet>& inputs, LabelSet output, const std::vector<int64_t>& sizes,
                 std::optional<int64_t> memory_limit, int nbranch /* 0 = all */);
Path greedy_path(const std::vector<LabelSet>& inputs, LabelSet output, const std::vector<int64_t>& sizes);
Path dp_path(const std::vector<LabelSet>& inputs, LabelSet output, const std::vector<int64_t>& sizes,
             std::optional<int64_t> memory_limit);

// Static-single-assignment ids (inputs 0..n-1, results n, n+1, ...) to linear positions.
Path ssa_to_linear(const Path& ssa);

}  // namespace qkv::einsum_detail
