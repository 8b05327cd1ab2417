// einsum stage 3: the direct kernel, a strided product-sum loop over one or more
// operands, parallel over output rows.
//
// Two loop orders. "rows": the output's last dim is the innermost loop and the
// reduced dims run outside it, accumulating a row of float64 sums (streams when
// that dim is contiguous, e.g. "ij->j", "ij,ij->ij"). "dots": the last reduced dim
// is innermost (e.g. "ij->", "bij,bij->b"). The one whose inner stride in the first
// operand is smaller is taken.
#include <algorithm>
#include <array>
#include <cstdlib>

#include "einsum/contract.h"
#include "qkv/parallel.h"

namespace qkv::einsum_detail {

namespace {

constexpr size_t kMaxOps = 8;

int64_t stride_for(const Operand& o, int label) {
  for (size_t d = 0; d < o.labels.size(); ++d)
    if (o.labels[d] == label) return o.t.stride(static_cast<int64_t>(d));
  return 0;
}

// Dims of a loop nest with one stride per operand (and the output).
struct Dims {
  std::vector<int64_t> size;
  std::vector<std::array<int64_t, kMaxOps + 1>> stride;  // [dim][op], op nops = output
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t s : size) n *= s;
    return n;
  }
};

struct Loop {
  size_t nops = 0;
  Dims outer;                                       // output dims except the inner one
  Dims red;                                         // reduced dims except the inner one
  int64_t inner = 1;                                // length of the innermost loop
  std::array<int64_t, kMaxOps + 1> inner_stride{};  // per operand and output
  bool rows = true;                                 // inner loop runs over an output dim
};

Loop make_loop(std::span<const Operand> ops, const Operand& out, const std::vector<int64_t>& sizes) {
  Loop g;
  g.nops = ops.size();
  const LabelSet out_set = LabelSet::of(out.labels);
  std::vector<int> red;
  LabelSet seen;
  for (const Operand& o : ops)
    for (int l : o.labels)
      if (!out_set.has(l) && !seen.has(l)) seen.add(l), red.push_back(l);
  auto strides = [&](int label, bool in_out) {
    std::array<int64_t, kMaxOps + 1> s{};
    for (size_t i = 0; i < ops.size(); ++i) s[i] = stride_for(ops[i], label);
    s[ops.size()] = in_out ? stride_for(out, label) : 0;
    return s;
  };
  const bool has_out = !out.labels.empty(), has_red = !red.empty();
  const int64_t out_inner = has_out ? std::abs(stride_for(ops[0], out.labels.back())) : 0;
  const int64_t red_inner = has_red ? std::abs(stride_for(ops[0], red.back())) : 0;
  g.rows = has_out && (!has_red || out_inner <= red_inner);
  for (size_t d = 0; d < out.labels.size(); ++d) {
    const int l = out.labels[d];
    if (g.rows && d + 1 == out.labels.size()) {
      g.inner = sizes[static_cast<size_t>(l)], g.inner_stride = strides(l, true);
    } else {
      g.outer.size.push_back(sizes[static_cast<size_t>(l)]), g.outer.stride.push_back(strides(l, true));
    }
  }
  for (size_t r = 0; r < red.size(); ++r) {
    const int l = red[r];
    if (!g.rows && r + 1 == red.size()) {
      g.inner = sizes[static_cast<size_t>(l)], g.inner_stride = strides(l, false);
    } else {
      g.red.size.push_back(sizes[static_cast<size_t>(l)]), g.red.stride.push_back(strides(l, false));
    }
  }
  return g;
}

// Offsets of the element `index` (flat, row-major over dims) per operand and output.
std::array<int64_t, kMaxOps + 1> offsets_at(const Dims& dims, int64_t index, size_t nops) {
  std::array<int64_t, kMaxOps + 1> off{};
  for (size_t d = dims.size.size(); d-- > 0;) {
    const int64_t i = index % dims.size[d];
    index /= dims.size[d];
    for (size_t k = 0; k <= nops; ++k) off[k] += i * dims.stride[d][k];
  }
  return off;
}

// Adds stride steps of the odometer `idx` over dims to `off`; false when it wrapped.
bool advance(const Dims& dims, std::vector<int64_t>& idx, std::array<int64_t, kMaxOps + 1>& off, size_t nops) {
  for (size_t d = dims.size.size(); d-- > 0;) {
    for (size_t k = 0; k <= nops; ++k) off[k] += dims.stride[d][k];
    if (++idx[d] < dims.size[d]) return true;
    for (size_t k = 0; k <= nops; ++k) off[k] -= dims.stride[d][k] * dims.size[d];
    idx[d] = 0;
  }
  return false;
}

// acc[j] (+)= prod_i p_i[j * s_i] for j < n (rows), or returns the sum over j (dots).
template <class T>
void inner_rows(const Loop& g, const std::array<const T*, kMaxOps>& p, double* acc) {
  const int64_t n = g.inner;
  const auto& s = g.inner_stride;
  if (g.nops == 1 && s[0] == 1) {  // unit strides: vectorizable
    const T* a = p[0];
    for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(a[j]);
  } else if (g.nops == 2 && s[0] == 1 && s[1] == 1) {
    const T *a = p[0], *b = p[1];
    for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(a[j]) * static_cast<double>(b[j]);
  } else if (g.nops == 1) {
    for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(p[0][j * s[0]]);
  } else if (g.nops == 2) {
    for (int64_t j = 0; j < n; ++j) acc[j] += static_cast<double>(p[0][j * s[0]]) * static_cast<double>(p[1][j * s[1]]);
  } else {
    for (int64_t j = 0; j < n; ++j) {
      double x = 1;
      for (size_t i = 0; i < g.nops; ++i) x *= static_cast<double>(p[i][j * s[i]]);
      acc[j] += x;
    }
  }
}

template <class T>
double inner_dot(const Loop& g, const std::array<const T*, kMaxOps>& p) {
  const int64_t n = g.inner;
  const auto& s = g.inner_stride;
  double acc[4] = {0, 0, 0, 0};
  int64_t j = 0;
  if (g.nops == 1) {
    for (; j + 4 <= n; j += 4)
      for (int u = 0; u < 4; ++u) acc[u] += static_cast<double>(p[0][(j + u) * s[0]]);
    for (; j < n; ++j) acc[0] += static_cast<double>(p[0][j * s[0]]);
  } else if (g.nops == 2) {
    for (; j + 4 <= n; j += 4)
      for (int u = 0; u < 4; ++u)
        acc[u] += static_cast<double>(p[0][(j + u) * s[0]]) * static_cast<double>(p[1][(j + u) * s[1]]);
    for (; j < n; ++j) acc[0] += static_cast<double>(p[0][j * s[0]]) * static_cast<double>(p[1][j * s[1]]);
  } else {
    for (; j < n; ++j) {
      double x = 1;
      for (size_t i = 0; i < g.nops; ++i) x *= static_cast<double>(p[i][j * s[i]]);
      acc[0] += x;
    }
  }
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// One output row (rows) or one output element (dots) at offsets `base`.
template <class T>
void compute_at(const Loop& g, const std::array<const T*, kMaxOps>& origin, T* c,
                const std::array<int64_t, kMaxOps + 1>& base, std::vector<double>& acc, std::vector<int64_t>& ridx) {
  const size_t nops = g.nops;
  const int64_t red_numel = g.red.numel();
  std::fill(ridx.begin(), ridx.end(), 0);
  std::array<int64_t, kMaxOps + 1> off = base;
  std::array<const T*, kMaxOps> p{};
  if (g.rows && red_numel == 1 && nops == 2) {  // no sum: products written straight out
    const T *a = origin[0] + off[0], *b = origin[1] + off[1];
    T* row = c + base[nops];
    const auto& s = g.inner_stride;
    if (s[0] == 1 && s[1] == 1 && s[2] == 1) {
      for (int64_t j = 0; j < g.inner; ++j) row[j] = a[j] * b[j];  // one rounding, as in double
    } else {
      for (int64_t j = 0; j < g.inner; ++j) row[j * s[2]] = a[j * s[0]] * b[j * s[1]];
    }
    return;
  }
  if (g.rows) {
    std::fill(acc.begin(), acc.end(), 0.0);
    // One output row may be all the work ('ij->i': red_numel rows of g.inner): poll per row.
    for (int64_t r = 0; r < red_numel && !interrupt_requested(); ++r) {
      for (size_t i = 0; i < nops; ++i) p[i] = origin[i] + off[i];
      inner_rows<T>(g, p, acc.data());
      advance(g.red, ridx, off, nops);
    }
    const int64_t sc = g.inner_stride[nops];
    for (int64_t j = 0; j < g.inner; ++j) c[base[nops] + j * sc] = static_cast<T>(acc[static_cast<size_t>(j)]);
    return;
  }
  double sum = 0;
  for (int64_t r = 0; r < red_numel; ++r) {
    if ((r & 1023) == 0 && interrupt_requested()) return;  // a huge reduction into one element
    for (size_t i = 0; i < nops; ++i) p[i] = origin[i] + off[i];
    sum += inner_dot<T>(g, p);
    advance(g.red, ridx, off, nops);
  }
  c[base[nops]] = static_cast<T>(sum);
}

template <class T>
void run_direct(std::span<const Operand> ops, const Operand& out, const std::vector<int64_t>& sizes) {
  if (ops.size() > kMaxOps) fail<Error>("einsum: internal error: direct kernel on ", ops.size(), " operands");
  const Loop g = make_loop(ops, out, sizes);
  const int64_t units = g.outer.numel();  // rows (or elements) of the output
  if (units == 0 || g.inner == 0 || out.t.numel() == 0) {
    if (out.t.numel() > 0) out.t.fill(0.0);
    return;
  }
  std::array<const T*, kMaxOps> origin{};
  for (size_t i = 0; i < ops.size(); ++i) origin[i] = ops[i].t.data<T>();
  T* c = out.t.data<T>();
  const int64_t work = std::max<int64_t>(1, g.red.numel() * g.inner * static_cast<int64_t>(ops.size()));
  parallel_for(0, units, std::max<int64_t>(1, 65536 / work), [&](int64_t begin, int64_t end) {
    std::vector<double> acc(static_cast<size_t>(g.rows ? g.inner : 0));
    std::vector<int64_t> ridx(g.red.size.size()), oidx(g.outer.size.size());
    std::array<int64_t, kMaxOps + 1> base = offsets_at(g.outer, begin, g.nops);
    int64_t rest = begin;
    for (size_t d = oidx.size(); d-- > 0;) oidx[d] = rest % g.outer.size[d], rest /= g.outer.size[d];
    for (int64_t e = begin; e < end && !interrupt_requested(); ++e) {
      compute_at<T>(g, origin, c, base, acc, ridx);
      advance(g.outer, oidx, base, g.nops);
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
