// qkv::softmax on tensors: checks, layout (softmax dim made last and
// contiguous), and rows spread over threads; the row kernels do the math.
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "qkv/error.h"
#include "qkv/parallel.h"
#include "qkv/softmax.h"
#include "qkv/tensor.h"

namespace qkv {

namespace {

// Rows per parallel chunk: enough elements (~32K) that a chunk outweighs the
// cost of waking a thread.
int64_t row_grain(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(cols, 1)); }

template <class T>
void softmax_rows_of(T* data, int64_t rows, int64_t cols) {
  parallel_for(0, rows, row_grain(cols), [&](int64_t lo, int64_t hi) {
    T* first = data + lo * cols;
    if constexpr (std::is_same_v<T, float>) {
      kernels::softmax_rows(first, hi - lo, cols, cols);
    } else {
      for (int64_t r = 0; r < hi - lo; ++r) kernels::softmax_reference(first + r * cols, first + r * cols, cols);
    }
  });
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) {
  require_cpu("softmax", {&x});
  if (x.dtype() != DType::f32 && x.dtype() != DType::f64) {
    fail<DTypeError>("softmax: expected a float32 or float64 tensor, got ", dtype_name(x.dtype()), " of shape ",
                     shape_str(x.shape()));
  }
  const int64_t ndim = std::max<int64_t>(x.dim(), 1);  // a 0-dim tensor has dims 0 and -1
  if (dim < -ndim || dim >= ndim) {
    fail<IndexError>("softmax: dim ", dim, " out of range for tensor of shape ", shape_str(x.shape()));
  }
  if (x.dim() == 0) return softmax(x.reshape({1}), 0).reshape({});
  const int64_t d = dim < 0 ? dim + ndim : dim;
  const bool last = d == x.dim() - 1;
  // The rows are computed in place, in a fresh buffer with the softmax dim last.
  const Tensor moved = last ? x : x.transpose(d, -1);
  Tensor work = moved.clone();
  const int64_t cols = work.size(-1);
  const int64_t rows = cols == 0 ? 0 : work.numel() / cols;
  if (work.dtype() == DType::f32) {
    softmax_rows_of(work.data<float>(), rows, cols);
  } else {
    softmax_rows_of(work.data<double>(), rows, cols);
  }
  return last ? work : work.transpose(d, -1).contiguous();
}

}  // namespace qkv
