// Seeded random tensors. Values depend only on (seed, element index), never on
// thread count or tiling, because they come from the counter-based Philox.
#include <cmath>
#include <numbers>

#include "qkv/parallel.h"
#include "qkv/random.h"
#include "qkv/tensor.h"

namespace qkv {

double random::normal(uint64_t seed, uint64_t counter) {
  const auto r = philox4x32(seed, counter);
  // Two uniforms in (0, 1] and [0, 1) with 32 bits each are plenty for tests and init.
  const double u1 = (static_cast<double>(r[0]) + 1.0) * 0x1.0p-32;
  const double u2 = static_cast<double>(r[1]) * 0x1.0p-32;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
}

namespace {
template <class Draw>
Tensor generate(const Shape& shape, DType dtype, Draw draw) {
  Tensor out = Tensor::empty(shape, dtype);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    T* p = out.data<T>();
    parallel_for(0, out.numel(), 4096, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = convert_element<T>(draw(static_cast<uint64_t>(i)));
    });
  });
  return out;
}
}  // namespace

Tensor Tensor::randn(const Shape& shape, uint64_t seed, DType dtype) {
  return generate(shape, dtype, [seed](uint64_t i) { return random::normal(seed, i); });
}

Tensor Tensor::uniform(const Shape& shape, uint64_t seed, double low, double high, DType dtype) {
  if (!(low <= high)) fail<ValueError>("uniform: low ", low, " > high ", high);
  return generate(shape, dtype, [=](uint64_t i) { return low + (high - low) * random::uniform(seed, i); });
}

Tensor Tensor::arange(int64_t n, DType dtype) {
  if (n < 0) fail<ValueError>("arange: negative length ", n);
  return generate({n}, dtype, [](uint64_t i) { return static_cast<double>(i); });
}

}  // namespace qkv
