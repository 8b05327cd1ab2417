#include "qkv/dtype.h"

#include <array>
#include <string>

namespace qkv {

std::string shape_str(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string shapes_str(std::span<const std::vector<int64_t>> shapes) {
  std::string s = "[";
  for (size_t i = 0; i < shapes.size(); ++i) s += (i ? ", " : "") + shape_str(shapes[i]);
  return s + "]";
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::f64: return "float64";
    case DType::f16: return "float16";
    case DType::bf16: return "bfloat16";
    case DType::i8: return "int8";
    case DType::i32: return "int32";
    case DType::i64: return "int64";
    case DType::b8: return "bool";
  }
  return "invalid";
}

DType dtype_from_name(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType dtype;
  };
  static constexpr std::array<Alias, 16> kAliases{{
      {"float32", DType::f32},
      {"f32", DType::f32},
      {"float64", DType::f64},
      {"f64", DType::f64},
      {"float16", DType::f16},
      {"f16", DType::f16},
      {"bfloat16", DType::bf16},
      {"bf16", DType::bf16},
      {"int8", DType::i8},
      {"i8", DType::i8},
      {"int32", DType::i32},
      {"i32", DType::i32},
      {"int64", DType::i64},
      {"i64", DType::i64},
      {"bool", DType::b8},
      {"b8", DType::b8},
  }};
  for (const auto& a : kAliases) {
    if (a.name == name) return a.dtype;
  }
  fail<DTypeError>("dtype_from_name: unknown dtype '", name,
                   "' (known: float32 float64 float16 bfloat16 int8 int32 int64 bool)");
}

DType promote_types(DType a, DType b) {
  if (a == b) return a;
  if (a == DType::b8) return b;
  if (b == DType::b8) return a;
  const bool fa = is_floating(a), fb = is_floating(b);
  if (fa && fb) {
    if (a == DType::f64 || b == DType::f64) return DType::f64;
    return DType::f32;  // f32 with a half type, or f16 with bf16
  }
  if (fa != fb) {
    // numpy: an int with a float gives a float wide enough for both kinds of value.
    const DType f = fa ? a : b;
    const DType i = fa ? b : a;
    if (f == DType::f64 || i == DType::i64 || i == DType::i32) return DType::f64;
    return f;  // int8 fits every float type
  }
  return itemsize(a) >= itemsize(b) ? a : b;  // two integer types
}

}  // namespace qkv
