// The one strided multi-index walk of qkv: an odometer over the dims of a loop nest
// that keeps, for each of N operands, the element offset of the current index.
// Every loop over strided data uses it: the copy engine (rows, tiles, reference),
// GEMM batches (for_each_gemm_batch) and attention's batch offsets.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace qkv::kernels {

// One dim of a walk: its size and an element stride per operand (may be 0 or negative).
template <size_t N>
struct WalkDim {
  int64_t size = 1;
  std::array<int64_t, N> stride{};
  bool operator==(const WalkDim&) const = default;
};

template <size_t N>
using WalkDims = std::vector<WalkDim<N>>;

template <size_t N>
using WalkOffsets = std::array<int64_t, N>;

// Number of indices the dims span (the product of the sizes; 1 for no dims).
template <size_t N>
int64_t walk_count(std::span<const WalkDim<N>> dims) {
  int64_t n = 1;
  for (const WalkDim<N>& d : dims) n *= d.size;
  return n;
}

// Operand offsets of row-major linear index `linear` (last dim fastest), without walking.
template <size_t N>
WalkOffsets<N> walk_offsets_at(std::span<const WalkDim<N>> dims, int64_t linear) {
  WalkOffsets<N> off{};
  for (size_t d = dims.size(); d-- > 0;) {
    const int64_t i = linear % dims[d].size;
    linear /= dims[d].size;
    for (size_t k = 0; k < N; ++k) off[k] += i * dims[d].stride[k];
  }
  return off;
}

// The odometer: seek() to a linear index, then next() steps in row-major order,
// updating the offsets incrementally (one add per operand for most steps). Dims
// must have sizes >= 1.
template <size_t N>
class StridedWalk {
 public:
  StridedWalk() = default;
  explicit StridedWalk(WalkDims<N> dims) : dims_(std::move(dims)), index_(dims_.size(), 0) {}

  void seek(int64_t linear) {
    offset_ = {};
    for (size_t d = dims_.size(); d-- > 0;) {
      index_[d] = linear % dims_[d].size;
      linear /= dims_[d].size;
      for (size_t k = 0; k < N; ++k) offset_[k] += index_[d] * dims_[d].stride[k];
    }
  }

  // The next index in row-major order; after the last one, back to all zeros.
  void next() {
    for (size_t d = dims_.size(); d-- > 0;) {
      for (size_t k = 0; k < N; ++k) offset_[k] += dims_[d].stride[k];
      if (++index_[d] < dims_[d].size) return;
      for (size_t k = 0; k < N; ++k) offset_[k] -= index_[d] * dims_[d].stride[k];
      index_[d] = 0;
    }
  }

  int64_t offset(size_t k) const { return offset_[k]; }
  const WalkOffsets<N>& offsets() const { return offset_; }
  int64_t index(size_t d) const { return index_[d]; }
  const WalkDims<N>& dims() const { return dims_; }

 private:
  WalkDims<N> dims_;
  std::vector<int64_t> index_;
  WalkOffsets<N> offset_{};
};

// fn(offsets) for the row-major linear indices [first, last) of `dims`.
template <size_t N, class Fn>
void for_each_walk_offset(const WalkDims<N>& dims, int64_t first, int64_t last, Fn&& fn) {
  if (first >= last) return;
  StridedWalk<N> walk(dims);
  walk.seek(first);
  for (int64_t i = first; i < last; ++i, walk.next()) fn(walk.offsets());
}

// The same loop nest with fewer dims: size-1 dims dropped, and each dim merged into
// the one before it when that one steps, in every operand, by exactly the dim's
// whole extent (so the pair walks memory like one dim). Offsets and order of the
// visited elements are unchanged. No dims left: one dim of size 1.
template <size_t N>
WalkDims<N> coalesce_walk(std::span<const WalkDim<N>> dims) {
  WalkDims<N> out;
  for (const WalkDim<N>& d : dims) {
    if (d.size == 1) continue;
    bool merges = !out.empty();
    for (size_t k = 0; k < N && merges; ++k) merges = out.back().stride[k] == d.stride[k] * d.size;
    if (merges) {
      out.back().size *= d.size;
      out.back().stride = d.stride;
    } else {
      out.push_back(d);
    }
  }
  if (out.empty()) out.push_back(WalkDim<N>{});
  return out;
}

}  // namespace qkv::kernels
