// The strided walk (kernels/cpu/strided_walk.h) against offsets computed directly
// from the multi-index (sum of index * stride), and coalesce_walk against the walk
// of the dims it replaced: the same offsets in the same order.
#include "kernels/cpu/strided_walk.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace qkv::kernels {
namespace {

// Random dims: sizes 1..4, strides -50..50 (zero included) for 2 operands.
WalkDims<2> random_dims(std::mt19937& rng) {
  WalkDims<2> dims(std::uniform_int_distribution<size_t>(0, 5)(rng));
  for (WalkDim<2>& d : dims) {
    d.size = std::uniform_int_distribution<int64_t>(1, 4)(rng);
    for (int64_t& s : d.stride) s = std::uniform_int_distribution<int64_t>(-50, 50)(rng);
  }
  return dims;
}

// Every index's offsets in row-major order, from the multi-index directly.
std::vector<WalkOffsets<2>> direct_offsets(const WalkDims<2>& dims) {
  std::vector<WalkOffsets<2>> out;
  std::vector<int64_t> index(dims.size(), 0);
  int64_t count = 1;
  for (const WalkDim<2>& d : dims) count *= d.size;
  for (int64_t n = 0; n < count; ++n) {
    WalkOffsets<2> off{};
    for (size_t d = 0; d < dims.size(); ++d)
      for (size_t k = 0; k < 2; ++k) off[k] += index[d] * dims[d].stride[k];
    out.push_back(off);
    for (size_t d = dims.size(); d-- > 0;) {
      if (++index[d] < dims[d].size) break;
      index[d] = 0;
    }
  }
  return out;
}

std::vector<WalkOffsets<2>> walked_offsets(const WalkDims<2>& dims, int64_t first, int64_t last) {
  std::vector<WalkOffsets<2>> out;
  for_each_walk_offset<2>(dims, first, last, [&](const WalkOffsets<2>& o) { out.push_back(o); });
  return out;
}

TEST(StridedWalk, OffsetsMatchTheMultiIndexFromAnyStart) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 500; ++trial) {
    const WalkDims<2> dims = random_dims(rng);
    const std::vector<WalkOffsets<2>> want = direct_offsets(dims);
    const auto n = static_cast<int64_t>(want.size());
    ASSERT_EQ(walk_count<2>(dims), n);
    const int64_t first = std::uniform_int_distribution<int64_t>(0, n - 1)(rng);
    const int64_t last = std::uniform_int_distribution<int64_t>(first, n)(rng);
    ASSERT_EQ(walked_offsets(dims, first, last),
              std::vector<WalkOffsets<2>>(want.begin() + first, want.begin() + last));
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(walk_offsets_at<2>(dims, i), want[static_cast<size_t>(i)]);
  }
}

TEST(StridedWalk, StepsPastTheEndBackToZero) {
  StridedWalk<1> walk({{2, {3}}, {3, {1}}});
  walk.seek(5);
  EXPECT_EQ(walk.offset(0), 5);
  EXPECT_EQ(walk.index(0), 1);
  EXPECT_EQ(walk.index(1), 2);
  walk.next();
  EXPECT_EQ(walk.offset(0), 0);
  EXPECT_EQ(walk.index(0), 0);
}

TEST(StridedWalk, CoalescedDimsVisitTheSameOffsets) {
  std::mt19937 rng(6);
  int merged = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    WalkDims<2> dims = random_dims(rng);
    // Make some neighbours mergeable: dim d steps by exactly dim d+1's extent.
    for (size_t d = 0; d + 1 < dims.size(); ++d) {
      if (rng() % 2 == 0) {
        for (size_t k = 0; k < 2; ++k) dims[d].stride[k] = dims[d + 1].stride[k] * dims[d + 1].size;
      }
    }
    const WalkDims<2> coalesced = coalesce_walk<2>(dims);
    merged += coalesced.size() < dims.size();
    ASSERT_EQ(direct_offsets(coalesced), direct_offsets(dims));
    for (const WalkDim<2>& d : coalesced) ASSERT_TRUE(d.size > 1 || coalesced.size() == 1);
  }
  EXPECT_GT(merged, 500);  // the merging path was exercised
}

TEST(StridedWalk, CoalescesContiguousDimsToOne) {
  const WalkDims<2> dims = {{2, {12, 24}}, {3, {4, 8}}, {1, {99, -5}}, {4, {1, 2}}};
  EXPECT_EQ(coalesce_walk<2>(dims), (WalkDims<2>{{24, {1, 2}}}));
  EXPECT_EQ(coalesce_walk<2>(WalkDims<2>{{1, {7, 7}}}), (WalkDims<2>{{1, {0, 0}}}));
}

}  // namespace
}  // namespace qkv::kernels
