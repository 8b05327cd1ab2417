// Runtime dispatch of the Highway softmax/exp kernels (softmax-inl.h, compiled
// once per SIMD target here and nowhere else) and the scalar double reference.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "kernels/cpu/hwy_targets.h"  // the target list, before any hwy/ header

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "softmax/softmax-inl.h"
#include "hwy/foreach_target.h"  // must come before highway.h
#include "hwy/highway.h"
#include "softmax/softmax-inl.h"

#if HWY_ONCE

#include "qkv/softmax.h"
#include "softmax/softmax_cpu.h"

namespace qkv::kernels {

HWY_EXPORT(SoftmaxRows);
HWY_EXPORT(SoftmaxRows64);
HWY_EXPORT(MaxValue);
HWY_EXPORT(MaxValue64);
HWY_EXPORT(ExpShiftSum);
HWY_EXPORT(ExpShiftSum64);
HWY_EXPORT(ExpShiftSumFast);
HWY_EXPORT(Scale);
HWY_EXPORT(Scale64);
HWY_EXPORT(ExpInplace);
HWY_EXPORT(SoftmaxBackwardRows);
HWY_EXPORT(SoftmaxBackwardRows64);
HWY_EXPORT(AddBoolMask);
HWY_EXPORT(AddRow);
HWY_EXPORT(AddRow64);
HWY_EXPORT(SoftcapRow);
HWY_EXPORT(AddRamp);

void softmax_rows(float* x, int64_t rows, int64_t cols, int64_t row_stride) {
  QKV_DYNAMIC_DISPATCH(SoftmaxRows)(x, rows, cols, row_stride);
}

void softmax_rows(double* x, int64_t rows, int64_t cols, int64_t row_stride) {
  QKV_DYNAMIC_DISPATCH(SoftmaxRows64)(x, rows, cols, row_stride);
}

float max_value(const float* x, int64_t n) { return QKV_DYNAMIC_DISPATCH(MaxValue)(x, n); }

double max_value(const double* x, int64_t n) { return QKV_DYNAMIC_DISPATCH(MaxValue64)(x, n); }

float exp_shift_sum(float* x, int64_t n, float shift) { return QKV_DYNAMIC_DISPATCH(ExpShiftSum)(x, n, shift); }

double exp_shift_sum(double* x, int64_t n, double shift) { return QKV_DYNAMIC_DISPATCH(ExpShiftSum64)(x, n, shift); }

float exp_shift_sum_fast(float* x, int64_t n, float shift) {
  return QKV_DYNAMIC_DISPATCH(ExpShiftSumFast)(x, n, shift);
}

double exp_shift_sum_fast(double* x, int64_t n, double shift) { return exp_shift_sum(x, n, shift); }

void scale(float* x, int64_t n, float s) { QKV_DYNAMIC_DISPATCH(Scale)(x, n, s); }

void scale(double* x, int64_t n, double s) { QKV_DYNAMIC_DISPATCH(Scale64)(x, n, s); }

void exp_inplace(float* x, int64_t n) { QKV_DYNAMIC_DISPATCH(ExpInplace)(x, n); }

void add_bool_mask(float* x, const bool* keep, int64_t n) { QKV_DYNAMIC_DISPATCH(AddBoolMask)(x, keep, n); }

void add_row(float* x, const float* bias, int64_t n) { QKV_DYNAMIC_DISPATCH(AddRow)(x, bias, n); }

void add_row(double* x, const double* bias, int64_t n) { QKV_DYNAMIC_DISPATCH(AddRow64)(x, bias, n); }

void softcap_row(float* x, int64_t n, float cap, float* grad) { QKV_DYNAMIC_DISPATCH(SoftcapRow)(x, n, cap, grad); }

void add_ramp(float* x, int64_t n, float first, float slope) { QKV_DYNAMIC_DISPATCH(AddRamp)(x, n, first, slope); }

void softmax_backward_rows(const float* y, float* g, int64_t rows, int64_t n, int64_t ld, const float* dot) {
  QKV_DYNAMIC_DISPATCH(SoftmaxBackwardRows)(y, g, rows, n, ld, dot);
}

void softmax_backward_rows(const double* y, double* g, int64_t rows, int64_t n, int64_t ld, const double* dot) {
  QKV_DYNAMIC_DISPATCH(SoftmaxBackwardRows64)(y, g, rows, n, ld, dot);
}

void softmax_reference(const double* x, double* y, int64_t n) {
  constexpr double kInf = std::numeric_limits<double>::infinity();
  double m = -kInf;
  bool nan = false;
  for (int64_t i = 0; i < n; ++i) {
    nan = nan || std::isnan(x[i]);
    m = std::max(m, x[i]);
  }
  if (nan || m == -kInf) {  // NaN row, or fully masked row (_safe_softmax: zeros)
    std::fill(y, y + n, nan ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    return;
  }
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    y[i] = std::exp(x[i] - m);  // +inf - +inf = NaN: a +inf makes the row NaN
    sum += y[i];
  }
  for (int64_t i = 0; i < n; ++i) y[i] /= sum;
}

namespace detail {

std::vector<int64_t> simd_targets() { return qkv::detail::dispatch_targets(); }

std::string simd_target_name(int64_t target) { return hwy::TargetName(target); }

void force_simd_target(int64_t target) { hwy::SetSupportedTargetsForTest(target); }

}  // namespace detail
}  // namespace qkv::kernels

#endif  // HWY_ONCE
