// einsum stage 3: preparing operands (diagonal and broadcast views) and running a path.
#include <algorithm>

#include "einsum/contract.h"
#include "qkv/parallel.h"
#include "tensor/buffer_pool.h"

namespace qkv::einsum_detail {

namespace {

// float64 for f64 and integer/bool results, float32 otherwise.
DType compute_dtype(DType result) {
  return (result == DType::f32 || result == DType::f16 || result == DType::bf16) ? DType::f32 : DType::f64;
}

// A view of o with labels in `order` (a subset equal to o's label set).
Operand permuted(const Operand& o, const std::vector<int>& order) {
  std::vector<int64_t> perm;
  for (int l : order)
    for (size_t d = 0; d < o.labels.size(); ++d)
      if (o.labels[d] == l) perm.push_back(static_cast<int64_t>(d));
  return {o.t.permute(perm), order};
}

// Runs one step: its operands (in the order numpy pops them) -> one operand.
Operand run_step(std::vector<Operand> ops, LabelSet keep, const std::vector<int>* order, const Spec& spec,
                 DType compute, ExecTrace* trace) {
  if (ops.size() == 1) {
    std::vector<int> labels;
    for (int l : ops[0].labels)
      if (keep.has(l)) labels.push_back(l);
    if (labels.size() == ops[0].labels.size()) {  // nothing to sum: a view, no copy
      if (trace) trace->kernels.push_back("VIEW");
      return order ? permuted(ops[0], *order) : ops[0];
    }
    ops[0].t = ops[0].t.to(compute);
    Shape shape;
    const std::vector<int>& out_labels = order ? *order : labels;
    for (int l : out_labels) shape.push_back(spec.sizes[static_cast<size_t>(l)]);
    Operand out{kernels::empty_pooled(shape, compute), out_labels};
    direct_contract(ops, out, spec.sizes);
    if (trace) trace->kernels.push_back("DIRECT");
    return out;
  }
  for (Operand& o : ops) o.t = o.t.to(compute);
  // Several operands: pairwise, left to right (numpy's optimize=False path runs so).
  Operand acc = ops[0];
  for (size_t t = 1; t < ops.size(); ++t) {
    LabelSet keep_t = keep;
    for (size_t u = t + 1; u < ops.size(); ++u) keep_t = keep_t | LabelSet::of(ops[u].labels);
    const bool last = t + 1 == ops.size();
    acc = contract_pair(acc, ops[t], keep_t, last ? order : nullptr, spec.sizes, trace);
  }
  return acc;
}

// Every buffer the path will allocate for a result (each step's, the pairwise
// partial results of a step of three or more operands, the output in the compute
// and the result dtype), checked against overflow and QKV_MAX_ALLOC_BYTES before
// any work is done: a too-large einsum fails at once instead of after hours or an
// OOM kill. Copies of operands to GEMM layouts are checked when they are made.
void check_sizes(const Spec& spec, const Path& path, DType compute, DType result) {
  std::vector<LabelSet> sets;
  for (size_t i = 0; i < spec.inputs.size(); ++i) sets.push_back(spec.input_set(i));
  auto check = [&](const std::vector<int>& labels, DType dtype, const char* role) {
    Shape shape;
    for (int l : labels) shape.push_back(spec.sizes[static_cast<size_t>(l)]);
    checked_alloc_bytes(shape, dtype, role, "einsum");
  };
  for (size_t s = 0; s < path.size(); ++s) {
    std::vector<int> ids = path[s];
    std::sort(ids.rbegin(), ids.rend());
    std::vector<LabelSet> step;  // in the order run_step contracts them
    for (int id : ids) {
      step.push_back(sets[static_cast<size_t>(id)]);
      sets.erase(sets.begin() + id);
    }
    LabelSet keep = spec.output_set();
    for (const LabelSet& x : sets) keep = keep | x;
    LabelSet acc = step[0];
    for (size_t t = 1; t + 1 < step.size(); ++t) {  // pairwise partial results
      LabelSet keep_t = keep;
      for (size_t u = t + 1; u < step.size(); ++u) keep_t = keep_t | step[u];
      acc = (acc | step[t]) & keep_t;
      check(acc.ids(), compute, "intermediate");
    }
    if (step.size() > 1) acc = acc | step.back();
    const LabelSet result_set = acc & keep;
    sets.push_back(result_set);
    if (step.size() == 1 && result_set == step[0]) continue;  // a view: nothing allocated
    const bool last = s + 1 == path.size();
    check(last ? spec.output : result_set.ids(), compute, last ? "output" : "intermediate");
    if (last && result != compute) check(spec.output, result, "output");
  }
}

}  // namespace

Operand prepare_operand(const Spec& spec, const Tensor& t, size_t i) {
  const std::vector<int>& dims = spec.inputs[i];
  std::vector<int> labels;
  Shape shape;
  Strides strides;
  for (size_t d = 0; d < dims.size(); ++d) {
    const auto it = std::find(labels.begin(), labels.end(), dims[d]);
    // A size-1 dim contributes no stride: it broadcasts to the label's size (and a
    // repeated label of size 1 stays a broadcast).
    const int64_t stride = t.size(static_cast<int64_t>(d)) == 1 ? 0 : t.stride(static_cast<int64_t>(d));
    if (it != labels.end()) {  // repeated label: the diagonal, by summed strides
      strides[static_cast<size_t>(it - labels.begin())] += stride;
      continue;
    }
    labels.push_back(dims[d]);
    const int64_t size = spec.sizes[static_cast<size_t>(dims[d])];
    shape.push_back(size);
    strides.push_back(stride);
  }
  return {Tensor::view_of(t.storage(), t.dtype(), shape, strides, t.offset()), labels};
}

Tensor execute(const Spec& spec, std::span<const Tensor> operands, const Path& path, ExecTrace* trace) {
  const DType result = result_dtype(operands);
  const DType compute = compute_dtype(result);
  check_sizes(spec, path, compute, result);
  std::vector<Operand> ops;
  for (size_t i = 0; i < operands.size(); ++i) ops.push_back(prepare_operand(spec, operands[i], i));
  const LabelSet out_set = spec.output_set();
  for (size_t s = 0; s < path.size(); ++s) {
    check_interrupt("einsum");  // between contraction steps (each step's kernels poll too)
    std::vector<int> ids = path[s];
    std::sort(ids.rbegin(), ids.rend());
    std::vector<Operand> step;
    for (int id : ids) {
      step.push_back(std::move(ops[static_cast<size_t>(id)]));
      ops.erase(ops.begin() + id);
    }
    LabelSet keep = out_set;
    for (const Operand& o : ops) keep = keep | LabelSet::of(o.labels);
    const bool last = s + 1 == path.size();
    ops.push_back(run_step(std::move(step), keep, last ? &spec.output : nullptr, spec, compute, trace));
  }
  Operand out = permuted(ops.at(0), spec.output);
  // A pure view keeps the input dtype (numpy returns a view); computed results convert.
  if (out.t.dtype() == result) return out.t;
  // int8/int32 wrap modulo 2^8/2^32 as numpy's integer sums do: the f64 sums are exact
  // integers below 2^53, and int64 -> int8/int32 wraps (f64 -> int8 would saturate).
  if (result == DType::i8 || result == DType::i32) return out.t.to(DType::i64).to(result);
  return out.t.to(result);
}

}  // namespace qkv::einsum_detail
