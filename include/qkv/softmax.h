// Softmax over one dim, and the raw row kernels fused attention builds on.
//
// Conventions (torch.softmax's, with PyTorch >= 2.5's _safe_softmax for masks):
//   softmax(x)_i = exp(x_i - max(x)) / sum_j exp(x_j - max(x));
//   a slice whose entries are all -inf (fully masked) gives zeros, not NaN;
//   a NaN anywhere in a slice, or a +inf, makes the whole slice NaN.
// f32 runs on Highway SIMD (AVX-512 / AVX2 / scalar, chosen at run time); f64
// is scalar, exactly the reference below.
#pragma once

#include <cstdint>

#include "qkv/tensor.h"

namespace qkv {

// Softmax of x along `dim` (negative counts from the end) for f32 and f64
// tensors of any layout and rank (a 0-dim tensor is one slice of one element).
// Returns a new contiguous tensor of x's shape and dtype; x is not modified.
// DTypeError for other dtypes, IndexError for a dim out of range.
Tensor softmax(const Tensor& x, int64_t dim = -1);

namespace kernels {

// The row kernels come in float and double (Highway SIMD for both; the double ones
// serve float64 attention).

// In place: softmax of `rows` rows of `cols` contiguous elements, row r starting
// at x + r * row_stride. Single-threaded: callers parallelise over rows.
void softmax_rows(float* x, int64_t rows, int64_t cols, int64_t row_stride);
void softmax_rows(double* x, int64_t rows, int64_t cols, int64_t row_stride);

// Largest of x[0, n); -inf when n == 0; NaN when any element is NaN.
float max_value(const float* x, int64_t n);
double max_value(const double* x, int64_t n);

// x[i] = exp(x[i] - shift) and returns the sum of the new x[i] (in vector lanes):
// the online-softmax step, with shift >= max(x) so nothing overflows.
float exp_shift_sum(float* x, int64_t n, float shift);
double exp_shift_sum(double* x, int64_t n, double shift);

// exp_shift_sum for fused attention's online softmax, shift >= max(x) (else the
// results are unspecified): float32 on a cheaper exp (a degree-6 polynomial of 2^r,
// within 1e-7 relative of 2^y for the y = log2 e (x - shift) it computes in float32:
// 1.3 ulp with FMAs, 1.6 on the scalar target; results below 2^-126.5 are +0, -inf
// gives 0, NaN stays NaN; softmax-inl.h's ExpShiftFast). double: exp_shift_sum itself.
float exp_shift_sum_fast(float* x, int64_t n, float shift);
double exp_shift_sum_fast(double* x, int64_t n, double shift);

// The softmax's backward on `rows` rows of n elements (y and g rows `ld` apart):
// g[r][i] = y[r][i] * (g[r][i] - dot[r]), where y is the softmax, g its incoming gradient and
// dot[r] = sum_j y[r][j] g[r][j] (fused attention's backward passes D_i = dO_i . O_i, the same
// sum). IEEE subtract then multiply in every lane: exactly the scalar loop's result.
void softmax_backward_rows(const float* y, float* g, int64_t rows, int64_t n, int64_t ld, const float* dot);
void softmax_backward_rows(const double* y, double* g, int64_t rows, int64_t n, int64_t ld, const double* dot);

// Masks on a score row (fused attention's tiles): x[i] += keep[i] ? 0 : -inf, PyTorch's bool
// mask (so a NaN or +inf score that is masked out becomes NaN, as it does there: inf - inf),
// keep holding bools (0 or 1 bytes), read as bytes; and x[i] += bias[i], a float mask row (also
// the backward's gradient rows, float and double).
void add_bool_mask(float* x, const bool* keep, int64_t n);
void add_row(float* x, const float* bias, int64_t n);
void add_row(double* x, const double* bias, int64_t n);

// Score modifiers on a row (attention_mods.h; fused attention's float32 tiles):
// softcap_row: x[i] = cap tanh(x[i] / cap) on Highway's Tanh (within 4 ulp; NaN stays NaN,
// +-inf gives +-cap), and, where grad is not null, grad[i] = 1 - tanh^2 (its derivative in
// x[i]); add_ramp: x[i] += slope * (first + i), ALiBi's linear bias (first + n must stay
// within 2^24, where float counts exactly).
void softcap_row(float* x, int64_t n, float cap, float* grad);
void add_ramp(float* x, int64_t n, float first, float slope);

// x[i] *= s.
void scale(float* x, int64_t n, float s);
void scale(double* x, int64_t n, double s);

// x[i] = exp(x[i]) (Highway's Exp, within 2 ulp of the correctly rounded value
// for normal results); exp(-inf) = 0, exp(x > 88.73) = +inf, exp(NaN) = NaN.
void exp_inplace(float* x, int64_t n);

// The oracle: softmax of one row of n doubles with std::exp, same conventions;
// y may equal x. Also the f64 path of softmax().
void softmax_reference(const double* x, double* y, int64_t n);

}  // namespace kernels
}  // namespace qkv
