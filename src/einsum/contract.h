// einsum stage 3: executing a path. Operands become views with unique labels
// (diagonals and size-1 broadcasts by strides), then each step runs as
//   GEMM       one (batched, strided) qkv::gemm straight on the operands' memory,
//   GEMM+COPY  the same after copying an operand (or the result) to a GEMM layout,
//   DIRECT     a strided product-sum loop (no contracted label, tiny sizes, reductions),
//   VIEW       no arithmetic: a permuted/diagonal view of the input.
#pragma once

#include <span>
#include <string>
#include <vector>

#include "einsum/parse.h"
#include "einsum/plan.h"

namespace qkv::einsum_detail {

// A tensor whose dims are named by distinct labels (t.dim() == labels.size()).
struct Operand {
  Tensor t;
  std::vector<int> labels;
};

// What execute did, step by step (for tests and the benchmark).
struct ExecTrace {
  std::vector<std::string> kernels;  // one per pairwise or single-operand step
  int gemm_calls = 0;
  int copies = 0;  // operands or results copied to make a GEMM possible
};

// Runs `path` on the operands (already checked by parse). `trace` may be null.
Tensor execute(const Spec& spec, std::span<const Tensor> operands, const Path& path, ExecTrace* trace);

// The diagonal / broadcast view of operand i with distinct labels (no copy).
Operand prepare_operand(const Spec& spec, const Tensor& t, size_t i);

// out[out_labels] = sum over the other labels of prod(ops); `out` is written, any strides.
void direct_contract(std::span<const Operand> ops, const Operand& out, const std::vector<int64_t>& sizes);

// Contracts a and b, summing labels outside `keep`. With `order` the result has
// exactly those labels in that order (contiguous); else an order chosen for speed.
Operand contract_pair(const Operand& a, const Operand& b, LabelSet keep, const std::vector<int>* order,
                      const std::vector<int64_t>& sizes, ExecTrace* trace);

// Pairs with fewer multiply-adds than this run DIRECT (tests set 0 to force GEMM).
double& direct_flops_threshold();

}  // namespace qkv::einsum_detail
