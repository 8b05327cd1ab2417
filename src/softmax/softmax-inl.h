// Per-target softmax/exp kernels (Highway). softmax_cpu.cc re-includes this file
// once per SIMD target via hwy/foreach_target.h and dispatches at run time; no
// other file includes it. Highway's own convention for the include guard:
// toggled per target, so the body is compiled once for each of them.
#if defined(QKV_KERNELS_CPU_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef QKV_KERNELS_CPU_SOFTMAX_INL_H_
#undef QKV_KERNELS_CPU_SOFTMAX_INL_H_
#else
#define QKV_KERNELS_CPU_SOFTMAX_INL_H_
#endif

#include <cstddef>
#include <cstdint>
#include <limits>

#include "hwy/contrib/math/math-inl.h"
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace qkv::kernels::HWY_NAMESPACE {

namespace hn = hwy::HWY_NAMESPACE;

// The kernels are templates over the element type (float, or double for float64
// attention); HWY_EXPORT takes no templates, so each has a float and a double
// wrapper at the end of this file.
template <class T>
constexpr T kInf = std::numeric_limits<T>::infinity();
// Above this exp overflows. float: Highway's Exp converts x / ln 2 to int32, which is
// only meaningful below it, so larger inputs are mapped to +inf explicitly. double:
// ln(DBL_MAX) = 709.7827; inputs in (709.78, 709.7827] also give +inf (they never
// reach the kernels in softmax or attention, whose inputs are x - max(x) <= 0).
template <class T>
constexpr T kExpOverflow = sizeof(T) == 4 ? T(89) : T(709.78);

// exp with IEEE edge cases: exp(NaN) = NaN (Highway's Exp gives 0), exp(-inf) = 0,
// exp(x > kExpOverflow) = +inf. Accuracy is Highway's (measured in
// tests/softmax/softmax_cpu_test.cc for float and double).
template <class D, class V = hn::Vec<D>>
HWY_INLINE V ExpIeee(D d, V x) {
  using T = hn::TFromD<D>;
  V y = hn::Exp(d, x);
  y = hn::IfThenElse(hn::Gt(x, hn::Set(d, kExpOverflow<T>)), hn::Set(d, kInf<T>), y);
  return hn::IfThenElse(hn::IsNaN(x), x, y);
}

// exp(x - shift) for attention's online softmax, where shift >= x (the running row max):
// cheaper than ExpIeee (about 14 vector ops against 30) for float32 only. With y = (x -
// shift) log2 e clamped to >= -127, n = round(y) and r = y - n in [-0.5, 0.5] (exact),
// 2^r is a degree-6 polynomial (fitted offline for relative error, Lawson's iteration on
// Chebyshev nodes: 1.9e-9 in exact arithmetic, 7.9e-8 = 1.32 ulp of 2^-24 evaluated with
// float32 FMAs) times 2^n built in the exponent field. Results
// below 2^-126.5 (y < -126.5) become +0, -inf (masked) gives +0, NaN stays NaN; the
// rounding of y adds up to |y| 2^-24 ln 2 relative, which is small beside a row's sum
// (at most 2e-8 of the row max's weight). Measured against std::exp in
// Softmax.FastExpShiftWithinItsBound (tests/softmax/softmax_cpu_test.cc).
//
// n and 2^n in two adds and a shift: j = y + (1.5 2^23 + 127) has a unit ulp, so it is
// round(y) + 1.5 2^23 + 127 (nearest even, as Round), j - that constant is round(y) exactly,
// and j's low mantissa bits hold n + 127, which shifted left by 23 is 2^n's exponent field (the
// constant's own bits shift out). On x86, max_ps(a, b) returns b where either is NaN, so
// Max(-127, t) keeps a NaN t, and a NaN y makes j, r, p and the result NaN: no NaN select
// there. 3 of 17 vector ops fewer than Round / ConvertTo / IsNaN; the results are the same
// bits (a NaN's payload aside).
#if HWY_ARCH_X86 && HWY_TARGET != HWY_EMU128 && HWY_TARGET != HWY_SCALAR
constexpr bool kMaxKeepsSecondNaN = true;
#else
constexpr bool kMaxKeepsSecondNaN = false;
#endif

struct ExpShiftFast {
  template <class D, class V = hn::Vec<D>>
  HWY_INLINE V operator()(D d, V x, V shift) const {
    const hn::RebindToSigned<D> di;
    const V t = hn::Mul(hn::Sub(x, shift), hn::Set(d, 1.44269504088896341f));
    const V y = hn::Max(hn::Set(d, -127.0f), t);  // a NaN t stays NaN on x86 (above)
    const V magic = hn::Set(d, 12583039.0f);       // 1.5 2^23 + 127
    const V j = hn::Add(y, magic);
    const V r = hn::Sub(y, hn::Sub(j, magic));  // y - round(y)
    V p = hn::Set(d, 1.534581242594868e-4f);
    p = hn::MulAdd(p, r, hn::Set(d, 1.3399930903688073e-3f));
    p = hn::MulAdd(p, r, hn::Set(d, 9.618489071726799e-3f));
    p = hn::MulAdd(p, r, hn::Set(d, 5.550328642129898e-2f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.24022646248340607f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.6931471824645996f));
    p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
    // 2^n for n in [-127, 0]: exponent field n + 127 (n = -127: +0).
    const V e = hn::Mul(p, hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(di, j))));
    if constexpr (kMaxKeepsSecondNaN) return e;
    return hn::IfThenElse(hn::IsNaN(t), t, e);  // (Max may drop a NaN: t is tested before it)
  }
};

// exp(x - shift) by ExpIeee: Highway's accuracy, any shift.
struct ExpShiftIeee {
  template <class D, class V = hn::Vec<D>>
  HWY_INLINE V operator()(D d, V x, V shift) const {
    return ExpIeee(d, hn::Sub(x, shift));
  }
};

// Vectors of `lanes` elements covering [0, n): the last, partial one goes through
// a padded stack buffer, so every element sees the same vector code (and the
// same rounding) and no load runs past the end of the row.
template <class T>
struct Tail {
  HWY_ALIGN T buf[HWY_MAX_BYTES / sizeof(T)];
};

// Largest element; -inf for n == 0; NaN when any element is NaN (hn::Max alone
// may drop NaN on x86, so NaN is tracked in a separate mask).
template <class T>
HWY_INLINE T MaxValueT(const T* HWY_RESTRICT x, int64_t n) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  auto m = hn::Set(d, -kInf<T>);
  auto nan = hn::FirstN(d, 0);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto v = hn::LoadU(d, x + i);
    m = hn::Max(m, v);
    nan = hn::Or(nan, hn::IsNaN(v));
  }
  if (i < n) {
    Tail<T> t;
    for (int64_t j = 0; j < lanes; ++j) t.buf[j] = i + j < n ? x[i + j] : -kInf<T>;
    const auto v = hn::Load(d, t.buf);
    m = hn::Max(m, v);
    nan = hn::Or(nan, hn::IsNaN(v));
  }
  if (!hn::AllFalse(d, nan)) return std::numeric_limits<T>::quiet_NaN();
  return hn::GetLane(hn::MaxOfLanes(d, m));
}

// x[i] = exp(x[i] - shift) by `exp` (ExpShiftIeee or ExpShiftFast); returns the sum of
// the new values.
template <class T, class Exp = ExpShiftIeee>
HWY_INLINE T ExpShiftSumT(T* HWY_RESTRICT x, int64_t n, T shift, Exp exp = Exp()) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vshift = hn::Set(d, shift);
  auto sum0 = hn::Zero(d), sum1 = hn::Zero(d);  // two chains hide the add latency
  int64_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const auto e0 = exp(d, hn::LoadU(d, x + i), vshift);
    const auto e1 = exp(d, hn::LoadU(d, x + i + lanes), vshift);
    hn::StoreU(e0, d, x + i);
    hn::StoreU(e1, d, x + i + lanes);
    sum0 = hn::Add(sum0, e0);
    sum1 = hn::Add(sum1, e1);
  }
  for (; i + lanes <= n; i += lanes) {
    const auto e = exp(d, hn::LoadU(d, x + i), vshift);
    hn::StoreU(e, d, x + i);
    sum0 = hn::Add(sum0, e);
  }
  if (i < n) {
    Tail<T> t;  // padding is -inf: exp gives 0 and adds nothing to the sum
    for (int64_t j = 0; j < lanes; ++j) t.buf[j] = i + j < n ? x[i + j] : -kInf<T>;
    const auto e = exp(d, hn::Load(d, t.buf), vshift);
    hn::Store(e, d, t.buf);
    for (int64_t j = 0; i + j < n; ++j) x[i + j] = t.buf[j];
    sum0 = hn::Add(sum0, hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(n - i)), e));
  }
  return hn::GetLane(hn::SumOfLanes(d, hn::Add(sum0, sum1)));
}

// x[i] *= s.
template <class T>
HWY_INLINE void ScaleT(T* HWY_RESTRICT x, int64_t n, T s) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vs = hn::Set(d, s);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Mul(hn::LoadU(d, x + i), vs), d, x + i);
  for (; i < n; ++i) x[i] *= s;  // IEEE multiply: same result as the vector lanes
}

// g[r][i] = y[r][i] * (g[r][i] - dot[r]): Sub then Mul (never contracted), as the tail's
// scalar code. One call per tile: a dispatch per 256-wide row cost what the vectors saved.
template <class T>
HWY_INLINE void SoftmaxBackwardRowsT(const T* HWY_RESTRICT y, T* HWY_RESTRICT g, int64_t rows, int64_t n, int64_t ld,
                                     const T* HWY_RESTRICT dot) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t r = 0; r < rows; ++r) {
    const T* yr = y + r * ld;
    T* gr = g + r * ld;
    const auto vdot = hn::Set(d, dot[r]);
    int64_t i = 0;
    for (; i + lanes <= n; i += lanes) {
      hn::StoreU(hn::Mul(hn::LoadU(d, yr + i), hn::Sub(hn::LoadU(d, gr + i), vdot)), d, gr + i);
    }
    for (; i < n; ++i) gr[i] = yr[i] * (gr[i] - dot[r]);
  }
}

// x[i] += keep[i] ? 0 : -inf: the masked lanes add -inf (never a select of -inf: a NaN or +inf
// score stays NaN, as the scalar tail and PyTorch give).
HWY_NOINLINE void AddBoolMask(float* HWY_RESTRICT x, const bool* HWY_RESTRICT keep, int64_t n) {
  const hn::ScalableTag<float> d;
  const hn::RebindToSigned<decltype(d)> di;
  const hn::Rebind<uint8_t, decltype(d)> d8;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto* bytes = reinterpret_cast<const uint8_t*>(keep);
  const auto minus_inf = hn::Set(d, -kInf<float>);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto k = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<decltype(d)>(), hn::LoadU(d8, bytes + i)));
    const auto masked = hn::RebindMask(d, hn::Eq(k, hn::Zero(di)));
    hn::StoreU(hn::Add(hn::LoadU(d, x + i), hn::IfThenElseZero(masked, minus_inf)), d, x + i);
  }
  for (; i < n; ++i) x[i] += bytes[i] != 0 ? 0.0f : -kInf<float>;
}

// x[i] = cap tanh(x[i] / cap); grad[i] = 1 - tanh^2 where grad is not null. A NaN lane is
// kept as it is (Highway's Tanh does not promise NaN in, NaN out).
HWY_NOINLINE void SoftcapRow(float* HWY_RESTRICT x, int64_t n, float cap, float* HWY_RESTRICT grad) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vcap = hn::Set(d, cap), one = hn::Set(d, 1.0f);
  auto step = [&](hn::Vec<decltype(d)> v, float* out, float* g) {
    const auto t = hn::Tanh(d, hn::Div(v, vcap));
    hn::StoreU(hn::IfThenElse(hn::IsNaN(v), v, hn::Mul(vcap, t)), d, out);
    if (g) hn::StoreU(hn::NegMulAdd(t, t, one), d, g);  // 1 - t * t
  };
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) step(hn::LoadU(d, x + i), x + i, grad ? grad + i : nullptr);
  if (i < n) {
    Tail<float> t, g;
    for (int64_t j = 0; j < lanes; ++j) t.buf[j] = i + j < n ? x[i + j] : 0.0f;
    step(hn::Load(d, t.buf), t.buf, grad ? g.buf : nullptr);
    for (int64_t j = 0; i + j < n; ++j) x[i + j] = t.buf[j];
    for (int64_t j = 0; grad && i + j < n; ++j) grad[i + j] = g.buf[j];
  }
}

// x[i] += slope * (first + i), the lane's position exact in float (first + n <= 2^24).
HWY_NOINLINE void AddRamp(float* HWY_RESTRICT x, int64_t n, float first, float slope) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  const auto vslope = hn::Set(d, slope);
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto pos = hn::Iota(d, first + static_cast<float>(i));
    hn::StoreU(hn::Add(hn::LoadU(d, x + i), hn::Mul(vslope, pos)), d, x + i);
  }
  for (; i < n; ++i) x[i] += slope * (first + static_cast<float>(i));
}

// x[i] += y[i].
template <class T>
HWY_INLINE void AddRowT(T* HWY_RESTRICT x, const T* HWY_RESTRICT y, int64_t n) {
  const hn::ScalableTag<T> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(hn::Add(hn::LoadU(d, x + i), hn::LoadU(d, y + i)), d, x + i);
  for (; i < n; ++i) x[i] += y[i];
}
HWY_NOINLINE void AddRow(float* HWY_RESTRICT x, const float* HWY_RESTRICT y, int64_t n) { AddRowT(x, y, n); }
HWY_NOINLINE void AddRow64(double* HWY_RESTRICT x, const double* HWY_RESTRICT y, int64_t n) { AddRowT(x, y, n); }

// x[i] = exp(x[i]).
HWY_NOINLINE void ExpInplace(float* HWY_RESTRICT x, int64_t n) {
  const hn::ScalableTag<float> d;
  const int64_t lanes = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(ExpIeee(d, hn::LoadU(d, x + i)), d, x + i);
  if (i < n) {
    Tail<float> t;
    for (int64_t j = 0; j < lanes; ++j) t.buf[j] = i + j < n ? x[i + j] : 0.0f;
    hn::Store(ExpIeee(d, hn::Load(d, t.buf)), d, t.buf);
    for (int64_t j = 0; i + j < n; ++j) x[i + j] = t.buf[j];
  }
}

// Softmax of one row in place: max, exp(x - max) with its sum, scale by 1/sum.
template <class T>
HWY_INLINE void SoftmaxRowT(T* HWY_RESTRICT x, int64_t n) {
  const T m = MaxValueT(x, n);
  if (m == -kInf<T>) {  // every entry masked (or n == 0): zeros, as PyTorch's _safe_softmax
    for (int64_t i = 0; i < n; ++i) x[i] = T(0);
    return;
  }
  // A NaN max (some NaN) or +inf max makes the sum NaN, and so the whole row,
  // as torch.softmax does.
  const T sum = ExpShiftSumT(x, n, m);
  ScaleT(x, n, T(1) / sum);
}

template <class T>
HWY_INLINE void SoftmaxRowsT(T* HWY_RESTRICT x, int64_t rows, int64_t cols, int64_t row_stride) {
  for (int64_t r = 0; r < rows; ++r) SoftmaxRowT(x + r * row_stride, cols);
}

// The exported instances (softmax_cpu.cc dispatches to them).
HWY_NOINLINE float MaxValue(const float* HWY_RESTRICT x, int64_t n) { return MaxValueT(x, n); }
HWY_NOINLINE double MaxValue64(const double* HWY_RESTRICT x, int64_t n) { return MaxValueT(x, n); }
HWY_NOINLINE float ExpShiftSum(float* HWY_RESTRICT x, int64_t n, float shift) { return ExpShiftSumT(x, n, shift); }
HWY_NOINLINE double ExpShiftSum64(double* HWY_RESTRICT x, int64_t n, double shift) { return ExpShiftSumT(x, n, shift); }
HWY_NOINLINE float ExpShiftSumFast(float* HWY_RESTRICT x, int64_t n, float shift) {
  return ExpShiftSumT(x, n, shift, ExpShiftFast());
}
HWY_NOINLINE void Scale(float* HWY_RESTRICT x, int64_t n, float s) { ScaleT(x, n, s); }
HWY_NOINLINE void SoftmaxBackwardRows(const float* HWY_RESTRICT y, float* HWY_RESTRICT g, int64_t rows, int64_t n,
                                      int64_t ld, const float* HWY_RESTRICT dot) {
  SoftmaxBackwardRowsT(y, g, rows, n, ld, dot);
}
HWY_NOINLINE void SoftmaxBackwardRows64(const double* HWY_RESTRICT y, double* HWY_RESTRICT g, int64_t rows, int64_t n,
                                        int64_t ld, const double* HWY_RESTRICT dot) {
  SoftmaxBackwardRowsT(y, g, rows, n, ld, dot);
}
HWY_NOINLINE void Scale64(double* HWY_RESTRICT x, int64_t n, double s) { ScaleT(x, n, s); }
HWY_NOINLINE void SoftmaxRows(float* HWY_RESTRICT x, int64_t rows, int64_t cols, int64_t row_stride) {
  SoftmaxRowsT(x, rows, cols, row_stride);
}
HWY_NOINLINE void SoftmaxRows64(double* HWY_RESTRICT x, int64_t rows, int64_t cols, int64_t row_stride) {
  SoftmaxRowsT(x, rows, cols, row_stride);
}

}  // namespace qkv::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // QKV_KERNELS_CPU_SOFTMAX_INL_H_ toggle
