// Reduction kernels for einops.reduce: one strided loop per output element,
// outputs split over qkv::parallel_for. Simple and exact rather than fast.
#include "einops/reduce.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>

#include "qkv/parallel.h"

namespace qkv::einops_detail {

namespace {

struct Geometry {
  Shape kept_shape, red_shape;
  Strides kept_strides, red_strides;
  int64_t n_out = 1, n_red = 1;
};

Geometry split(const Tensor& x, int64_t n_kept) {
  Geometry g;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const int64_t size = x.shape()[d], stride = x.strides()[d];
    if (d < n_kept) {
      g.kept_shape.push_back(size);
      g.kept_strides.push_back(stride);
      g.n_out *= size;
      continue;
    }
    g.n_red *= size;
    if (size == 1) continue;
    if (!g.red_shape.empty() && g.red_strides.back() == stride * size) {  // merge contiguous reduced dims
      g.red_shape.back() *= size;
      g.red_strides.back() = stride;
    } else {
      g.red_shape.push_back(size);
      g.red_strides.push_back(stride);
    }
  }
  if (g.red_shape.empty()) {
    g.red_shape = {1};
    g.red_strides = {0};
  }
  return g;
}

// out[o] = finish(fold of step over the reduced elements of output o).
template <class T, class Out, class Acc, class Step, class Finish>
void reduce_loop(const Geometry& g, const T* in, Out* out, Acc init, Step step, Finish finish) {
  const size_t nr = g.red_shape.size();
  const int64_t inner = g.red_shape[nr - 1], inner_stride = g.red_strides[nr - 1];
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 14) / std::max<int64_t>(g.n_red, 1));
  parallel_for(0, g.n_out, grain, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> index(nr, 0);
    for (int64_t o = begin; o < end && !interrupt_requested(); ++o) {
      int64_t base = 0;
      for (size_t k = g.kept_shape.size(), rest = static_cast<size_t>(o); k-- > 0;) {
        base += static_cast<int64_t>(rest % g.kept_shape[k]) * g.kept_strides[k];
        rest /= g.kept_shape[k];
      }
      Acc acc = init;
      if (g.n_red > 0) {
        std::fill(index.begin(), index.end(), 0);
        int64_t off = base;
        while (true) {
          const T* p = in + off;
          for (int64_t j = 0; j < inner; ++j) acc = step(acc, p[j * inner_stride]);
          size_t k = nr - 1;
          while (k-- > 0) {  // advance the odometer over the outer reduced dims
            off += g.red_strides[k];
            if (++index[k] < g.red_shape[k]) break;
            off -= index[k] * g.red_strides[k];
            index[k] = 0;
          }
          if (k == static_cast<size_t>(-1)) break;
        }
      }
      out[o] = finish(acc);
    }
  });
}

template <class T>
Tensor reduce_typed(const Tensor& x, const Geometry& g, einops::Reduction op, const Shape& out_shape) {
  using R = einops::Reduction;
  constexpr bool floating = !std::is_integral_v<T>;  // float, double, float16, bfloat16
  using Acc = std::conditional_t<floating, double, int64_t>;
  using Sum = std::conditional_t<floating, T, int64_t>;  // numpy: int and bool sums are int64
  const T* in = x.data<T>();
  auto value = [](T v) { return convert_element<Acc>(v); };
  if (op == R::sum || op == R::prod) {
    Tensor out = Tensor::empty(out_shape, dtype_v<Sum>);
    const bool sum = op == R::sum;
    reduce_loop(
        g, in, out.data<Sum>(), Acc(sum ? 0 : 1),
        [&](Acc a, T v) {
          if constexpr (floating) {
            return sum ? a + value(v) : a * value(v);
          } else {  // wraps around like numpy's int64 (unsigned arithmetic: no signed overflow)
            const auto ua = static_cast<uint64_t>(a), uv = static_cast<uint64_t>(value(v));
            return static_cast<Acc>(sum ? ua + uv : ua * uv);
          }
        },
        [](Acc a) { return convert_element<Sum>(a); });
    return out;
  }
  if (op == R::mean) {
    if constexpr (!floating) {
      fail<DTypeError>("reduce_mean is not available for non-floating tensors");
    } else {
      Tensor out = Tensor::empty(out_shape, x.dtype());
      const double n = static_cast<double>(g.n_red);
      reduce_loop(
          g, in, out.data<T>(), 0.0, [&](double a, T v) { return a + value(v); },
          [n](double a) { return convert_element<T>(a / n); });
      return out;
    }
  }
  if (op == R::max || op == R::min) {
    if (g.n_red == 0 && g.n_out > 0) {
      fail<ShapeError>("zero-size array to reduction operation ", op == R::max ? "maximum" : "minimum",
                       " which has no identity");
    }
    Tensor out = Tensor::empty(out_shape, x.dtype());
    const bool max = op == R::max;
    Acc init = max ? std::numeric_limits<Acc>::lowest() : std::numeric_limits<Acc>::max();
    if constexpr (floating) init = max ? -std::numeric_limits<Acc>::infinity() : std::numeric_limits<Acc>::infinity();
    reduce_loop(
        g, in, out.data<T>(), init,
        [&](Acc a, T v) {
          const Acc b = value(v);
          if constexpr (floating) {
            if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<Acc>::quiet_NaN();
          }
          return max ? std::max(a, b) : std::min(a, b);
        },
        [](Acc a) { return convert_element<T>(a); });
    return out;
  }
  Tensor out = Tensor::empty(out_shape, DType::b8);
  const bool any = op == R::any;  // else all
  reduce_loop(
      g, in, out.data<bool>(), !any,
      [&](bool a, T v) { return any ? (a || convert_element<bool>(v)) : (a && convert_element<bool>(v)); },
      [](bool a) { return a; });
  return out;
}

}  // namespace

Tensor reduce_trailing(const Tensor& x, int64_t n_kept, einops::Reduction op) {
  const Geometry g = split(x, n_kept);
  return dispatch_dtype(x.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    return reduce_typed<T>(x, g, op, g.kept_shape);
  });
}

}  // namespace qkv::einops_detail
