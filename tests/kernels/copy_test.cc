// The copy engine (kernels/cpu/copy.h) against its element-at-a-time reference
// (same bytes, also outside the written elements), and the reference against
// element access through Tensor::at (an independent offset computation): random
// shapes, permutations, slices, broadcasts (zero strides), size-1 dims, negative
// strides, empty tensors, strided and permuted destinations, every dtype and every
// dtype conversion, every SIMD target; large (streamed) copies on several threads.
#include "kernels/cpu/copy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "common/expect.h"
#include "common/simd_targets.h"
#include "qkv/einops.h"
#include "qkv/parallel.h"
#include "softmax/softmax_cpu.h"

namespace qkv::kernels {
namespace {

constexpr std::array kDTypes = {DType::f32, DType::f64, DType::f16, DType::bf16,
                                DType::i8,  DType::i32, DType::i64, DType::b8};

void engine_copy(const Tensor& src, const Tensor& dst) {
  strided_copy(src.shape(), {src.raw_data(), src.dtype(), src.strides()}, {dst.raw_data(), dst.dtype(), dst.strides()});
}

void reference_copy(const Tensor& src, const Tensor& dst) {
  strided_copy_reference(src.shape(), {src.raw_data(), src.dtype(), src.strides()},
                         {dst.raw_data(), dst.dtype(), dst.strides()});
}

// Values of `dtype` that survive the round trip through f64 (-100..100, 0/1 for bool).
Tensor random_values(const Shape& shape, uint64_t seed, DType dtype) {
  return Tensor::uniform(shape, seed, -100, 100, DType::f64).to(dtype == DType::b8 ? DType::i8 : dtype).to(dtype);
}

// t viewed backwards along `dim` (a negative stride), over the same storage.
Tensor reversed(const Tensor& t, int64_t dim) {
  if (t.numel() == 0 || t.size(dim) < 2) return t;
  Strides strides = t.strides();
  const auto d = static_cast<size_t>(dim);
  const int64_t offset = t.offset() + (t.size(dim) - 1) * strides[d];
  strides[d] = -strides[d];
  return Tensor::view_of(t.storage(), t.dtype(), t.shape(), strides, offset);
}

// A random view: random shape (sizes chosen to straddle the SIMD block and tile
// sizes), random permutation, sometimes a slice (non-unit stride, also along src's
// contiguous dim), a broadcast dim, or a reversed dim (negative stride).
Tensor random_view(std::mt19937& rng, DType dtype) {
  std::uniform_int_distribution<int> nd_dist(1, 5);
  const int nd = nd_dist(rng);
  const int64_t sizes[] = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 33, 64, 70};
  Shape shape;
  int64_t numel = 1;
  for (int i = 0; i < nd; ++i) {
    int64_t s = sizes[std::uniform_int_distribution<int>(0, 13)(rng)];
    if (numel * s > 60000) s = 2;
    shape.push_back(s);
    numel *= s;
  }
  Tensor base = random_values(shape, static_cast<uint64_t>(rng()), dtype);
  std::vector<int64_t> perm(nd);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  Tensor v = base.permute(perm);
  const int kind = std::uniform_int_distribution<int>(0, 5)(rng);
  if (kind == 1 && v.size(-1) > 2) v = v.slice(-1, 0, v.size(-1), 2);
  if (kind == 3) {
    const auto contiguous_dim = static_cast<int64_t>(std::find(perm.begin(), perm.end(), nd - 1) - perm.begin());
    if (v.size(contiguous_dim) > 3) v = v.slice(contiguous_dim, 1, v.size(contiguous_dim), 3);
  }
  if (kind == 2) {
    Tensor u = v.unsqueeze(std::uniform_int_distribution<int>(0, nd)(rng));
    Shape target = u.shape();
    for (size_t d = 0; d < target.size(); ++d) target[d] = target[d] == 1 ? 5 : target[d];
    v = u.expand(target);
  }
  if (kind == 4) v = reversed(v, std::uniform_int_distribution<int>(0, nd - 1)(rng));
  return v;
}
// A destination of `shape` in fresh storage whose every byte is 0xA5: `kind` 0
// contiguous, 1 permuted by `perm`, 2 every other element along dim 0, 3 reversed
// along the last dim, 4 one element past an aligned start (unaligned rows).
Tensor make_destination(int kind, const std::vector<int64_t>& perm, const Shape& shape, DType dtype) {
  Shape stored = shape;  // in storage order
  if (kind == 1) {
    for (size_t k = 0; k < perm.size(); ++k) stored[k] = shape[static_cast<size_t>(perm[k])];
  }
  if (kind == 2 && !stored.empty()) stored[0] *= 2;
  const int64_t n = shape_numel(stored), skip = kind == 4 ? 1 : 0;
  Tensor buffer = Tensor::empty({n + skip}, dtype);
  std::memset(buffer.raw_data(), 0xA5, buffer.nbytes());
  Tensor v = buffer.slice(0, skip, n + skip).view(stored);
  if (kind == 1) {
    std::vector<int64_t> inverse(perm.size());
    for (size_t k = 0; k < perm.size(); ++k) inverse[static_cast<size_t>(perm[k])] = static_cast<int64_t>(k);
    v = v.permute(inverse);
  }
  if (kind == 2 && !stored.empty()) v = v.slice(0, 0, stored[0], 2);
  if (kind == 3 && !shape.empty()) v = reversed(v, -1 + static_cast<int64_t>(shape.size()));
  return v;
}

// The first byte at which the storages of a and b (written elements and the gaps
// between them) differ, or -1.
int64_t first_difference(const Tensor& a, const Tensor& b) {
  const auto* p = reinterpret_cast<const unsigned char*>(a.storage()->data());
  const auto* q = reinterpret_cast<const unsigned char*>(b.storage()->data());
  const size_t n = std::min(a.storage()->nbytes(), b.storage()->nbytes());
  for (size_t i = 0; i < n; ++i) {
    if (p[i] != q[i]) return static_cast<int64_t>(i);
  }
  return a.storage()->nbytes() == b.storage()->nbytes() ? -1 : static_cast<int64_t>(n);
}

// One random case: engine and reference into identical destinations, whose storages
// must agree byte for byte.
void check_random_case(std::mt19937& rng, bool convert) {
  const DType from = kDTypes[std::uniform_int_distribution<size_t>(0, kDTypes.size() - 1)(rng)];
  const DType to = convert ? kDTypes[std::uniform_int_distribution<size_t>(0, kDTypes.size() - 1)(rng)] : from;
  const Tensor src = random_view(rng, from);
  std::vector<int64_t> perm(src.shape().size());
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const int kind = std::uniform_int_distribution<int>(0, 4)(rng);
  const Tensor fast = make_destination(kind, perm, src.shape(), to);
  const Tensor ref = make_destination(kind, perm, src.shape(), to);
  engine_copy(src, fast);
  reference_copy(src, ref);
  ASSERT_EQ(first_difference(fast, ref), -1)
      << dtype_name(from) << " -> " << dtype_name(to) << " shape " << shape_str(src.shape()) << " src strides "
      << shape_str(src.strides()) << " dst strides " << shape_str(fast.strides()) << " dst kind " << kind;
}

TEST(CopyEngine, MatchesReferenceOnRandomViewsAndDestinations) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 800; ++trial) check_random_case(rng, trial % 4 == 3);
}

// The SIMD tiles (copy_transpose-inl.h) on every target this CPU supports (one thread:
// force_simd_target is process-wide).
TEST(CopyEngine, MatchesReferenceOnEverySimdTarget) {
  const int before = get_num_threads();
  set_num_threads(1);
  test::for_each_target([] {
    std::mt19937 rng(99);
    for (int trial = 0; trial < 200; ++trial) check_random_case(rng, false);
  });
  set_num_threads(before);
}

// The reference against an independent offset computation: Tensor::at (element_offset)
// and convert_element, index by index.
template <class To, class From>
void expect_elementwise(const Tensor& src, const Tensor& dst) {
  std::vector<int64_t> index(src.shape().size(), 0);
  for (int64_t n = 0; n < src.numel(); ++n) {
    const To want = convert_element<To>(src.at<const From>(index));
    const To got = dst.at<const To>(index);
    ASSERT_EQ(std::memcmp(&want, &got, sizeof(To)), 0) << "at linear index " << n << " of " << shape_str(src.shape());
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < src.shape()[d]) break;
      index[d] = 0;
    }
  }
}

TEST(CopyEngine, ReferenceFollowsElementAccess) {
  std::mt19937 rng(77);
  for (int trial = 0; trial < 120; ++trial) {
    const DType from = kDTypes[static_cast<size_t>(trial) % kDTypes.size()];
    const DType to = kDTypes[static_cast<size_t>(trial / 8) % kDTypes.size()];
    const Tensor src = random_view(rng, from);
    std::vector<int64_t> perm(src.shape().size());
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), rng);
    const Tensor dst_view = make_destination(trial % 5, perm, src.shape(), to);
    reference_copy(src, dst_view);
    dispatch_dtype(to, [&](auto to_tag) {
      dispatch_dtype(from, [&](auto from_tag) {
        expect_elementwise<typename decltype(to_tag)::type, typename decltype(from_tag)::type>(src, dst_view);
      });
    });
  }
}

// Empty shapes write nothing (null pointers are never read), a 0-d copy writes one
// element, and the strides of size-1 dims are never used.
TEST(CopyEngine, EmptyScalarAndSizeOneDims) {
  const std::vector<int64_t> empty_shape = {3, 0, 2}, strides = {1, 1, 1};
  strided_copy(empty_shape, {nullptr, DType::f32, strides}, {nullptr, DType::f64, strides});
  strided_copy_reference(empty_shape, {nullptr, DType::f32, strides}, {nullptr, DType::f64, strides});
  const float one = 1.5f;
  double out = 0.0;
  strided_copy({}, {&one, DType::f32, {}}, {&out, DType::f64, {}});
  EXPECT_EQ(out, 1.5);
  const std::vector<float> src = {1, 2, 3};
  std::vector<float> dst(3, 0.0f);
  const std::vector<int64_t> shape = {1, 3, 1};
  const std::vector<int64_t> src_strides = {1000000, 1, -1000000}, dst_strides = {-7, 1, 123456789};
  strided_copy(shape, {src.data(), DType::f32, src_strides}, {dst.data(), DType::f32, dst_strides});
  EXPECT_EQ(dst, src);
}

// A source that repeats one element along dst's rows (Tensor::fill, zeros: every stride 0)
// takes the fill path, memset where the value's bytes are all zero: every dtype, values whose
// bytes are not all zero although they compare equal to 0 (-0.0) or not to themselves (NaN),
// converting fills, rows longer than a piece on 3 threads, and destinations that are strided,
// permuted, reversed or unaligned (their gaps keep their bytes).
TEST(CopyEngine, FillsMatchReference) {
  const int before = get_num_threads();
  set_num_threads(3);
  for (const DType from : kDTypes) {
    for (const double value : {0.0, -0.0, 1.5, -3.0, std::numeric_limits<double>::quiet_NaN()}) {
      const Tensor scalar = Tensor::full({}, value, DType::f64).to(from);
      for (const DType to : {from, DType::f32, DType::f16}) {
        for (const Shape& shape : {Shape{7}, Shape{3, 5, 100}, Shape{(int64_t{1} << 17) + 3}}) {
          std::vector<int64_t> perm(shape.size());
          std::iota(perm.rbegin(), perm.rend(), 0);
          for (int kind = 0; kind < 5; ++kind) {
            const Tensor src = scalar.expand(shape);
            const Tensor fast = make_destination(kind, perm, shape, to);
            const Tensor ref = make_destination(kind, perm, shape, to);
            engine_copy(src, fast);
            reference_copy(src, ref);
            ASSERT_EQ(first_difference(fast, ref), -1) << dtype_name(from) << " " << value << " -> " << dtype_name(to)
                                                       << " shape " << shape_str(shape) << " dst kind " << kind;
          }
        }
      }
    }
  }
  set_num_threads(before);
}

// One contiguous row longer than a piece (clone of a contiguous tensor) is split
// over threads; converting copies too. Every value must land once, in place.
TEST(CopyEngine, LongRowsSplitOverThreads) {
  const int before = get_num_threads();
  for (const int threads : {1, 2, 3}) {
    set_num_threads(threads);
    const Tensor x = Tensor::uniform({(int64_t{3} << 20) + 5}, 4);
    EXPECT_EQ(x.clone().to_vector<float>(), x.to_vector<float>());
    const Tensor h = x.to(DType::f16);
    const Tensor ref = make_destination(0, {}, x.shape(), DType::f16);
    reference_copy(x, ref);
    EXPECT_EQ(std::memcmp(h.raw_data(), ref.raw_data(), ref.nbytes()), 0) << threads << " threads";
  }
  set_num_threads(before);
}

TEST(CopyEngine, LargeTransposeOnSeveralThreads) {
  const int before = get_num_threads();
  set_num_threads(4);
  const Tensor base = Tensor::uniform({3, 130, 4, 257}, 9);
  for (const auto& perm :
       {std::vector<int64_t>{3, 1, 2, 0}, std::vector<int64_t>{0, 3, 2, 1}, std::vector<int64_t>{2, 0, 3, 1}}) {
    const Tensor src = base.permute(perm);
    Tensor fast = Tensor::empty(src.shape()), ref = Tensor::empty(src.shape());
    engine_copy(src, fast);
    reference_copy(src, ref);
    EXPECT_EQ(fast.to_vector<float>(), ref.to_vector<float>());
  }
  // Power-of-two strides: runs 4 KB apart, where tiles are cut to 16 runs (4 and 8
  // bytes) or go through the buffer (1 and 2 bytes, where 16 runs are under a line).
  for (const DType dtype : {DType::f32, DType::f64, DType::f16, DType::i8}) {
    const Tensor pow2 = Tensor::uniform({64, 8, 16, 64}, 10, -100, 100, DType::f64).to(dtype);
    for (const auto& perm : {std::vector<int64_t>{3, 2, 1, 0}, std::vector<int64_t>{3, 0, 1, 2}}) {
      const Tensor src = pow2.permute(perm);
      Tensor fast = Tensor::empty(src.shape(), dtype), ref = Tensor::empty(src.shape(), dtype);
      engine_copy(src, fast);
      reference_copy(src, ref);
      EXPECT_EQ(std::memcmp(fast.raw_data(), ref.raw_data(), ref.nbytes()), 0) << dtype_name(dtype);
    }
  }
  set_num_threads(before);
}

// Results of 8 MB and more take the non-temporal store paths (tiles and rows): every element width,
// 1 to 3 threads, broadcast and sliced sources, and a dst that is not aligned.
TEST(CopyEngine, LargeCopiesMatchReference) {
  const int before = get_num_threads();
  int case_index = 0;
  for (const DType dtype : {DType::f32, DType::f64, DType::f16, DType::i8}) {
    const int64_t scale = 8 / static_cast<int64_t>(itemsize(dtype));  // about 12 MB at every width
    const Tensor base = Tensor::uniform({33, 40 * scale, 17, 65}, 3, -100, 100, DType::f64).to(dtype);
    const std::vector<Tensor> sources = {
        base.permute({3, 2, 1, 0}),
        base.slice(0, 1, 33).permute({0, 3, 1, 2}),
        base.slice(1, 0, 40 * scale, 2).permute({2, 1, 3, 0}).unsqueeze(1).expand({17, 2, 20 * scale, 65, 33}),
        base.slice(3, 0, 65, 2).permute({1, 3, 0, 2}).unsqueeze(0).expand({2, 40 * scale, 33, 33, 17}),
        base.permute({0, 2, 1, 3}),                  // rows of 65 (streamed row copies)
        base.slice(0, 1, 33).permute({2, 0, 1, 3}),  // the same from an offset
    };
    for (const Tensor& src : sources) {
      set_num_threads(1 + case_index++ % 3);
      Tensor ref = Tensor::empty(src.shape(), dtype);
      reference_copy(src, ref);
      Tensor aligned = Tensor::empty(src.shape(), dtype);
      engine_copy(src, aligned);
      EXPECT_EQ(std::memcmp(aligned.raw_data(), ref.raw_data(), ref.nbytes()), 0) << shape_str(src.shape());
      Tensor unaligned = Tensor::empty({src.numel() + 1}, dtype).slice(0, 1, src.numel() + 1).view(src.shape());
      engine_copy(src, unaligned);
      EXPECT_EQ(std::memcmp(unaligned.raw_data(), ref.raw_data(), ref.nbytes()), 0) << shape_str(src.shape());
    }
  }
  set_num_threads(before);
}

// Tile loops ordered by src stride: split heads' k (src stride 8 or 100 elements,
// inside a tile's extent along q) runs inside the tiles along q; p split into
// tiles with a partial last one (h = 100); small and streamed (>= 8 MB) results on
// 1 to 3 threads, every element width.
TEST(CopyEngine, OuterDimsInsideTilesMatchReference) {
  const int before = get_num_threads();
  int case_index = 0;
  for (const DType dtype : {DType::f32, DType::f64, DType::f16, DType::i8}) {
    for (const auto& [shape, d, h] : {std::tuple<Shape, int64_t, int64_t>{{2, 130, 72}, 3, 8},
                                      std::tuple<Shape, int64_t, int64_t>{{6, 2048, 1536}, 64, 8},
                                      std::tuple<Shape, int64_t, int64_t>{{1, 300, 12000}, 40, 100}}) {
      const Tensor x = Tensor::uniform(shape, 11, -100, 100, DType::f64).to(dtype);
      const Tensor src = einops::rearrange(x, "b t (d k h) -> k b h t d", {{"h", h}, {"d", d}});
      set_num_threads(1 + case_index++ % 3);
      Tensor fast = Tensor::empty(src.shape(), dtype), ref = Tensor::empty(src.shape(), dtype);
      engine_copy(src, fast);
      reference_copy(src, ref);
      EXPECT_EQ(std::memcmp(fast.raw_data(), ref.raw_data(), ref.nbytes()), 0)
          << dtype_name(dtype) << " " << shape_str(shape);
    }
  }
  set_num_threads(before);
}

TEST(CopyEngine, TensorCopyFromChecksShapesAndWritability) {
  const Tensor src = Tensor::zeros({2, 3});
  EXPECT_THROW(Tensor::zeros({3, 2}).copy_from(src), ShapeError);
  float buffer[6] = {};
  const Tensor read_only = Tensor::from_blob(buffer, {2, 3}, DType::f32, {}, nullptr, true);
  EXPECT_THROW_WITH(read_only.copy_from(src), ValueError, "copy_from");
}

TEST(CopyEngine, MaterializeUsesItForViews) {
  const Tensor x = Tensor::arange(24).reshape({2, 3, 4});
  EXPECT_TRUE(einops::materialize(x).shares_storage(x));
  const Tensor y = einops::materialize(x.permute({2, 1, 0}));
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_EQ(y.item({3, 2, 1}), x.item({1, 2, 3}));
}

}  // namespace
}  // namespace qkv::kernels
