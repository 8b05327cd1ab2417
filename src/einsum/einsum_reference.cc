// einsum oracle: one odometer over every label, float64 accumulation. Shares only
// the parser with the fast path; no planning, no views, no GEMM.
#include <cmath>
#include <vector>

#include "einsum/parse.h"
#include "qkv/einsum.h"

namespace qkv {

Tensor einsum_reference(std::string_view equation, std::span<const Tensor> operands) {
  const std::vector<Shape> shapes = einsum_detail::shapes_of(operands);
  const einsum_detail::Spec spec = einsum_detail::parse(equation, shapes);
  // Every label, output labels first so that the output index is a prefix.
  std::vector<int> labels = spec.output;
  std::vector<bool> listed(einsum_detail::kMaxLabels, false);
  for (int l : labels) listed[l] = true;
  for (const auto& in : spec.inputs)
    for (int l : in)
      if (!listed[l]) listed[l] = true, labels.push_back(l);
  std::vector<int> pos(einsum_detail::kMaxLabels, -1);
  for (size_t i = 0; i < labels.size(); ++i) pos[labels[i]] = static_cast<int>(i);

  // Operands as contiguous float64; per label a stride (0 for size-1 broadcast dims).
  std::vector<std::vector<double>> values;
  std::vector<std::vector<int64_t>> strides;
  for (size_t i = 0; i < operands.size(); ++i) {
    values.push_back(operands[i].to_vector<double>());
    std::vector<int64_t> s(labels.size(), 0);
    const Strides cs = contiguous_strides(shapes[i]);
    for (size_t d = 0; d < shapes[i].size(); ++d) {
      if (shapes[i][d] != 1) s[pos[spec.inputs[i][d]]] += cs[d];  // repeated label: diagonal
    }
    strides.push_back(std::move(s));
  }
  Shape out_shape;
  for (int l : spec.output) out_shape.push_back(spec.sizes[l]);
  const int64_t out_numel = shape_numel(out_shape);
  std::vector<double> out(static_cast<size_t>(out_numel), 0.0);

  std::vector<int64_t> idx(labels.size(), 0);
  bool empty = false;
  for (int l : labels) empty |= spec.sizes[l] == 0;
  while (!empty) {
    double prod = 1.0;
    for (size_t i = 0; i < operands.size(); ++i) {
      int64_t off = 0;
      for (size_t j = 0; j < labels.size(); ++j) off += idx[j] * strides[i][j];
      prod *= values[i][static_cast<size_t>(off)];
    }
    int64_t o = 0;
    for (size_t j = 0; j < spec.output.size(); ++j) o = o * spec.sizes[spec.output[j]] + idx[j];
    out[static_cast<size_t>(o)] += prod;
    size_t j = labels.size();
    while (j > 0 && ++idx[j - 1] == spec.sizes[labels[j - 1]]) idx[--j] = 0;
    if (j == 0) break;
  }
  // int8/int32 results wrap modulo 2^8/2^32 as numpy's integer sums do (a cast of the
  // float64 sums would saturate); fmod is exact, so this is the exact sum's residue.
  const DType result = einsum_detail::result_dtype(operands);
  if (result == DType::i8 || result == DType::i32) {
    const double m = result == DType::i8 ? 256.0 : 4294967296.0;
    for (double& v : out) {
      v = std::fmod(v, m);  // (-m, m), the sign of v
      if (v >= m / 2) v -= m;
      if (v < -m / 2) v += m;
    }
  }
  return Tensor::from_vector(out, out_shape).to(result);
}

}  // namespace qkv
