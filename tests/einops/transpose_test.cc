// The blocked permuted-copy kernel against its scalar reference and against
// element access through the source view.
#include "kernels/cpu/transpose.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <tuple>
#include <vector>

#include "common/expect.h"
#include "qkv/einops.h"
#include "qkv/parallel.h"

namespace qkv::kernels {
namespace {

// A random view: random shape (sizes chosen to straddle the SIMD block and tile
// sizes), random permutation, sometimes a slice (non-unit stride, also along src's
// contiguous dim) or a broadcast dim.
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
  Tensor base = Tensor::uniform(shape, static_cast<uint64_t>(rng()), -100, 100, DType::f64).to(dtype);
  std::vector<int64_t> perm(nd);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  Tensor v = base.permute(perm);
  const int kind = std::uniform_int_distribution<int>(0, 4)(rng);
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
  return v;
}

TEST(TransposeKernel, BlockedMatchesScalarReference) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 600; ++trial) {
    const DType dtype = std::array{DType::f32, DType::f64, DType::f16, DType::i8}[trial % 4];
    const Tensor src = random_view(rng, dtype);
    Tensor fast = Tensor::empty(src.shape(), dtype), ref = Tensor::empty(src.shape(), dtype);
    permuted_copy(src, fast);
    permuted_copy_reference(src, ref);
    ASSERT_EQ(std::memcmp(fast.raw_data(), ref.raw_data(), fast.nbytes()), 0)
        << "shape " << shape_str(src.shape()) << " strides " << shape_str(src.strides());
  }
}

TEST(TransposeKernel, ReferenceFollowsElementAccess) {
  const Tensor x = Tensor::arange(2 * 3 * 4, DType::f32).reshape({2, 3, 4}).permute({2, 0, 1});
  Tensor out = Tensor::empty(x.shape(), DType::f32);
  permuted_copy_reference(x, out);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 2; ++j)
      for (int64_t k = 0; k < 3; ++k) ASSERT_EQ(out.item({i, j, k}), static_cast<double>(j * 12 + k * 4 + i));
}

TEST(TransposeKernel, LargeTransposeOnSeveralThreads) {
  const int before = get_num_threads();
  set_num_threads(4);
  const Tensor base = Tensor::uniform({3, 130, 4, 257}, 9);
  for (const auto& perm : {std::vector<int64_t>{3, 1, 2, 0}, std::vector<int64_t>{0, 3, 2, 1},
                           std::vector<int64_t>{2, 0, 3, 1}}) {
    const Tensor src = base.permute(perm);
    Tensor fast = Tensor::empty(src.shape()), ref = Tensor::empty(src.shape());
    permuted_copy(src, fast);
    permuted_copy_reference(src, ref);
    EXPECT_EQ(fast.to_vector<float>(), ref.to_vector<float>());
  }
  // Power-of-two strides: runs 4 KB apart, where tiles are cut to 16 runs (4 and 8
  // bytes) or go through the buffer (1 and 2 bytes, where 16 runs are under a line).
  for (const DType dtype : {DType::f32, DType::f64, DType::f16, DType::i8}) {
    const Tensor pow2 = Tensor::uniform({64, 8, 16, 64}, 10, -100, 100, DType::f64).to(dtype);
    for (const auto& perm : {std::vector<int64_t>{3, 2, 1, 0}, std::vector<int64_t>{3, 0, 1, 2}}) {
      const Tensor src = pow2.permute(perm);
      Tensor fast = Tensor::empty(src.shape(), dtype), ref = Tensor::empty(src.shape(), dtype);
      permuted_copy(src, fast);
      permuted_copy_reference(src, ref);
      EXPECT_EQ(std::memcmp(fast.raw_data(), ref.raw_data(), ref.nbytes()), 0) << dtype_name(dtype);
    }
  }
  set_num_threads(before);
}

// Results of 8 MB and more take the non-temporal store paths (tiles and rows): every element width,
// 1 to 3 threads, broadcast and sliced sources, and a dst that is not aligned.
TEST(TransposeKernel, LargeCopiesMatchReference) {
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
        base.permute({0, 2, 1, 3}),                   // rows of 65 (streamed row copies)
        base.slice(0, 1, 33).permute({2, 0, 1, 3}),  // the same from an offset
    };
    for (const Tensor& src : sources) {
      set_num_threads(1 + case_index++ % 3);
      Tensor ref = Tensor::empty(src.shape(), dtype);
      permuted_copy_reference(src, ref);
      Tensor aligned = Tensor::empty(src.shape(), dtype);
      permuted_copy(src, aligned);
      EXPECT_EQ(std::memcmp(aligned.raw_data(), ref.raw_data(), ref.nbytes()), 0) << shape_str(src.shape());
      Tensor unaligned = Tensor::empty({src.numel() + 1}, dtype).slice(0, 1, src.numel() + 1).view(src.shape());
      permuted_copy(src, unaligned);
      EXPECT_EQ(std::memcmp(unaligned.raw_data(), ref.raw_data(), ref.nbytes()), 0) << shape_str(src.shape());
    }
  }
  set_num_threads(before);
}

// Tile loops ordered by src stride: split heads' k (src stride 8 or 100 elements,
// inside a tile's extent along q) runs inside the tiles along q; p split into
// tiles with a partial last one (h = 100); small and streamed (>= 8 MB) results on
// 1 to 3 threads, every element width.
TEST(TransposeKernel, OuterDimsInsideTilesMatchReference) {
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
      permuted_copy(src, fast);
      permuted_copy_reference(src, ref);
      EXPECT_EQ(std::memcmp(fast.raw_data(), ref.raw_data(), ref.nbytes()), 0)
          << dtype_name(dtype) << " " << shape_str(shape);
    }
  }
  set_num_threads(before);
}

TEST(TransposeKernel, RejectsMismatchedDestination) {
  const Tensor src = Tensor::zeros({2, 3});
  EXPECT_THROW_WITH(permuted_copy(src, Tensor::zeros({3, 2})), ShapeError, "permuted_copy");
  EXPECT_THROW_WITH(permuted_copy(src, Tensor::zeros({3, 2}).permute({1, 0})), ShapeError, "not contiguous");
}

TEST(TransposeKernel, MaterializeUsesItForViews) {
  const Tensor x = Tensor::arange(24).reshape({2, 3, 4});
  EXPECT_TRUE(einops::materialize(x).shares_storage(x));
  const Tensor y = einops::materialize(x.permute({2, 1, 0}));
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_EQ(y.item({3, 2, 1}), x.item({1, 2, 3}));
}

}  // namespace
}  // namespace qkv::kernels
