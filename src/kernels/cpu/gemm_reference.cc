// The gemm oracle: plain loops, wide accumulation (double for float32 and 16-bit
// operands, long double for float64), one rounding per output. Deliberately naive (no blocking, no
// threads) so that it is obviously right.
#include <type_traits>
#include <vector>

#include "kernels/cpu/gemm_internal.h"
#include "qkv/gemm.h"

namespace qkv {

namespace {

// x as Acc (16-bit floats through their exact float value).
template <class Acc, class X>
Acc widen(X x) {
  if constexpr (std::is_same_v<X, bfloat16> || std::is_same_v<X, float16>) {
    return static_cast<Acc>(static_cast<float>(x));
  } else {
    return static_cast<Acc>(x);
  }
}

// C = alpha * op(A) op(B) + beta * C for one matrix; AB is the type of A and B, T
// that of C and the scalars, Acc the accumulator type.
template <class AB, class T, class Acc>
void reference_matrix(const GemmShape& s, T alpha, const AB* a, const AB* b, T beta, T* c) {
  // Element (i, p) of op(A) and (p, j) of op(B), whatever the storage order.
  const int64_t a_row = s.trans_a ? 1 : s.lda, a_col = s.trans_a ? s.lda : 1;
  const int64_t b_row = s.trans_b ? 1 : s.ldb, b_col = s.trans_b ? s.ldb : 1;
  const bool reads_ab = s.k > 0 && alpha != T{0};
  for (int64_t i = 0; i < s.m; ++i) {
    for (int64_t j = 0; j < s.n; ++j) {
      Acc acc = 0;
      if (reads_ab) {
        for (int64_t p = 0; p < s.k; ++p) {
          acc += widen<Acc>(a[i * a_row + p * a_col]) * widen<Acc>(b[p * b_row + j * b_col]);
        }
      }
      T& out = c[i * s.ldc + j];
      const Acc prior = beta == T{0} ? Acc{0} : static_cast<Acc>(beta) * out;
      out = static_cast<T>(static_cast<Acc>(alpha) * acc + prior);
    }
  }
}

template <class AB, class T, class Acc>
void reference_batch(const GemmShape& s, T alpha, const AB* a, const AB* b, T beta, T* c, const GemmBatch& batch) {
  const int64_t count = detail::check_gemm_args("gemm_reference", s, alpha, a, b, beta, c, batch);
  if (count == 0 || s.m == 0 || s.n == 0) return;
  detail::for_each_gemm_batch(detail::gemm_batch_dims(batch), 0, count, [&](int64_t oa, int64_t ob, int64_t oc) {
    // Unread operands may be null: never form a pointer from them.
    const AB* pa = a ? a + oa : nullptr;
    const AB* pb = b ? b + ob : nullptr;
    reference_matrix<AB, T, Acc>(s, alpha, pa, pb, beta, c + oc);
  });
}

}  // namespace

void gemm_reference(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c,
                    const GemmBatch& batch) {
  reference_batch<float, float, double>(s, alpha, a, b, beta, c, batch);
}

void gemm_reference(const GemmShape& s, double alpha, const double* a, const double* b, double beta, double* c,
                    const GemmBatch& batch) {
  reference_batch<double, double, long double>(s, alpha, a, b, beta, c, batch);
}

void gemm_reference(const GemmShape& s, float alpha, const bfloat16* a, const bfloat16* b, float beta, float* c,
                    const GemmBatch& batch) {
  reference_batch<bfloat16, float, double>(s, alpha, a, b, beta, c, batch);
}

void gemm_reference(const GemmShape& s, float alpha, const float16* a, const float16* b, float beta, float* c,
                    const GemmBatch& batch) {
  reference_batch<float16, float, double>(s, alpha, a, b, beta, c, batch);
}

void gemm_panels_reference(const GemmShape& s, float alpha, const float* a, const float* panels, float beta, float* c) {
  detail::check_gemm_panels_args("gemm_panels_reference", s, alpha, a, panels, beta, c);
  std::vector<float> b(static_cast<size_t>(s.k * s.n));  // [K, N] unpacked
  if (alpha != 0.0f) detail::gemm_unpack_panels(s.k, s.n, panels, b.data());
  reference_batch<float, float, double>(detail::unpacked_panels_shape(s), alpha, a, b.data(), beta, c, {});
}

void gemm_reference(const GemmShape& s, const int8_t* a, const int8_t* b, int32_t* c, const GemmBatch& batch) {
  detail::check_int8_depth("gemm_reference", s, batch);
  reference_batch<int8_t, int32_t, int64_t>(s, int32_t{1}, a, b, int32_t{0}, c, batch);
}

}  // namespace qkv
