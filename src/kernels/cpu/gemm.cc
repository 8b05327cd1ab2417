#include "kernels/cpu/gemm_internal.h"

#include <algorithm>
#include <atomic>
#include <sstream>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/copy.h"
#include "kernels/cpu/copy_transpose.h"
#include "qkv/error.h"
#include "qkv/size.h"  // kMaxElements

namespace qkv::detail {

namespace {

std::string list_str(const std::vector<int64_t>& v) {
  std::ostringstream out;
  out << '[';
  for (size_t i = 0; i < v.size(); ++i) out << (i ? ", " : "") << v[i];
  out << ']';
  return out.str();
}

// A stored matrix of `rows` rows of `len` contiguous elements, `ld` apart.
void check_leading_dim(const char* op, const char* name, int64_t rows, int64_t len, int64_t ld, const GemmShape& s,
                       const GemmBatch& batch) {
  if (ld < 0 || (rows > 1 && ld < len)) {
    fail<ValueError>(op, ": ", name, "=", ld, " is less than the stored row length ", len, " (", rows,
                     " stored rows) for ", gemm_args_str(s, batch));
  }
}

int64_t check_batch(const char* op, const GemmShape& s, const GemmBatch& batch) {
  const size_t nd = batch.shape.size();
  if (batch.stride_a.size() != nd || batch.stride_b.size() != nd || batch.stride_c.size() != nd) {
    fail<ValueError>(op, ": batch stride lists must have one entry per batch dim for ", gemm_args_str(s, batch));
  }
  int64_t count = 1;
  for (size_t d = 0; d < nd; ++d) {
    const int64_t size = batch.shape[d];
    if (size < 0) fail<ValueError>(op, ": negative batch dim for ", gemm_args_str(s, batch));
    if (size > 1 && batch.stride_c[d] == 0) {
      fail<ValueError>(op, ": stride_c is 0 on batch dim ", d, " of size ", size, " (C batches would overlap) for ",
                       gemm_args_str(s, batch));
    }
    if (size != 0 && count > kMaxElements / size) {
      fail<ValueError>(op, ": batch too large for ", gemm_args_str(s, batch));
    }
    count *= size;
  }
  return count;
}

}  // namespace

std::string gemm_args_str(const GemmShape& s, const GemmBatch& batch) {
  std::ostringstream out;
  out << std::boolalpha << "m=" << s.m << ", n=" << s.n << ", k=" << s.k << ", trans_a=" << s.trans_a
      << ", trans_b=" << s.trans_b << ", lda=" << s.lda << ", ldb=" << s.ldb << ", ldc=" << s.ldc;
  if (!batch.shape.empty() || !batch.stride_a.empty() || !batch.stride_b.empty() || !batch.stride_c.empty()) {
    out << ", batch=" << list_str(batch.shape) << ", stride_a=" << list_str(batch.stride_a)
        << ", stride_b=" << list_str(batch.stride_b) << ", stride_c=" << list_str(batch.stride_c);
  }
  return out.str();
}

int64_t check_gemm_args(const char* op, const GemmShape& s, double alpha, const void* a, const void* b, double beta,
                        const void* c, const GemmBatch& batch) {
  (void)beta;  // every beta is valid; kept in the signature to mirror gemm
  if (s.m < 0 || s.n < 0 || s.k < 0) {
    fail<ValueError>(op, ": m, n and k must be >= 0 for ", gemm_args_str(s, batch));
  }
  check_leading_dim(op, "lda", s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k, s.lda, s, batch);
  check_leading_dim(op, "ldb", s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, s.ldb, s, batch);
  check_leading_dim(op, "ldc", s.m, s.n, s.ldc, s, batch);
  const int64_t count = check_batch(op, s, batch);
  const bool writes_c = count > 0 && s.m > 0 && s.n > 0;
  const bool reads_ab = writes_c && s.k > 0 && alpha != 0.0;
  if ((reads_ab && (a == nullptr || b == nullptr)) || (writes_c && c == nullptr)) {
    fail<ValueError>(op, ": null matrix pointer for ", gemm_args_str(s, batch));
  }
  return count;
}

void check_int8_depth(const char* op, const GemmShape& s, const GemmBatch& batch) {
  if (s.k > kGemmInt8MaxDepth) {
    fail<ValueError>(op, ": k=", s.k, " is more than ", kGemmInt8MaxDepth,
                     " for int8 operands (int32 C could overflow) for ", gemm_args_str(s, batch));
  }
}

std::vector<GemmDim> gemm_batch_dims(const GemmBatch& batch) {
  std::vector<GemmDim> dims(batch.shape.size());
  for (size_t d = 0; d < dims.size(); ++d) {
    dims[d] = {batch.shape[d], batch.stride_a[d], batch.stride_b[d], batch.stride_c[d]};
  }
  return dims;
}

std::vector<GemmDim> simplify_gemm_batch(std::vector<GemmDim> dims) {
  // Outermost first; the order of independent batch matrices does not matter.
  std::stable_sort(dims.begin(), dims.end(), [](const GemmDim& x, const GemmDim& y) { return x.sc > y.sc; });
  std::vector<GemmDim> merged;
  for (const kernels::WalkDim<3>& d : kernels::coalesce_walk<3>(gemm_walk_dims(dims))) {
    if (d.size != 1) merged.push_back({d.size, d.stride[0], d.stride[1], d.stride[2]});  // not the lone placeholder
  }
  return merged;
}

kernels::WalkDims<3> gemm_walk_dims(const std::vector<GemmDim>& dims) {
  kernels::WalkDims<3> walk;
  for (const GemmDim& d : dims) walk.push_back({d.size, {d.sa, d.sb, d.sc}});
  return walk;
}

int64_t gemm_batch_count(const std::vector<GemmDim>& dims) {
  int64_t count = 1;
  for (const GemmDim& d : dims) count *= d.size;
  return count;
}

// The stored rows of one operand ([rows, len], `ld` apart) as dense float32 rows.
template <class H>
const float* widen_operand(const H* x, int64_t rows, int64_t len, int64_t ld, std::vector<float>& buffer) {
  buffer.resize(static_cast<size_t>(rows * len));
  kernels::convert_rows(x, rows, len, ld, buffer.data(), len);
  return buffer.data();
}

template <class H>
void gemm_widened(const GemmShape& s, float alpha, const H* a, const H* b, float beta, float* c,
                  const std::vector<GemmDim>& dims) {
  thread_local std::vector<float> wa, wb;  // reused: a tile loop widens the same sizes again and again
  GemmShape w = s;
  w.lda = s.trans_a ? s.m : s.k;  // dense stored rows
  w.ldb = s.trans_b ? s.k : s.n;
  for_each_gemm_batch(dims, 0, gemm_batch_count(dims), [&](int64_t oa, int64_t ob, int64_t oc) {
    const float* fa = widen_operand(a + oa, s.trans_a ? s.k : s.m, w.lda, s.lda, wa);  // [stored rows, len]
    const float* fb = widen_operand(b + ob, s.trans_b ? s.n : s.k, w.ldb, s.ldb, wb);
    gemm(w, alpha, fa, fb, beta, c + oc);
  });
}

template void gemm_widened(const GemmShape&, float, const bfloat16*, const bfloat16*, float, float*,
                           const std::vector<GemmDim>&);
template void gemm_widened(const GemmShape&, float, const float16*, const float16*, float, float*,
                           const std::vector<GemmDim>&);

namespace {

// to [rows, cols] (float32, rows ld_to apart) = the `type` elements from[r * s0 + c * s1]
// (the copy engine; int8 converts exactly).
void copy_to_rows(int64_t rows, int64_t cols, const void* from, DType type, int64_t s0, int64_t s1, float* to,
                  int64_t ld_to) {
  const int64_t shape[] = {rows, cols}, src[] = {s0, s1}, dst[] = {ld_to, 1};
  kernels::strided_copy(shape, {from, type, src}, {to, DType::f32, dst});
}

std::atomic<int64_t> g_int8_widened_runs{0};

}  // namespace

int64_t gemm_int8_widened_runs() { return g_int8_widened_runs.load(std::memory_order_relaxed); }

void gemm_int8_widened(const GemmShape& s, const int8_t* a, const int8_t* b, int32_t* c,
                       const std::vector<GemmDim>& dims) {
  g_int8_widened_runs.fetch_add(1, std::memory_order_relaxed);
  // 1024 * 128 * 128 = 2^24: float32's last exact integer.
  constexpr int64_t kChunk = 1024;
  thread_local std::vector<float> wa, wb, wc;  // [m, kc], [kc, n], [m, n]
  const GemmShape w{false, false, s.m, s.n, 0, 0, s.n, s.n};
  for_each_gemm_batch(dims, 0, gemm_batch_count(dims), [&](int64_t oa, int64_t ob, int64_t oc) {
    for (int64_t k0 = 0; k0 < s.k; k0 += kChunk) {
      GemmShape chunk = w;
      chunk.k = chunk.lda = std::min(kChunk, s.k - k0);
      // op(A)[:, k0..] and op(B)[k0.., :] as dense rows, whichever way they are stored.
      wa.resize(static_cast<size_t>(s.m * chunk.k)), wb.resize(static_cast<size_t>(chunk.k * s.n));
      copy_to_rows(s.m, chunk.k, a + oa + (s.trans_a ? k0 * s.lda : k0), DType::i8, s.trans_a ? 1 : s.lda,
                   s.trans_a ? s.lda : 1, wa.data(), chunk.k);
      copy_to_rows(chunk.k, s.n, b + ob + (s.trans_b ? k0 : k0 * s.ldb), DType::i8, s.trans_b ? 1 : s.ldb,
                   s.trans_b ? s.ldb : 1, wb.data(), s.n);
      wc.resize(static_cast<size_t>(s.m * s.n));
      gemm(chunk, 1.0f, wa.data(), wb.data(), 0.0f, wc.data());
      for (int64_t i = 0; i < s.m; ++i) {
        int32_t* row = c + oc + i * s.ldc;
        const float* part = wc.data() + i * s.n;
        for (int64_t j = 0; j < s.n; ++j) row[j] = (k0 == 0 ? 0 : row[j]) + static_cast<int32_t>(part[j]);
      }
    }
  });
}

}  // namespace qkv::detail

namespace qkv {

namespace {

constexpr int64_t kPanel = 64;  // columns of a panel (oneDNN's BA16a64b)

int64_t panel_rows(int64_t k) { return (k + 15) / 16 * 16; }

}  // namespace

int64_t gemm_panels_size(int64_t k, int64_t n) {
  const std::optional<int64_t> size =
      k < 0 || n < 0 ? std::nullopt : checked_mul((n + kPanel - 1) / kPanel, panel_rows(k) * kPanel);
  if (!size) fail<ValueError>("gemm_panels_size: no packed size for k=", k, ", n=", n);
  return *size;
}

void gemm_pack_panels(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb, float* panels, bool stream) {
  GemmShape s;  // one row of A and C, so that b and panels are checked for null too
  s.trans_b = trans_b;
  s.m = 1, s.k = k, s.n = n, s.lda = k, s.ldb = ldb, s.ldc = n;
  detail::check_gemm_args("gemm_pack_panels", s, 1.0, b, b, 0.0, panels, {});
  const int64_t rows = panel_rows(k);
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    float* panel = panels + j0 * rows;  // [rows, 64]
    const int64_t cols = std::min(kPanel, n - j0);
    if (trans_b) {  // b holds op(B)^T [N, K]: its rows j0.. transposed
      kernels::detail::transpose_tile(sizeof(float), b + j0 * ldb, ldb, panel, kPanel, k, cols, stream);
    } else {
      for (int64_t p = 0; p < k; ++p) std::copy_n(b + p * ldb + j0, cols, panel + p * kPanel);
    }
    for (int64_t p = 0; p < k && cols < kPanel; ++p) std::fill_n(panel + p * kPanel + cols, kPanel - cols, 0.0f);
    std::fill(panel + k * kPanel, panel + rows * kPanel, 0.0f);  // rows past K
  }
  if (stream) kernels::detail::stream_fence();
}

namespace detail {

GemmShape unpacked_panels_shape(const GemmShape& s) {
  GemmShape plain = s;
  plain.trans_b = false;
  plain.ldb = s.n;
  return plain;
}

GemmShape dense_panels_shape(const GemmShape& s) {
  GemmShape d = s;
  d.trans_a = false;
  d.lda = s.k;
  d.ldc = s.n;
  return d;
}

const float* dense_panels_a(const GemmShape& s, const float* a, std::vector<float>& buffer) {
  if (s.m <= 1 || (!s.trans_a && s.lda == s.k)) return a;
  buffer.resize(static_cast<size_t>(s.m * s.k));
  copy_to_rows(s.m, s.k, a, DType::f32, s.trans_a ? 1 : s.lda, s.trans_a ? s.lda : 1, buffer.data(), s.k);
  return buffer.data();
}

float* dense_panels_c(const GemmShape& s, float* c, float beta, std::vector<float>& buffer) {
  if (s.m <= 1 || s.ldc == s.n) return c;
  buffer.resize(static_cast<size_t>(s.m * s.n));
  if (beta != 0.0f) copy_to_rows(s.m, s.n, c, DType::f32, s.ldc, 1, buffer.data(), s.n);
  return buffer.data();
}

void finish_panels_c(const GemmShape& s, const float* out, float* c) {
  if (out != c) copy_to_rows(s.m, s.n, out, DType::f32, s.n, 1, c, s.ldc);
}

void gemm_unpack_panels(int64_t k, int64_t n, const float* panels, float* b) {
  const int64_t rows = panel_rows(k);
  for (int64_t j0 = 0; j0 < n; j0 += kPanel) {
    const float* panel = panels + j0 * rows;  // [rows, 64]
    const int64_t cols = std::min(kPanel, n - j0);
    for (int64_t p = 0; p < k; ++p) std::copy_n(panel + p * kPanel, cols, b + p * n + j0);
  }
}

int64_t check_gemm_panels_args(const char* op, const GemmShape& s, double alpha, const void* a, const void* panels,
                               double beta, const void* c) {
  // the packed B's checks: those of a dense [K, N]
  return check_gemm_args(op, unpacked_panels_shape(s), alpha, a, panels, beta, c, {});
}

}  // namespace detail

}  // namespace qkv
