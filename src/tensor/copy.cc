// Element-wise copies between tensors of any layout and dtype.
#include <algorithm>

#include "qkv/parallel.h"
#include "qkv/tensor.h"

namespace qkv {

namespace {

// Geometry of a two-tensor element-wise loop after merging dims that are
// contiguous in both tensors (so most copies run one long inner loop).
struct PairLoop {
  Shape shape;
  Strides dst, src;
};

PairLoop coalesce(const Shape& shape, const Strides& dst, const Strides& src) {
  PairLoop loop;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (!loop.shape.empty() && loop.dst.back() == dst[i] * shape[i] && loop.src.back() == src[i] * shape[i]) {
      loop.shape.back() *= shape[i];
      loop.dst.back() = dst[i];
      loop.src.back() = src[i];
      continue;
    }
    loop.shape.push_back(shape[i]);
    loop.dst.push_back(dst[i]);
    loop.src.push_back(src[i]);
  }
  if (loop.shape.empty()) loop = {{1}, {0}, {0}};
  return loop;
}

template <class To, class From>
void copy_rows(const PairLoop& loop, To* dst, const From* src, int64_t row_begin, int64_t row_end) {
  const size_t nd = loop.shape.size();
  const int64_t inner = loop.shape[nd - 1];
  const int64_t sd = loop.dst[nd - 1], ss = loop.src[nd - 1];
  std::vector<int64_t> index(nd - 1, 0);
  // Position the outer counter at row_begin.
  int64_t rest = row_begin;
  for (size_t d = nd - 1; d-- > 0;) {
    index[d] = rest % loop.shape[d];
    rest /= loop.shape[d];
  }
  for (int64_t row = row_begin; row < row_end; ++row) {
    int64_t od = 0, os = 0;
    for (size_t d = 0; d + 1 < nd; ++d) {
      od += index[d] * loop.dst[d];
      os += index[d] * loop.src[d];
    }
    To* out = dst + od;
    const From* in = src + os;
    for (int64_t i = 0; i < inner; ++i) out[i * sd] = convert_element<To>(in[i * ss]);
    for (size_t d = nd - 1; d-- > 0;) {  // increment the outer counter
      if (++index[d] < loop.shape[d]) break;
      index[d] = 0;
    }
  }
}

}  // namespace

void Tensor::copy_from(const Tensor& src) const {
  check_writable("copy_from");
  const Tensor source = src.expand(shape_);  // numpy broadcasting of src onto this shape
  if (numel_ == 0) return;
  const PairLoop loop = coalesce(shape_, strides_, source.strides());
  const int64_t inner = loop.shape.back();
  const int64_t rows = numel_ / inner;
  dispatch_dtype(dtype_, [&](auto to_tag) {
    using To = typename decltype(to_tag)::type;
    dispatch_dtype(source.dtype(), [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      To* out = static_cast<To*>(raw_data());
      const From* in = static_cast<const From*>(source.raw_data());
      const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / inner);
      parallel_for(0, rows, grain, [&](int64_t b, int64_t e) { copy_rows(loop, out, in, b, e); });
    });
  });
}

void Tensor::fill(double value) const {
  check_writable("fill");
  Tensor scalar = Tensor::empty({}, dtype_);
  scalar.set_item(std::span<const int64_t>(), value);
  copy_from(scalar);
}

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : clone(); }

Tensor Tensor::clone() const {
  Tensor out = empty(shape_, dtype_);
  out.copy_from(*this);
  return out;
}

Tensor Tensor::to(DType dtype) const {
  if (dtype == dtype_) return *this;
  Tensor out = empty(shape_, dtype);
  out.copy_from(*this);
  return out;
}

}  // namespace qkv
