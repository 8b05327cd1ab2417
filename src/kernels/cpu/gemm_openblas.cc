// float64 gemm over OpenBLAS (the OpenMP build, so its threads are qkv's OpenMP
// threads and it runs on one thread inside parallel_for). oneDNN, which runs every
// float32 GEMM, has no f64 matmul on CPUs.
#include <cblas.h>

#include <algorithm>
#include <limits>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/parallel_internal.h"
#include "qkv/error.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"

namespace qkv {

namespace {

using detail::GemmDim;

// Below this many multiply-adds per matrix, a batch runs as parallel_for over its
// matrices (one dgemm per thread) rather than one multi-threaded dgemm after another.
constexpr double kParallelBatchMacs = 1 << 21;

// A leading dimension cblas accepts: BLAS wants ld >= max(1, row length) even when
// the matrix has one stored row and qkv's contract leaves ld unused.
int64_t blas_ld(int64_t ld, int64_t row_length) { return std::max({ld, row_length, int64_t{1}}); }

struct DgemmCall {
  CBLAS_TRANSPOSE ta, tb;
  blasint m, n, k, lda, ldb, ldc;
  double alpha, beta;

  void run(const double* a, const double* b, double* c) const {
    cblas_dgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
};

DgemmCall make_call(const GemmShape& s, double alpha, double beta, const GemmBatch& batch) {
  for (int64_t v : {s.m, s.n, s.k, s.lda, s.ldb, s.ldc}) {
    if (v > std::numeric_limits<blasint>::max()) {
      fail<ValueError>("gemm: float64 matrix dims and leading dims must fit OpenBLAS' 32-bit integers for ",
                       detail::gemm_args_str(s, batch));
    }
  }
  return {s.trans_a ? CblasTrans : CblasNoTrans,
          s.trans_b ? CblasTrans : CblasNoTrans,
          static_cast<blasint>(s.m),
          static_cast<blasint>(s.n),
          static_cast<blasint>(s.k),
          static_cast<blasint>(blas_ld(s.lda, s.trans_a ? s.m : s.k)),
          static_cast<blasint>(blas_ld(s.ldb, s.trans_b ? s.k : s.n)),
          static_cast<blasint>(blas_ld(s.ldc, s.n)),
          alpha,
          beta};
}

}  // namespace

void gemm(const GemmShape& s, double alpha, const double* a, const double* b, double beta, double* c,
          const GemmBatch& batch) {
  const int64_t count = detail::check_gemm_args("gemm", s, alpha, a, b, beta, c, batch);
  if (count == 0 || s.m == 0 || s.n == 0) return;
  const std::vector<GemmDim> dims = detail::simplify_gemm_batch(detail::gemm_batch_dims(batch));
  if (s.k == 0 || alpha == 0.0) {  // A and B are not read (and may be null)
    detail::scale_gemm_batch(s, beta, c, dims);
    return;
  }
  const DgemmCall call = make_call(s, alpha, beta, batch);
  const int threads = detail::sync_runtime_threads();  // OpenBLAS sizes its team from OpenMP
  const double macs = static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
  if (threads > 1 && count > 1 && macs < kParallelBatchMacs) {
    parallel_for(0, count, 1, [&](int64_t lo, int64_t hi) {
      detail::for_each_gemm_batch(dims, lo, hi, [&](int64_t oa, int64_t ob, int64_t oc) {
        if (!interrupt_requested()) call.run(a + oa, b + ob, c + oc);  // parallel_for throws
      });
    });
    return;
  }
  detail::for_each_gemm_batch(dims, 0, count, [&](int64_t oa, int64_t ob, int64_t oc) {
    if (!interrupt_requested()) call.run(a + oa, b + ob, c + oc);  // Ctrl-C between batch entries
  });
  check_interrupt("gemm");
}

}  // namespace qkv
