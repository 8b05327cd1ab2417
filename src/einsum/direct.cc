// einsum stage 3: the direct kernel, a strided product-sum loop over any number of
// operands (float64 accumulation), parallel over output elements.
#include <algorithm>

#include "einsum/contract.h"
#include "qkv/parallel.h"

namespace qkv::einsum_detail {

namespace {

int64_t stride_for(const Operand& o, int label) {
  for (size_t d = 0; d < o.labels.size(); ++d)
    if (o.labels[d] == label) return o.t.stride(static_cast<int64_t>(d));
  return 0;
}

// Geometry of one direct contraction: output dims then reduced dims.
struct Loop {
  std::vector<int64_t> out_size, red_size;
  std::vector<std::vector<int64_t>> out_stride, red_stride;  // [op][dim]
  std::vector<int64_t> c_stride;                             // output tensor strides
  int64_t red_numel = 1;
};

Loop make_loop(std::span<const Operand> ops, const Operand& out, const std::vector<int64_t>& sizes) {
  Loop g;
  const LabelSet out_set = LabelSet::of(out.labels);
  LabelSet seen;
  std::vector<int> red;
  for (const Operand& o : ops)
    for (int l : o.labels)
      if (!out_set.has(l) && !seen.has(l)) seen.add(l), red.push_back(l);
  g.out_stride.resize(ops.size());
  g.red_stride.resize(ops.size());
  for (size_t d = 0; d < out.labels.size(); ++d) {
    g.out_size.push_back(out.t.size(static_cast<int64_t>(d)));
    g.c_stride.push_back(out.t.stride(static_cast<int64_t>(d)));
    for (size_t i = 0; i < ops.size(); ++i) g.out_stride[i].push_back(stride_for(ops[i], out.labels[d]));
  }
  for (int l : red) {
    g.red_size.push_back(sizes[static_cast<size_t>(l)]);
    g.red_numel *= sizes[static_cast<size_t>(l)];
    for (size_t i = 0; i < ops.size(); ++i) g.red_stride[i].push_back(stride_for(ops[i], l));
  }
  if (g.red_size.empty()) {  // one pseudo dim so the inner loop always exists
    g.red_size.push_back(1);
    for (auto& s : g.red_stride) s.push_back(0);
  }
  return g;
}

template <class T>
double reduce_at(const Loop& g, const std::vector<const T*>& base, std::vector<int64_t>& idx) {
  const size_t nr = g.red_size.size(), nops = base.size();
  const int64_t inner = g.red_size[nr - 1];
  std::fill(idx.begin(), idx.end(), 0);
  std::vector<const T*> p = base;
  double acc = 0;
  if (g.red_numel == 0) return 0;
  while (true) {
    if (nops == 1) {
      const int64_t s0 = g.red_stride[0][nr - 1];
      for (int64_t r = 0; r < inner; ++r) acc += static_cast<double>(p[0][r * s0]);
    } else if (nops == 2) {
      const int64_t s0 = g.red_stride[0][nr - 1], s1 = g.red_stride[1][nr - 1];
      for (int64_t r = 0; r < inner; ++r) acc += static_cast<double>(p[0][r * s0]) * static_cast<double>(p[1][r * s1]);
    } else {
      for (int64_t r = 0; r < inner; ++r) {
        double prod = 1;
        for (size_t i = 0; i < nops; ++i) prod *= static_cast<double>(p[i][r * g.red_stride[i][nr - 1]]);
        acc += prod;
      }
    }
    size_t d = nr - 1;  // advance the outer reduced dims
    while (d > 0) {
      --d;
      for (size_t i = 0; i < nops; ++i) p[i] += g.red_stride[i][d];
      if (++idx[d] < g.red_size[d]) break;
      for (size_t i = 0; i < nops; ++i) p[i] -= g.red_stride[i][d] * g.red_size[d];
      idx[d] = 0;
      if (d == 0) return acc;
    }
    if (nr == 1) return acc;
  }
}

template <class T>
void run_direct(std::span<const Operand> ops, const Operand& out, const std::vector<int64_t>& sizes) {
  const Loop g = make_loop(ops, out, sizes);
  const int64_t numel = out.t.numel();
  std::vector<const T*> origin;
  for (const Operand& o : ops) origin.push_back(o.t.data<T>());
  T* c = out.t.data<T>();
  const int64_t work = std::max<int64_t>(1, g.red_numel * static_cast<int64_t>(ops.size()));
  parallel_for(0, numel, std::max<int64_t>(1, 32768 / work), [&](int64_t begin, int64_t end) {
    const size_t nd = g.out_size.size();
    std::vector<int64_t> idx(nd), ridx(g.red_size.size());
    int64_t rest = begin;
    for (size_t d = nd; d-- > 0;) idx[d] = rest % g.out_size[d], rest /= g.out_size[d];
    std::vector<const T*> base(ops.size());
    for (int64_t e = begin; e < end; ++e) {
      int64_t coff = 0;
      for (size_t i = 0; i < ops.size(); ++i) {
        int64_t off = 0;
        for (size_t d = 0; d < nd; ++d) off += idx[d] * g.out_stride[i][d];
        base[i] = origin[i] + off;
      }
      for (size_t d = 0; d < nd; ++d) coff += idx[d] * g.c_stride[d];
      c[coff] = static_cast<T>(reduce_at<T>(g, base, ridx));
      for (size_t d = nd; d-- > 0;) {
        if (++idx[d] < g.out_size[d]) break;
        idx[d] = 0;
      }
    }
  });
}

}  // namespace

void direct_contract(std::span<const Operand> ops, const Operand& out, const std::vector<int64_t>& sizes) {
  if (out.t.dtype() == DType::f64) {
    run_direct<double>(ops, out, sizes);
  } else {
    run_direct<float>(ops, out, sizes);
  }
}

}  // namespace qkv::einsum_detail
