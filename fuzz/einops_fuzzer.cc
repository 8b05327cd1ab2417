// libFuzzer target: qkv's einops pattern parser and recipe builder through every
// entry point (rearrange, reduce with each reduction, repeat, their list forms,
// reduction_plan, pack, unpack, parse_shape, einsum / compact_einsum_pattern), with
// input shapes and axis lengths guessed from the pattern so that most inputs fit,
// and with huge lengths (repeat c=2^60 style, near 2^62 / 2^63), zeros and negative
// ones. When the input is small the operation runs on a small tensor of any dtype
// and layout, and its result is read element by element (ASan checks the view's
// geometry against its storage) and compared with a contiguous copy of itself.
//
// A qkv::Error is a normal outcome; anything else (a crash, a sanitizer report,
// another exception, a result whose copy differs) is a finding.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "qkv/einops.h"

namespace {

using qkv::Shape;
using qkv::Tensor;
using qkv::einops::AxisLengths;

constexpr const char* kReductions[] = {"sum", "mean", "max", "min", "prod", "any", "all", "median"};

// One top-level entry of a pattern side: a name or number, a "(...)" group, or "...".
struct Entry {
  std::vector<std::string> names;
  bool group = false, ellipsis = false;
};

bool is_name_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         static_cast<unsigned char>(c) >= 0x80;
}

// The fuzzer's own loose reading of one side ("b (h w) ... c").
std::vector<Entry> split_side(const std::string& side) {
  std::vector<Entry> out;
  bool in_group = false;
  for (size_t i = 0; i < side.size();) {
    const char c = side[i];
    if (side.compare(i, 3, "...") == 0) {
      if (in_group) {
        out.back().names.push_back("...");
      } else {
        out.push_back(Entry{{}, false, true});
      }
      i += 3;
    } else if (c == '(') {
      out.push_back(Entry{{}, true, false});
      in_group = true, ++i;
    } else if (c == ')') {
      in_group = false, ++i;
    } else if (is_name_char(c)) {
      size_t j = i;
      while (j < side.size() && is_name_char(side[j])) ++j;
      if (in_group) {
        out.back().names.push_back(side.substr(i, j - i));
      } else {
        out.push_back(Entry{{side.substr(i, j - i)}, false, false});
      }
      i = j;
    } else {
      ++i;
    }
  }
  return out;
}

bool is_number(const std::string& s) {
  return !s.empty() && s.size() < 12 && s.find_first_not_of("0123456789") == std::string::npos;
}

// Sizes per axis name, drawn once; a number stands for itself.
struct Sizes {
  FuzzedDataProvider& fdp;
  std::map<std::string, int64_t> by_name;
  int64_t of(const std::string& name) {
    if (is_number(name)) return std::stoll(name);
    auto it = by_name.find(name);
    if (it != by_name.end()) return it->second;
    const int64_t v = qkv_fuzz::draw_dim(fdp, static_cast<int>(name.size() + static_cast<unsigned char>(name[0])));
    by_name[name] = v;
    return v;
  }
};

int64_t wrapping_product(Sizes& sizes, const std::vector<std::string>& names) {
  uint64_t p = 1;
  for (const std::string& n : names) p *= static_cast<uint64_t>(n == "..." ? 1 : sizes.of(n));
  return static_cast<int64_t>(p);  // wraps on purpose: overflowing dims are fuzz input too
}

// A shape that fits `side` (dims of groups are the products of their axes' sizes),
// with "..." covering 0-3 dims; and the lengths of grouped axes (all but one per
// group, so that the last is inferred) in `lengths`.
Shape shape_for(Sizes& sizes, const std::vector<Entry>& side, AxisLengths* lengths) {
  Shape shape;
  for (const Entry& e : side) {
    if (e.ellipsis) {
      const int n = sizes.fdp.ConsumeIntegral<uint8_t>() % 4;
      for (int j = 0; j < n; ++j) shape.push_back(qkv_fuzz::draw_dim(sizes.fdp, j));
      continue;
    }
    shape.push_back(e.group || e.names.empty() ? wrapping_product(sizes, e.names) : sizes.of(e.names[0]));
    if (e.group && lengths != nullptr) {
      for (size_t k = 0; k + 1 < e.names.size(); ++k) {
        if (!is_number(e.names[k]) && e.names[k] != "...") lengths->emplace_back(e.names[k], sizes.of(e.names[k]));
      }
    }
  }
  const uint8_t tweak = sizes.fdp.ConsumeIntegral<uint8_t>();
  if (tweak == 255 && !shape.empty()) shape.pop_back();
  if (tweak == 254) shape.push_back(3);
  return shape;
}

// Lengths for the right side's names that the left side lacks (repeat's new axes,
// e.g. c=2^60), plus now and then a stray, duplicated or negative one.
void add_new_axes(Sizes& sizes, const std::vector<Entry>& left, const std::vector<Entry>& right, AxisLengths* lengths) {
  std::vector<std::string> on_left;
  for (const Entry& e : left) on_left.insert(on_left.end(), e.names.begin(), e.names.end());
  for (const Entry& e : right) {
    for (const std::string& n : e.names) {
      const bool known = std::find(on_left.begin(), on_left.end(), n) != on_left.end();
      if (!known && !is_number(n) && n != "...") lengths->emplace_back(n, sizes.of(n));
    }
  }
  const uint8_t extra = sizes.fdp.ConsumeIntegral<uint8_t>();
  if (extra == 255) lengths->emplace_back("stray", 2);
  if (extra == 254 && !lengths->empty()) lengths->push_back(lengths->front());
  if (extra == 253) lengths->emplace_back(lengths->empty() ? "x" : lengths->front().first, -3);
}

// Reads every element of a result (in bounds, or ASan says so) and checks that its
// contiguous copy holds the same values; huge views (zero strides) are not read.
void check_result(const Tensor& t) {
  const auto n = qkv_fuzz::checked_numel(t.shape());
  if (!n || *n != t.numel()) {
    std::fprintf(stderr, "result of shape %s has numel %lld\n", qkv::shape_str(t.shape()).c_str(),
                 static_cast<long long>(t.numel()));
    std::abort();
  }
  if (*n > (int64_t{1} << 16)) return;
  if (!qkv_fuzz::same_values(t.to_vector<double>(), qkv::einops::materialize(t).to_vector<double>())) {
    std::fprintf(stderr, "materialize changed the values of a %s view\n", qkv::shape_str(t.shape()).c_str());
    std::abort();
  }
}

// A small input (numel <= 4096) is made into a tensor; larger ones are only planned.
bool small(const Shape& s) {
  const auto n = qkv_fuzz::checked_numel(s);
  return n && *n <= 4096;
}

void run_transform(FuzzedDataProvider& fdp, const std::string& pattern, uint8_t op) {
  const size_t arrow = pattern.find("->");
  const std::vector<Entry> left = split_side(pattern.substr(0, arrow));
  const std::vector<Entry> right = split_side(arrow == std::string::npos ? "" : pattern.substr(arrow + 2));
  Sizes sizes{fdp, {}};
  AxisLengths lengths;
  const Shape shape = shape_for(sizes, left, &lengths);
  add_new_axes(sizes, left, right, &lengths);
  const int kind = op % 4;  // rearrange, reduce, repeat, reduction_plan
  const bool list = op & 4;
  const std::string reduction = kReductions[fdp.ConsumeIntegral<uint8_t>() % 8];
  if (kind == 3) {
    const auto plan = qkv::einops::reduction_plan(shape, pattern, "callable", lengths, list);
    if (plan.permutation.size() != plan.init_shape.size()) std::abort();
    return;
  }
  // Huge outputs run too: qkv checks their size before any work (QKV_MAX_ALLOC_BYTES,
  // 64 MiB here) and throws OutOfMemoryError; repeat/rearrange views stay views.
  if (!small(shape)) return;
  const qkv::DType dtype = qkv_fuzz::draw_dtype(fdp);
  Tensor result;
  if (list && !shape.empty() && shape[0] >= 1 && shape[0] <= 4) {
    std::vector<Tensor> xs;
    for (int64_t i = 0; i < shape[0]; ++i)
      xs.push_back(qkv_fuzz::make_tensor(fdp, Shape(shape.begin() + 1, shape.end()), dtype));
    result = kind == 0   ? qkv::einops::rearrange(xs, pattern, lengths)
             : kind == 1 ? qkv::einops::reduce(xs, pattern, reduction, lengths)
                         : qkv::einops::repeat(xs, pattern, lengths);
  } else {
    const Tensor x = qkv_fuzz::make_tensor(fdp, shape, dtype);
    result = kind == 0   ? qkv::einops::rearrange(x, pattern, lengths)
             : kind == 1 ? qkv::einops::reduce(x, pattern, reduction, lengths)
                         : qkv::einops::repeat(x, pattern, lengths);
  }
  check_result(result);
}

// pack and unpack with "i j * k" patterns: the names share sizes, "*" stands for
// 0-2 dims that differ per tensor; unpack splits along random packed shapes.
void run_pack(FuzzedDataProvider& fdp, const std::string& pattern, bool unpack) {
  const std::vector<Entry> side = split_side(pattern);
  Sizes sizes{fdp, {}};
  auto shape_with_star = [&](int star_dims) {
    Shape s;
    for (size_t i = 0; i < pattern.size(); ++i) {
      if (pattern[i] == '*')
        for (int j = 0; j < star_dims; ++j) s.push_back(qkv_fuzz::draw_dim(fdp, j));
    }
    Shape named = shape_for(sizes, side, nullptr);
    // "*" goes where it is in the pattern: count names before it.
    const size_t star = pattern.find('*');
    const size_t before = star == std::string::npos ? named.size() : split_side(pattern.substr(0, star)).size();
    named.insert(named.begin() + static_cast<std::ptrdiff_t>(std::min(before, named.size())), s.begin(), s.end());
    return named;
  };
  if (!unpack) {
    std::vector<Tensor> xs;
    const int n = 1 + fdp.ConsumeIntegral<uint8_t>() % 3;
    for (int i = 0; i < n; ++i) {
      const Shape s = shape_with_star(fdp.ConsumeIntegral<uint8_t>() % 3);
      if (!small(s)) return;
      xs.push_back(qkv_fuzz::make_tensor(fdp, s, qkv_fuzz::draw_dtype(fdp)));
    }
    const auto packed = qkv::einops::pack(xs, pattern);
    check_result(packed.tensor);
    for (const Tensor& part : qkv::einops::unpack(packed.tensor, packed.packed_shapes, pattern)) check_result(part);
    return;
  }
  const Shape s = shape_with_star(1);
  std::vector<Shape> packed_shapes(fdp.ConsumeIntegral<uint8_t>() % 4);
  for (Shape& p : packed_shapes) {
    p.resize(fdp.ConsumeIntegral<uint8_t>() % 3);
    for (int64_t& d : p) d = fdp.ConsumeIntegral<uint8_t>() >= 224 ? -1 : qkv_fuzz::draw_dim(fdp, 0);
  }
  if (!small(s)) return;
  const Tensor x = qkv_fuzz::make_tensor(fdp, s, qkv_fuzz::draw_dtype(fdp));
  for (const Tensor& part : qkv::einops::unpack(x, packed_shapes, pattern)) check_result(part);
}

// einops.einsum with named axes: one tensor per comma-separated term, names share sizes.
void run_einsum(FuzzedDataProvider& fdp, const std::string& pattern) {
  (void)qkv::einops::compact_einsum_pattern(pattern);
  const size_t arrow = pattern.find("->");
  const std::string lhs = pattern.substr(0, arrow);
  Sizes sizes{fdp, {}};
  std::vector<Tensor> xs;
  size_t start = 0;
  for (size_t comma = 0; comma != std::string::npos && xs.size() < 8; start = comma + 1) {
    comma = lhs.find(',', start);
    const Shape s = shape_for(sizes, split_side(lhs.substr(start, comma - start)), nullptr);
    if (!small(s)) return;
    xs.push_back(qkv_fuzz::make_tensor(fdp, s, qkv_fuzz::draw_dtype(fdp)));
  }
  int64_t work = 1;  // the einsum's naive loop: product of every axis size
  for (const auto& [name, v] : sizes.by_name)
    if (__builtin_mul_overflow(work, std::max<int64_t>(v, 1), &work) || work > 2000000) return;
  check_result(qkv::einops::einsum(xs, pattern));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  qkv_fuzz::init_process();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider fdp(data, size);
  const std::string pattern = fdp.ConsumeRandomLengthString(200);
  const uint8_t op = fdp.ConsumeIntegral<uint8_t>();
  try {
    if (op < 128) {
      run_transform(fdp, pattern, op);
    } else if (op < 160) {
      run_pack(fdp, pattern, op & 1);
    } else if (op < 192) {
      Sizes sizes{fdp, {}};
      const Shape shape = shape_for(sizes, split_side(pattern), nullptr);
      for (const auto& [name, length] : qkv::einops::parse_shape(shape, pattern)) {
        if (name.empty()) std::abort();
      }
    } else {
      run_einsum(fdp, pattern);
    }
  } catch (const qkv::Error&) {
  }
  return 0;
}
