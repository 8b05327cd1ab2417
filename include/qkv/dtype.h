// Element types of qkv tensors and compile-time dispatch over them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>

#include "qkv/error.h"
#include "qkv/half.h"

namespace qkv {

enum class DType : uint8_t { f32, f64, f16, bf16, i8, i32, i64, b8 };

// Bytes per element.
constexpr size_t itemsize(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64: return 8;
    case DType::f32:
    case DType::i32: return 4;
    case DType::f16:
    case DType::bf16: return 2;
    case DType::i8:
    case DType::b8: return 1;
  }
  return 0;
}

// numpy's names: "float32", "bfloat16", "bool", ...
std::string_view dtype_name(DType t);
// Inverse of dtype_name; also accepts "f32", "f64", "f16", "bf16", "i8", "i32", "i64".
// Throws DTypeError naming the string.
DType dtype_from_name(std::string_view name);

constexpr bool is_floating(DType t) {
  return t == DType::f32 || t == DType::f64 || t == DType::f16 || t == DType::bf16;
}

// numpy's result_type for two dtypes (bf16 with f16 gives f32, as PyTorch).
DType promote_types(DType a, DType b);

template <class T>
struct dtype_of;
// A table, one dtype per line:
// clang-format off
template <> struct dtype_of<float> { static constexpr DType value = DType::f32; };
template <> struct dtype_of<double> { static constexpr DType value = DType::f64; };
template <> struct dtype_of<float16> { static constexpr DType value = DType::f16; };
template <> struct dtype_of<bfloat16> { static constexpr DType value = DType::bf16; };
template <> struct dtype_of<int8_t> { static constexpr DType value = DType::i8; };
template <> struct dtype_of<int32_t> { static constexpr DType value = DType::i32; };
template <> struct dtype_of<int64_t> { static constexpr DType value = DType::i64; };
template <> struct dtype_of<bool> { static constexpr DType value = DType::b8; };
// clang-format on
template <class T>
inline constexpr DType dtype_v = dtype_of<T>::value;

template <class T>
struct type_tag {
  using type = T;
};

// Calls fn(type_tag<T>{}) with T the C++ type of `t`:
//   dispatch_dtype(t, [&](auto tag) { using T = typename decltype(tag)::type; ... });
template <class Fn>
decltype(auto) dispatch_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: return fn(type_tag<float>{});
    case DType::f64: return fn(type_tag<double>{});
    case DType::f16: return fn(type_tag<float16>{});
    case DType::bf16: return fn(type_tag<bfloat16>{});
    case DType::i8: return fn(type_tag<int8_t>{});
    case DType::i32: return fn(type_tag<int32_t>{});
    case DType::i64: return fn(type_tag<int64_t>{});
    case DType::b8: return fn(type_tag<bool>{});
  }
  fail<DTypeError>("dispatch_dtype: invalid dtype code ", static_cast<int>(t));
}

// Converts between element types through double (exact for every pair here
// except int64 beyond 2^53, which goes through int64 directly).
template <class To, class From>
inline To convert_element(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (std::is_same_v<To, float16> || std::is_same_v<To, bfloat16>) {
    if constexpr (std::is_same_v<From, double>) {
      return To(static_cast<float>(x));  // double rounding is harmless for these widths
    } else {
      return To(static_cast<float>(convert_element<float>(x)));
    }
  } else if constexpr (std::is_same_v<From, float16> || std::is_same_v<From, bfloat16>) {
    return convert_element<To>(static_cast<float>(x));
  } else if constexpr (std::is_same_v<To, bool>) {
    return x != From(0);
  } else if constexpr (std::is_integral_v<To> && std::is_floating_point_v<From>) {
    // Like numpy's C cast, but defined for nan/inf/out of range: saturate, nan -> 0.
    if (!(x == x)) return To(0);
    const double lo = static_cast<double>(std::numeric_limits<To>::min());
    const double hi = static_cast<double>(std::numeric_limits<To>::max());
    const double d = static_cast<double>(x);
    if (d <= lo) return std::numeric_limits<To>::min();
    if (d >= hi) return std::numeric_limits<To>::max();
    return static_cast<To>(d);
  } else {
    return static_cast<To>(x);
  }
}

}  // namespace qkv
