// qkv::einsum: numpy-compatible Einstein summation, planned like opt_einsum and
// executed pairwise through qkv::gemm.
//
// Semantics are numpy.einsum's: implicit output (labels appearing once, sorted
// A-Z then a-z, broadcast dims first) or explicit "->"; spaces ignored; "..." at
// the start, middle or end of a term (numpy broadcasting of the covered dims,
// right-aligned); a label repeated within a term takes the diagonal; labels absent
// from the output are summed; a labelled dim of size 1 broadcasts against the
// label's size elsewhere; scalar operands (",i->"). Labels are A-Z and a-z (52).
//
// Result dtype is numpy's result type of the operands. f32 is computed in f32
// (GEMMs through oneDNN), f64 in f64 (GEMMs through OpenBLAS); f16 and bf16 are computed in f32 and the
// result rounded back; integer and bool operands are computed in f64 (exact
// below 2^53) and converted back. A single operand without summation gives a
// view of it (as numpy), e.g. einsum("ii->i", a) shares a's storage.
//
// Errors (message "einsum('<equation>'): <fault> (shapes [..], [..])"):
// FormatError for a malformed equation (invalid character, misplaced "...",
// "->" twice, an output label repeated or absent from the inputs), ShapeError for
// shapes that do not fit it (labels vs rank, label sizes, "..." dims), ValueError
// for the operand count, a bad optimize name or an invalid explicit path.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "qkv/tensor.h"

namespace qkv {

// How the pairwise contraction order is chosen (opt_einsum's names).
enum class EinsumOptimize {
  none,        // numpy's optimize=False: one step over all operands
  greedy,      // opt_einsum greedy (memory-removed cost; branch-1 under a memory limit)
  optimal,     // exhaustive depth-first search with flop/memory sieving
  dp,          // single-operand sums first, then the least-flop tree over every split of every
               // operand subset (outer products included); greedy past 14 operands
  branch_all,  // branch and bound over every candidate
  branch_2,    // branch and bound over the best 2 candidates per step
  branch_1,    // branch and bound over the best candidate per step
  auto_,       // opt_einsum's "auto": optimal <= 4 operands, branch-all 5-6, branch-2 7-8,
               // branch-1 9-14, greedy beyond (numpy's optimize=True)
};

struct EinsumOptions {
  EinsumOptimize optimize = EinsumOptimize::auto_;
  // An explicit path (numpy/opt_einsum linear format: each step lists positions in
  // the current operand list; they are removed and the result appended). When set
  // it overrides `optimize`.
  std::optional<std::vector<std::vector<int>>> path;
  // Largest intermediate, in elements, a planner may create (opt_einsum's
  // memory_limit); when no pairwise step fits, the rest runs as one step.
  std::optional<int64_t> memory_limit;
};

// Parses "false"/"none", "true"/"auto", "greedy", "optimal", "dp", "branch-all",
// "branch-2", "branch-1" (case-insensitive); ValueError naming the string otherwise.
EinsumOptimize einsum_optimize_from_name(std::string_view name);
// The canonical name of an optimizer ("false", "auto", "greedy", ...), as accepted
// by einsum_optimize_from_name.
std::string_view einsum_optimize_name(EinsumOptimize optimize);

// One step of a contraction path, as einsum_path reports it.
struct EinsumStep {
  std::vector<int> operands;  // positions in the current operand list (ascending)
  std::string einsum;         // e.g. "bhid,bhjd->bhij" (broadcast dims as unused letters)
  int scaling = 0;            // number of distinct labels the step touches
  double flops = 0;           // opt_einsum's flop_count for the step
  double size = 0;            // elements of the step's result
  std::string kernel;         // GEMM, GEMM+COPY, DIRECT, VIEW (assuming contiguous inputs)
};

struct EinsumPath {
  std::vector<std::vector<int>> path;  // the linear path, one entry per step
  std::vector<EinsumStep> steps;
  std::string equation;             // the full equation with "->" (ellipsis as letters)
  int naive_scaling = 0;            // distinct labels overall
  int optimized_scaling = 0;        // largest scaling of a step
  double naive_flops = 0;           // flop_count of the one-step contraction
  double optimized_flops = 0;       // sum of the steps' flops (opt_einsum's opt_cost)
  double largest_intermediate = 0;  // elements
  std::string report;               // numpy.einsum_path's printed report
};

// Contracts `operands` as `equation` says: e.g. "bhid,bhjd->bhij" maps q [B,H,I,D]
// and k [B,H,J,D] to scores [B,H,I,J]. Result dtype: numpy's result type.
Tensor einsum(std::string_view equation, std::span<const Tensor> operands, const EinsumOptions& options = {});
Tensor einsum(std::string_view equation, std::initializer_list<Tensor> operands, const EinsumOptions& options = {});

// The contraction path einsum would take for operands of these shapes, with its
// cost report (numpy.einsum_path / opt_einsum.contract_path). Same checks as einsum.
EinsumPath einsum_path(std::string_view equation, std::span<const Shape> shapes, const EinsumOptions& options = {});
EinsumPath einsum_path(std::string_view equation, std::span<const Tensor> operands, const EinsumOptions& options = {});

// The oracle: one naive loop over every label, float64 accumulation, result in
// numpy's result type. Same parsing and checks as einsum; slow, for tests.
Tensor einsum_reference(std::string_view equation, std::span<const Tensor> operands);

}  // namespace qkv
