// Shared pieces of the einsum and einops libFuzzer targets: the process set-up
// (allocation limit, one thread), dims drawn from a FuzzedDataProvider (mostly small,
// sometimes 0, 1 or near 2^62 / 2^63, sometimes anything), and small integer-valued
// tensors in any dtype and layout (contiguous, permuted, strided, reversed, broadcast).
//
// Input layout: the text (equation or pattern) comes first, from the front of the
// input (ConsumeRandomLengthString), the numbers that pick shapes and options come
// from the back (FuzzedDataProvider's integrals). A plain-text seed such as
// "bhid,bhjd->bhij" therefore is the text with default choices (small dims).
#pragma once

#include <fuzzer/FuzzedDataProvider.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <optional>
#include <vector>

#include "qkv/parallel.h"
#include "qkv/tensor.h"

namespace qkv_fuzz {

// Outputs above this fail with a qkv error instead of being allocated
// (QKV_MAX_ALLOC_BYTES, read by qkv's checked allocation); libFuzzer's own
// -rss_limit_mb (2 GB in scripts/fuzz.sh) catches anything that gets past it.
inline constexpr const char* kMaxAllocBytes = "67108864";  // 64 MiB

inline void init_process() {
  setenv("QKV_MAX_ALLOC_BYTES", kMaxAllocBytes, /*overwrite=*/0);
  qkv::set_num_threads(1);  // deterministic, and the fuzz machine is shared
}

// Equal element by element, NaN equal to NaN (a mean over zero elements).
inline bool same_values(const std::vector<double>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i] != b[i] && !(std::isnan(a[i]) && std::isnan(b[i]))) return false;
  }
  return true;
}

// A dim: mostly 1-5 (what the all-zero default bytes give, varied by `salt` so that
// labels differ), sometimes 0, sizes past the kernels' thresholds, near-overflow
// values, or any int64 (negative ones included).
inline int64_t draw_dim(FuzzedDataProvider& fdp, int salt) {
  static constexpr int64_t kSpecial[] = {
      0,
      1,
      6,
      7,
      16,
      64,
      65,
      4096,
      int64_t{1} << 20,
      int64_t{1} << 31,
      int64_t{1} << 32,
      3037000500,  // ~sqrt(2^63): the square overflows int64
      int64_t{1} << 40,
      int64_t{1} << 52,
      (int64_t{1} << 53) + 1,
      int64_t{1} << 60,
      (int64_t{1} << 62) - 1,
      int64_t{1} << 62,
      (int64_t{1} << 62) + 1,
      std::numeric_limits<int64_t>::max() - 1,
      std::numeric_limits<int64_t>::max(),
  };
  constexpr int kNumSpecial = sizeof(kSpecial) / sizeof(kSpecial[0]);
  const uint8_t kind = fdp.ConsumeIntegral<uint8_t>();
  if (kind < 176) return 1 + (kind + salt) % 5;
  if (kind < 184) return 0;
  if (kind < 192) return 1;
  if (kind < 248) return kSpecial[(kind - 192) % kNumSpecial];
  return fdp.ConsumeIntegral<int64_t>();
}

// Product of the dims, nullopt on a negative dim or when the product of the non-zero
// dims passes 2^62 (qkv's largest tensor: its strides are still those products).
// The fuzzer's own check, independent of qkv's.
inline std::optional<int64_t> checked_numel(const qkv::Shape& shape) {
  int64_t nonzero = 1;
  bool zero = false;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      zero = true;
    } else if (__builtin_mul_overflow(nonzero, d, &nonzero) || nonzero > (int64_t{1} << 62)) {
      return std::nullopt;
    }
  }
  return zero ? 0 : nonzero;
}

inline qkv::DType draw_dtype(FuzzedDataProvider& fdp) {
  static constexpr qkv::DType kTypes[] = {qkv::DType::f32, qkv::DType::f64, qkv::DType::f16, qkv::DType::bf16,
                                          qkv::DType::i32, qkv::DType::i64, qkv::DType::i8,  qkv::DType::b8};
  return kTypes[fdp.ConsumeIntegral<uint8_t>() % 8];
}

// Values in {-1, 0, 1} ({0, 1} for bool): exact in every dtype, and so are the sums
// of products einsum and reduce form on small tensors, so results compare exactly.
inline std::vector<double> small_values(int64_t n, uint32_t seed) {
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    seed = seed * 1103515245u + 12345u;
    v[static_cast<size_t>(i)] = static_cast<double>((seed >> 16) % 3) - 1.0;
  }
  return v;
}

// A tensor of `shape` (numel small, checked by the caller) in one of five layouts,
// chosen by the fuzzer: contiguous, permuted (reversed dim order), every other
// element of a twice-longer first dim, last dim reversed (negative stride), or a
// broadcast of its first dim (zero stride).
inline qkv::Tensor make_tensor(FuzzedDataProvider& fdp, const qkv::Shape& shape, qkv::DType dtype) {
  const uint8_t layout = fdp.ConsumeIntegral<uint8_t>() % 5;
  const uint32_t seed = fdp.ConsumeIntegral<uint32_t>();
  const int64_t n = checked_numel(shape).value_or(0);
  auto fill = [&](const qkv::Shape& s) {
    const int64_t m = checked_numel(s).value_or(0);
    std::vector<double> v = small_values(m, seed);
    if (dtype == qkv::DType::b8)
      for (double& x : v) x = x != 0 ? 1 : 0;
    return qkv::Tensor::from_vector(v, s).to(dtype);
  };
  const size_t rank = shape.size();
  if (layout == 1 && rank >= 2) {
    qkv::Shape reversed(shape.rbegin(), shape.rend());
    std::vector<int64_t> dims(rank);
    for (size_t i = 0; i < rank; ++i) dims[i] = static_cast<int64_t>(rank - 1 - i);
    return fill(reversed).permute(dims);  // [shape], strides decreasing to the left
  }
  if (layout == 2 && rank >= 1 && n > 0) {  // n > 0: every dim is small
    qkv::Shape longer = shape;
    longer[0] *= 2;
    return fill(longer).slice(0, 0, longer[0], 2);  // [shape], stride 2x along dim 0
  }
  if (layout == 3 && rank >= 1 && n > 0) {
    const qkv::Tensor base = fill(shape);
    qkv::Strides strides = base.strides();
    const int64_t last = shape.back();
    strides.back() = -strides.back();
    return qkv::Tensor::view_of(base.storage(), dtype, shape, strides, last - 1);  // last dim reversed
  }
  if (layout == 4 && rank >= 1 && n > 0) {  // n == 0 with dim 0 empty: the others may be huge
    qkv::Shape one = shape;
    one[0] = 1;
    return fill(one).expand(shape);  // [shape], stride 0 along dim 0
  }
  return fill(shape);
}

}  // namespace qkv_fuzz
