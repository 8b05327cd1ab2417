// Shared by the gemm tests: random operands in any batch layout and the
// comparison of qkv::gemm with qkv::gemm_reference.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemm_internal.h"
#include "qkv/gemm.h"

namespace qkv::test {

// A buffer holding one operand of a batched gemm, with `base` the offset of the
// [0, ..., 0] element (non-zero when some batch stride is negative).
template <class T = float>
struct Buffer {
  std::vector<T> data;
  int64_t base = 0;
  T* ptr() { return data.data() + base; }
};

// Span of a stored matrix of `rows` rows of `len` elements, `ld` apart.
inline int64_t matrix_span(int64_t rows, int64_t len, int64_t ld) {
  return rows == 0 || len == 0 ? 0 : (rows - 1) * ld + len;
}

template <class T = float>
Buffer<T> make_buffer(int64_t span, const std::vector<int64_t>& shape, const std::vector<int64_t>& strides,
                      std::mt19937& rng) {
  Buffer<T> buf;
  int64_t lo = 0, hi = std::max<int64_t>(span, 1);
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t reach = (std::max<int64_t>(shape[d], 1) - 1) * strides[d];
    (reach < 0 ? lo : hi) += reach;
  }
  buf.base = -lo;
  buf.data.resize(static_cast<size_t>(hi - lo));
  std::uniform_real_distribution<T> dist(-1, 1);
  for (T& x : buf.data) x = dist(rng);
  return buf;
}

struct Case {
  GemmShape s;
  float alpha = 1.0f, beta = 0.0f;
  GemmBatch batch;
};

inline std::string describe(const Case& c) {
  return detail::gemm_args_str(c.s, c.batch) + ", alpha=" + std::to_string(c.alpha) +
         ", beta=" + std::to_string(c.beta);
}

// Runs gemm and gemm_reference on the same random inputs of type T (float or
// double) and compares all of C's buffer: written elements within 1e-6 (float) or
// 2e-15 (double) * sqrt(K) of the sum of |terms| (the scale of the rounding
// error), padding untouched bit for bit.
template <class T = float>
void expect_matches_reference(const Case& c, uint32_t seed = 1) {
  SCOPED_TRACE(describe(c));
  std::mt19937 rng(seed);
  const GemmShape& s = c.s;
  const T alpha = c.alpha, beta = c.beta;
  Buffer<T> a = make_buffer<T>(matrix_span(s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k, s.lda), c.batch.shape,
                               c.batch.stride_a, rng);
  Buffer<T> b = make_buffer<T>(matrix_span(s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, s.ldb), c.batch.shape,
                               c.batch.stride_b, rng);
  Buffer<T> out = make_buffer<T>(matrix_span(s.m, s.n, s.ldc), c.batch.shape, c.batch.stride_c, rng);
  Buffer<T> expected = out, bound = out;
  gemm(s, alpha, a.ptr(), b.ptr(), beta, out.ptr(), c.batch);
  gemm_reference(s, alpha, a.ptr(), b.ptr(), beta, expected.ptr(), c.batch);
  // The same product over absolute values bounds the size of every term.
  for (auto* buf : {&a, &b, &bound}) {
    for (T& x : buf->data) x = std::fabs(x);
  }
  gemm_reference(s, std::fabs(alpha), a.ptr(), b.ptr(), std::fabs(beta), bound.ptr(), c.batch);
  const double eps = sizeof(T) == 4 ? 1e-6 : 2e-15;
  const double rel = eps * std::sqrt(static_cast<double>(std::max<int64_t>(s.k, 1)));
  int failures = 0;
  for (size_t i = 0; i < out.data.size() && failures < 5; ++i) {
    const double got = out.data[i], want = expected.data[i];
    const bool ok = std::isnan(want) ? std::isnan(got) : std::fabs(got - want) <= rel * bound.data[i];
    if (!ok) {
      ++failures;
      ADD_FAILURE() << "element " << i - static_cast<size_t>(out.base) << ": gemm " << got << ", reference " << want
                    << ", bound " << rel * bound.data[i];
    }
  }
}

inline Case plain(int64_t m, int64_t n, int64_t k, bool ta = false, bool tb = false, int64_t pad = 0) {
  Case c;
  c.s = {ta, tb, m, n, k, (ta ? m : k) + pad, (tb ? k : n) + pad, n + pad};
  return c;
}

// `trials` random plain cases: sizes around vector widths, transposes, padding,
// alpha/beta combinations; each against the reference in type T.
template <class T = float>
void expect_random_shapes_match(int trials, uint32_t seed) {
  const int64_t sizes[] = {1, 2, 3, 5, 7, 16, 17, 31, 64, 100, 129};
  const float scalars[][2] = {{1, 0}, {0.5f, 0}, {1, 1}, {-1.5f, 0.25f}, {2, -1}};
  std::mt19937 rng(seed);
  auto pick = [&](auto& arr) { return arr[rng() % std::size(arr)]; };
  for (int trial = 0; trial < trials; ++trial) {
    Case c = plain(pick(sizes), pick(sizes), pick(sizes), rng() & 1, rng() & 2, trial % 3 == 0 ? 3 : 0);
    c.alpha = pick(scalars)[0];
    c.beta = pick(scalars)[1];
    expect_matches_reference<T>(c, static_cast<uint32_t>(trial));
  }
}

}  // namespace qkv::test
