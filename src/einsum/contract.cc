// einsum stage 3: one pairwise contraction as one (batched, strided) GEMM.
//
// Labels of a pair A, B -> C fall in four groups: batch (A, B, C), m (A, C),
// n (B, C), k (A, B). Each of m, n, k must collapse to one (size, stride) in the
// tensors holding it; batch dims keep their own strides (GemmBatch). When a
// tensor's layout does not allow that, it alone is copied to a GEMM layout
// (opt_einsum's TDOT); contractions without a k label, or tiny ones, run DIRECT.
#include <algorithm>
#include <optional>

#include "einsum/contract.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "tensor/buffer_pool.h"

namespace qkv::einsum_detail {

namespace {

int64_t stride_of(const Operand& o, int label) {
  for (size_t d = 0; d < o.labels.size(); ++d)
    if (o.labels[d] == label) return o.t.stride(static_cast<int64_t>(d));
  return 0;
}

struct Group {
  int64_t size = 1, stride = 0;  // stride of the innermost label
};

// (size, innermost stride) when `labels` (outer to inner) collapse to one dim of `o`.
std::optional<Group> collapse(const Operand& o, const std::vector<int>& labels, const std::vector<int64_t>& sizes) {
  Group g;
  for (size_t i = labels.size(); i-- > 0;) {
    const int64_t s = stride_of(o, labels[i]), n = sizes[static_cast<size_t>(labels[i])];
    if (i + 1 == labels.size()) {
      g.stride = s;
    } else if (s != g.stride * g.size) {
      return std::nullopt;
    }
    g.size *= n;
  }
  return g;
}

struct Groups {
  std::vector<int> batch, m, n, k;  // labels of size > 1
};

// Sorted by decreasing stride in `o` (stable on label id).
std::vector<int> by_stride(const Operand& o, std::vector<int> labels) {
  std::stable_sort(labels.begin(), labels.end(), [&](int x, int y) { return stride_of(o, x) > stride_of(o, y); });
  return labels;
}

// Permuted contiguous copy of o with the given label order (labels not listed, all size 1, go last).
Operand copy_as(const Operand& o, const std::vector<int>& order) {
  std::vector<int64_t> perm;
  std::vector<int> labels;
  for (int l : order)
    for (size_t d = 0; d < o.labels.size(); ++d)
      if (o.labels[d] == l) perm.push_back(static_cast<int64_t>(d)), labels.push_back(l);
  for (size_t d = 0; d < o.labels.size(); ++d)
    if (std::find(labels.begin(), labels.end(), o.labels[d]) == labels.end())
      perm.push_back(static_cast<int64_t>(d)), labels.push_back(o.labels[d]);
  const Tensor src = o.t.permute(perm);
  Tensor dst = kernels::empty_pooled(src.shape(), src.dtype(), "operand copy");
  dst.copy_from(src);
  return {dst, labels};
}

enum class Misfit { none, a, b, c };

struct Call {
  GemmShape s;
  GemmBatch batch;
};

// Fits A [M,K], B [K,N], C [M,N] (row-major C) into one gemm call, or says which does not fit.
Misfit fit(const Operand& a, const Operand& b, const Operand& c, const Groups& g, const std::vector<int64_t>& sizes,
           Call& call) {
  const auto am = collapse(a, g.m, sizes), ak = collapse(a, g.k, sizes);
  const auto bk = collapse(b, g.k, sizes), bn = collapse(b, g.n, sizes);
  const auto cm = collapse(c, g.m, sizes), cn = collapse(c, g.n, sizes);
  GemmShape& s = call.s;
  if (!am || !ak) return Misfit::a;
  if (!bk || !bn) return Misfit::b;
  if (!cm || !cn) return Misfit::c;
  s.m = am->size, s.k = ak->size, s.n = bn->size;
  if (s.k <= 1 || ak->stride == 1) {
    s.trans_a = false, s.lda = s.m > 1 ? am->stride : std::max<int64_t>(s.k, 1);
    if (s.m > 1 && s.lda < s.k) return Misfit::a;
  } else if (s.m <= 1 || am->stride == 1) {
    s.trans_a = true, s.lda = s.k > 1 ? ak->stride : std::max<int64_t>(s.m, 1);
    if (s.k > 1 && s.lda < s.m) return Misfit::a;
  } else {
    return Misfit::a;
  }
  if (s.n <= 1 || bn->stride == 1) {
    s.trans_b = false, s.ldb = s.k > 1 ? bk->stride : std::max<int64_t>(s.n, 1);
    if (s.k > 1 && s.ldb < s.n) return Misfit::b;
  } else if (s.k <= 1 || bk->stride == 1) {
    s.trans_b = true, s.ldb = s.n > 1 ? bn->stride : std::max<int64_t>(s.k, 1);
    if (s.n > 1 && s.ldb < s.k) return Misfit::b;
  } else {
    return Misfit::b;
  }
  if (s.n > 1 && cn->stride != 1) return Misfit::c;
  s.ldc = s.m > 1 ? cm->stride : std::max<int64_t>(s.n, 1);
  if (s.m > 1 && s.ldc < s.n) return Misfit::c;
  call.batch = {};
  for (int l : g.batch) {
    const int64_t n = sizes[static_cast<size_t>(l)];
    const int64_t sa = stride_of(a, l), sb = stride_of(b, l), sc = stride_of(c, l);
    GemmBatch& bt = call.batch;
    if (!bt.shape.empty() && bt.stride_a.back() == sa * n && bt.stride_b.back() == sb * n &&
        bt.stride_c.back() == sc * n) {  // merges with the previous batch dim
      bt.shape.back() *= n, bt.stride_a.back() = sa, bt.stride_b.back() = sb, bt.stride_c.back() = sc;
      continue;
    }
    bt.shape.push_back(n), bt.stride_a.push_back(sa), bt.stride_b.push_back(sb), bt.stride_c.push_back(sc);
  }
  return Misfit::none;
}

void run_call(const Call& call, const Operand& a, const Operand& b, const Operand& c, ExecTrace* trace) {
  if (trace) ++trace->gemm_calls;
  if (c.t.dtype() == DType::f64) {
    gemm(call.s, 1.0, a.t.data<double>(), b.t.data<double>(), 0.0, c.t.data<double>(), call.batch);
  } else {
    gemm(call.s, 1.0f, a.t.data<float>(), b.t.data<float>(), 0.0f, c.t.data<float>(), call.batch);
  }
}

Operand allocate(const std::vector<int>& labels, const std::vector<int64_t>& sizes, DType dtype) {
  Shape shape;
  for (int l : labels) shape.push_back(sizes[static_cast<size_t>(l)]);
  return {kernels::empty_pooled(shape, dtype), labels};
}

// Sums `o` over its labels outside `keep` (DIRECT), keeping the order of the rest.
Operand reduce_to(const Operand& o, LabelSet keep, const std::vector<int64_t>& sizes, ExecTrace* trace) {
  std::vector<int> labels;
  for (int l : o.labels)
    if (keep.has(l)) labels.push_back(l);
  if (labels.size() == o.labels.size()) return o;
  Operand out = allocate(labels, sizes, o.t.dtype());
  direct_contract(std::span<const Operand>(&o, 1), out, sizes);
  if (trace) trace->kernels.push_back("DIRECT");
  return out;
}

// Runs the GEMM, copying A, B or C to GEMM layouts as far as needed.
void gemm_with_copies(Operand a, Operand b, const Operand& c, Groups g, const std::vector<int64_t>& sizes,
                      ExecTrace* trace) {
  Operand out = c;
  bool copied = false;
  for (int attempt = 0; attempt < 4; ++attempt) {
    Call call;
    const Misfit m = fit(a, b, out, g, sizes, call);
    if (m == Misfit::none) {
      run_call(call, a, b, out, trace);
      if (copied && out.t.storage() != c.t.storage()) {
        std::vector<int64_t> perm;  // out's labels in c's order
        for (int l : c.labels)
          for (size_t d = 0; d < out.labels.size(); ++d)
            if (out.labels[d] == l) perm.push_back(static_cast<int64_t>(d));
        c.t.copy_from(out.t.permute(perm));
      }
      if (trace) trace->kernels.push_back(copied ? "GEMM+COPY" : "GEMM");
      return;
    }
    copied = true;
    if (trace) ++trace->copies;
    std::vector<int> order = g.batch;
    if (m == Misfit::a) {
      order.insert(order.end(), g.m.begin(), g.m.end());
      order.insert(order.end(), g.k.begin(), g.k.end());
      a = copy_as(a, order);
    } else if (m == Misfit::b) {
      order.insert(order.end(), g.k.begin(), g.k.end());
      order.insert(order.end(), g.n.begin(), g.n.end());
      b = copy_as(b, order);
    } else {
      order.insert(order.end(), g.m.begin(), g.m.end());
      order.insert(order.end(), g.n.begin(), g.n.end());
      for (int l : c.labels)
        if (std::find(order.begin(), order.end(), l) == order.end()) order.push_back(l);
      out = allocate(order, sizes, c.t.dtype());
    }
  }
  fail<Error>("einsum: internal error: no GEMM layout found");
}

}  // namespace

double& direct_flops_threshold() {
  static double threshold = 4096;  // below this many multiply-adds GEMM set-up dominates
  return threshold;
}

Operand contract_pair(const Operand& a0, const Operand& b0, LabelSet keep, const std::vector<int>* order,
                      const std::vector<int64_t>& sizes, ExecTrace* trace) {
  const LabelSet sa = LabelSet::of(a0.labels), sb = LabelSet::of(b0.labels);
  const Operand x = reduce_to(a0, keep | sb, sizes, trace);
  const Operand y = reduce_to(b0, keep | sa, sizes, trace);
  Groups g;
  double flops = 1;
  for (int l : (sa | sb).ids()) {
    const bool in_a = sa.has(l), in_b = sb.has(l), in_c = keep.has(l);
    if (sizes[static_cast<size_t>(l)] == 1 || (in_a != in_b && !in_c)) continue;
    flops *= static_cast<double>(sizes[static_cast<size_t>(l)]);
    (in_a && in_b ? (in_c ? g.batch : g.k) : in_a ? g.m : g.n).push_back(l);
  }
  std::vector<int> c_labels;
  if (order) {
    c_labels = *order;
  } else {  // batch, m, n in the operands' memory order; then size-1 labels
    for (const auto* part : {&g.batch, &g.m}) {
      const std::vector<int> sorted = by_stride(x, *part);
      c_labels.insert(c_labels.end(), sorted.begin(), sorted.end());
    }
    const std::vector<int> n_sorted = by_stride(y, g.n);
    c_labels.insert(c_labels.end(), n_sorted.begin(), n_sorted.end());
    for (int l : ((sa | sb) & keep).ids())
      if (sizes[static_cast<size_t>(l)] == 1) c_labels.push_back(l);
  }
  const Operand c = allocate(c_labels, sizes, x.t.dtype());
  const std::vector<Operand> pair = {x, y};
  if (g.k.empty() || flops < direct_flops_threshold()) {
    direct_contract(pair, c, sizes);
    if (trace) trace->kernels.push_back("DIRECT");
    return c;
  }
  // Order m, n, batch as in C; the operand owning C's innermost free label is B.
  auto in_c_order = [&](const std::vector<int>& labels) {
    std::vector<int> out;
    for (int l : c_labels)
      if (std::find(labels.begin(), labels.end(), l) != labels.end()) out.push_back(l);
    return out;
  };
  g.batch = in_c_order(g.batch), g.m = in_c_order(g.m), g.n = in_c_order(g.n);
  bool swap = false;
  for (auto it = c_labels.rbegin(); it != c_labels.rend(); ++it) {
    if (sizes[static_cast<size_t>(*it)] == 1) continue;
    swap = std::find(g.m.begin(), g.m.end(), *it) != g.m.end();
    break;
  }
  const Operand& left = swap ? y : x;
  const Operand& right = swap ? x : y;
  if (swap) std::swap(g.m, g.n);
  g.k = by_stride(left, g.k);
  if (!collapse(left, g.k, sizes)) g.k = by_stride(right, g.k);
  gemm_with_copies(left, right, c, g, sizes, trace);
  return c;
}

}  // namespace qkv::einsum_detail
