// Blocked, multi-threaded N-d permuted copy and its scalar reference.
#include "kernels/cpu/transpose.h"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

#include <hwy/cache_control.h>

#include "kernels/cpu/transpose_simd.h"
#include "qkv/error.h"
#include "qkv/parallel.h"

namespace qkv::kernels {

namespace {

// Shape and element strides of a copy after dropping unit dims and merging dims
// that are contiguous in both src and dst. dst strides end with 1 (dst is contiguous).
struct Geometry {
  Shape shape;
  Strides src, dst;
};

Geometry coalesce(const Shape& shape, const Strides& src, const Strides& dst) {
  Geometry g;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (!g.shape.empty() && g.src.back() == src[i] * shape[i] && g.dst.back() == dst[i] * shape[i]) {
      g.shape.back() *= shape[i];
      g.src.back() = src[i];
      g.dst.back() = dst[i];
      continue;
    }
    g.shape.push_back(shape[i]);
    g.src.push_back(src[i]);
    g.dst.push_back(dst[i]);
  }
  if (g.shape.empty()) g = {{1}, {0}, {1}};
  return g;
}

void check_args(const Tensor& src, const Tensor& dst, const char* op) {
  if (src.shape() != dst.shape() || src.dtype() != dst.dtype() || !dst.is_contiguous()) {
    fail<ShapeError>(op, ": dst must be contiguous with src's shape and dtype, got src ", shape_str(src.shape()), " ",
                     dtype_name(src.dtype()), ", dst ", shape_str(dst.shape()), " ", dtype_name(dst.dtype()),
                     dst.is_contiguous() ? "" : " (not contiguous)");
  }
}

// Odometer over the dims listed in `dims` (outermost first), tracking offsets.
struct Counter {
  std::vector<int> dims;
  std::vector<int64_t> index;
  int64_t src_off = 0, dst_off = 0;

  void seek(const Geometry& g, int64_t linear) {
    index.assign(dims.size(), 0);
    src_off = dst_off = 0;
    for (size_t k = dims.size(); k-- > 0;) {
      const int d = dims[k];
      index[k] = linear % g.shape[d];
      linear /= g.shape[d];
      src_off += index[k] * g.src[d];
      dst_off += index[k] * g.dst[d];
    }
  }
  void next(const Geometry& g) {
    for (size_t k = dims.size(); k-- > 0;) {
      const int d = dims[k];
      src_off += g.src[d];
      dst_off += g.dst[d];
      if (++index[k] < g.shape[d]) return;
      src_off -= index[k] * g.src[d];
      dst_off -= index[k] * g.dst[d];
      index[k] = 0;
    }
  }
};

// Results at least this large are written with non-temporal stores: they would not
// stay in the cache anyway, and a normal store first reads the line it overwrites.
constexpr int64_t kStreamBytes = int64_t{8} << 20;

// Src runs (rows, or the runs of tiles, across tile borders) are prefetched this
// many bytes ahead of the read: short runs at large strides escape the hardware
// prefetchers (256-byte rows 4 KB apart were copied at half the speed without), and
// with power-of-two strides lines fetched much earlier would be evicted before use.
constexpr int64_t kPrefetchBytes = 2048;

template <class T>
void prefetch_run(const T* run, int64_t n, int64_t stride) {
  const auto* bytes = reinterpret_cast<const char*>(run);
  const int64_t span = ((n - 1) * stride + 1) * static_cast<int64_t>(sizeof(T));
  for (int64_t b = 0; b < span; b += 64) hwy::Prefetch(bytes + b);
}

// Rows along the last dim: memcpy when src is contiguous along it (streamed for large
// results), else a strided loop.
template <class T>
void copy_rows(const Geometry& g, const T* src, T* dst) {
  const int q = static_cast<int>(g.shape.size()) - 1;
  const int64_t len = g.shape[q], ss = g.src[q];
  const int64_t rows = shape_numel(g.shape) / len;
  Counter base;
  for (int d = 0; d < q; ++d) base.dims.push_back(d);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / (len * static_cast<int64_t>(sizeof(T))));
  const bool stream = rows * len * static_cast<int64_t>(sizeof(T)) >= kStreamBytes;
  const int64_t row_bytes = len * ss * static_cast<int64_t>(sizeof(T));
  // Short rows are prefetched like tile runs (`ahead` rows on); long ones are left
  // to the hardware.
  const int64_t ahead =
      row_bytes <= kPrefetchBytes ? std::max<int64_t>(1, kPrefetchBytes / std::max<int64_t>(64, row_bytes)) : 0;
  parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    Counter c = base, next = base;
    c.seek(g, begin);
    next.seek(g, std::min(begin + ahead, rows - 1));
    for (int64_t r = begin; r < end; ++r, c.next(g)) {
      if (ahead > 0 && r + ahead < rows) {
        prefetch_run(src + next.src_off, len, ss);
        next.next(g);
      }
      const T* s = src + c.src_off;
      T* d = dst + c.dst_off;
      if (ss == 1 && stream) {
        detail::stream_copy(d, s, len * static_cast<int64_t>(sizeof(T)));
      } else if (ss == 1) {
        std::memcpy(d, s, static_cast<size_t>(len) * sizeof(T));
      } else {
        for (int64_t j = 0; j < len; ++j) d[j] = s[j * ss];
      }
    }
    if (stream) detail::stream_fence();
  });
}

// Tiles of dims (p, q), where q is dst's contiguous last dim and p is src's
// contiguous (smallest-stride) dim, are transposed in SIMD blocks (transpose-inl.h):
// straight from src when its stride along p is 1, else (or see runs_per_tile_limit)
// through a 16 KB buffer the runs are gathered into. Runs along q are up to 1 KB long, which measured
// best for 64 MB 2-D to 5-D permutations; p takes the rest of the tile (64 KB direct,
// the buffer else). Outer dims run in order of decreasing src stride, so neighbouring
// tiles share src lines.
constexpr int64_t kTileBytes = 65536;
constexpr int64_t kTileBufferBytes = 16384;

// The direct blocks read one line from each of 16 src runs (q indices) at once, go
// through all of the tile's runs, then read the next line of each. Runs a multiple
// of 4 KB apart share one L1 set (8 ways) and evict each other before their next
// line is read, so tiles are cut to 16 runs per set (a [64]^4 reverse measured 2x
// faster with 16 runs per tile than with 64).
int64_t runs_per_tile_limit(int64_t run_stride_bytes) {
  constexpr int64_t kSetPeriodBytes = 4096;  // L1 size / ways: addresses this far apart share a set
  const int64_t offset = std::abs(run_stride_bytes) % kSetPeriodBytes;
  const int64_t runs_per_period = kSetPeriodBytes / std::gcd(offset == 0 ? kSetPeriodBytes : offset, kSetPeriodBytes);
  return 16 * runs_per_period;
}

// Sizes of dims p and q, tile sizes along them, tile counts, and element strides.
struct TilePlan {
  int64_t np, nq, tp, tq, tiles_p, tiles_q;
  int64_t ssp, ssq, dsp;
};

// Offsets of a tile's first element and its extent (in <= tp, jn <= tq).
struct Tile {
  int64_t src_off, dst_off, in, jn;
};

// The loops over tiles: the outer dims and the tile indices along p and q, as dims
// of a Geometry (a tile index steps by a whole tile), outermost first. They run in
// order of decreasing src stride, so consecutive tiles continue the src lines and
// pages of the ones before: an outer dim with a src stride under a tile's extent
// along q (split heads' k: 8 floats, inside 256-run tiles 24 floats apart) runs
// inside the tiles along q instead of re-reading all of src once per index.
struct TileLoops {
  Geometry g;
  Counter base;
  int kp = -1, kq = -1;  // positions of the tile indices in base.dims
};

TileLoops tile_loops(const Geometry& g, int p, const TilePlan& plan) {
  const int q = static_cast<int>(g.shape.size()) - 1;
  TileLoops loops;
  for (int d = 0; d < q; ++d) {
    if (d == p) continue;
    loops.g.shape.push_back(g.shape[d]);
    loops.g.src.push_back(g.src[d]);
    loops.g.dst.push_back(g.dst[d]);
  }
  const int ip = static_cast<int>(loops.g.shape.size());
  loops.g.shape.push_back(plan.tiles_p);
  loops.g.src.push_back(plan.tp * plan.ssp);
  loops.g.dst.push_back(plan.tp * plan.dsp);
  const int iq = ip + 1;
  loops.g.shape.push_back(plan.tiles_q);
  loops.g.src.push_back(plan.tq * plan.ssq);
  loops.g.dst.push_back(plan.tq);
  for (int d = 0; d <= iq; ++d) loops.base.dims.push_back(d);
  std::stable_sort(loops.base.dims.begin(), loops.base.dims.end(), [&](int a, int b) {
    return std::abs(loops.g.src[a]) > std::abs(loops.g.src[b]);
  });
  for (size_t k = 0; k < loops.base.dims.size(); ++k) {
    if (loops.base.dims[k] == ip) loops.kp = static_cast<int>(k);
    if (loops.base.dims[k] == iq) loops.kq = static_cast<int>(k);
  }
  return loops;
}

// Yields the tiles of a chunk of items in order; items never go backwards.
class TileCursor {
 public:
  TileCursor(const TileLoops& loops, const TilePlan& plan, int64_t first)
      : loops_(loops), plan_(plan), counter_(loops.base), item_(first) {
    counter_.seek(loops.g, first);
  }
  Tile at(int64_t item) {
    for (; item_ < item; ++item_) counter_.next(loops_.g);
    const int64_t i0 = counter_.index[static_cast<size_t>(loops_.kp)] * plan_.tp;
    const int64_t j0 = counter_.index[static_cast<size_t>(loops_.kq)] * plan_.tq;
    return {counter_.src_off, counter_.dst_off, std::min(plan_.np - i0, plan_.tp), std::min(plan_.nq - j0, plan_.tq)};
  }

 private:
  const TileLoops& loops_;
  const TilePlan& plan_;
  Counter counter_;
  int64_t item_;
};

template <class T>
void copy_tiles(const Geometry& g, int p, const T* src, T* dst) {
  constexpr auto kSize = static_cast<int64_t>(sizeof(T));
  const int q = static_cast<int>(g.shape.size()) - 1;
  TilePlan plan{};
  plan.np = g.shape[p];
  plan.nq = g.shape[q];
  // Direct unless the runs-per-set cut would leave dst rows shorter than a line
  // per tile (partial lines of streamed stores are slow): then the buffer.
  const int64_t run_limit = runs_per_tile_limit(g.src[q] * kSize);
  const bool direct = g.src[p] == 1 && run_limit >= std::min(plan.nq, 64 / kSize);
  plan.tq = std::min(plan.nq, 1024 / kSize);
  if (direct) plan.tq = std::min(plan.tq, run_limit);
  const int64_t tile_bytes = direct ? kTileBytes : kTileBufferBytes;  // when q is short, p takes the rest
  plan.tp = std::min(plan.np, std::max<int64_t>(16, tile_bytes / (plan.tq * kSize)));
  plan.tiles_p = (plan.np + plan.tp - 1) / plan.tp;
  plan.tiles_q = (plan.nq + plan.tq - 1) / plan.tq;
  plan.ssp = g.src[p];
  plan.ssq = g.src[q];
  plan.dsp = g.dst[p];
  const TileLoops loops = tile_loops(g, p, plan);
  const int64_t items = shape_numel(loops.g.shape);
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (plan.tp * plan.tq));
  const bool stream = shape_numel(g.shape) * kSize >= kStreamBytes;
  const int64_t run_bytes = std::max<int64_t>(64, plan.tp * plan.ssp * kSize);
  const int64_t ahead = std::max<int64_t>(1, kPrefetchBytes / run_bytes);  // in runs
  parallel_for(0, items, grain, [&](int64_t begin, int64_t end) {
    alignas(64) unsigned char storage[kTileBufferBytes];
    T* buf = reinterpret_cast<T*>(storage);  // [tq][tp], when not direct
    TileCursor cursor(loops, plan, begin);
    Tile next = cursor.at(begin);
    for (int64_t item = begin; item < end; ++item) {
      const Tile tile = next;
      const bool has_next = item + 1 < items;
      if (has_next) next = cursor.at(item + 1);
      const T* s = src + tile.src_off;
      // Prefetch the tile's runs from `ahead` on and the next tile's first `ahead`
      // (direct: all at once before the block loads; buffered: one per run read).
      const auto prefetch_ahead = [&](int64_t j) {
        const int64_t jp = j + ahead;
        if (jp < tile.jn) {
          prefetch_run(s + jp * plan.ssq, tile.in, plan.ssp);
        } else if (has_next && jp - tile.jn < next.jn) {
          prefetch_run(src + next.src_off + (jp - tile.jn) * plan.ssq, next.in, plan.ssp);
        }
      };
      if (direct) {
        for (int64_t j = 0; j < tile.jn; ++j) prefetch_ahead(j);
        detail::transpose_tile(sizeof(T), s, plan.ssq, dst + tile.dst_off, plan.dsp, tile.in, tile.jn, stream);
        continue;
      }
      for (int64_t j = 0; j < tile.jn; ++j) {  // gather the runs along p into buf
        prefetch_ahead(j);
        const T* row = s + j * plan.ssq;
        T* b = buf + j * plan.tp;
        if (plan.ssp == 1) {
          std::memcpy(b, row, static_cast<size_t>(tile.in) * sizeof(T));
        } else {
          for (int64_t i = 0; i < tile.in; ++i) b[i] = row[i * plan.ssp];
        }
      }
      detail::transpose_tile(sizeof(T), buf, plan.tp, dst + tile.dst_off, plan.dsp, tile.in, tile.jn, stream);
    }
    if (stream) detail::stream_fence();
  });
}

template <class T>
void copy_typed(const Geometry& g, const void* src, void* dst) {
  const T* s = static_cast<const T*>(src);
  T* d = static_cast<T*>(dst);
  const int q = static_cast<int>(g.shape.size()) - 1;
  int p = -1;
  for (int k = 0; k < q; ++k) {
    if (g.src[k] != 0 && g.src[k] < g.src[q] && (p < 0 || g.src[k] < g.src[p])) p = k;
  }
  // Tiling pays when src's contiguous dim is not q and is short-strided.
  if (g.src[q] != 1 && p >= 0 && g.src[p] * static_cast<int64_t>(sizeof(T)) <= 64) {
    copy_tiles(g, p, s, d);
  } else {
    copy_rows(g, s, d);
  }
}

template <class Fn>
void dispatch_width(size_t width, Fn&& fn) {
  switch (width) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint64_t{});
    default: fail<DTypeError>("permuted_copy: unsupported element size ", width);
  }
}

}  // namespace

void permuted_copy(const Tensor& src, const Tensor& dst) {
  check_args(src, dst, "permuted_copy");
  if (src.numel() == 0) return;
  const Geometry g = coalesce(src.shape(), src.strides(), contiguous_strides(dst.shape()));
  dispatch_width(src.itemsize(), [&](auto tag) {
    using T = decltype(tag);
    copy_typed<T>(g, src.raw_data(), dst.raw_data());
  });
}

void permuted_copy_reference(const Tensor& src, const Tensor& dst) {
  check_args(src, dst, "permuted_copy_reference");
  const int64_t n = src.numel();
  const size_t width = src.itemsize();
  const auto* s = static_cast<const std::byte*>(src.raw_data());
  auto* d = static_cast<std::byte*>(dst.raw_data());
  std::vector<int64_t> index(src.shape().size(), 0);
  for (int64_t linear = 0; linear < n; ++linear) {
    int64_t off = 0;
    for (size_t k = 0; k < index.size(); ++k) off += index[k] * src.strides()[k];
    std::memcpy(d + static_cast<size_t>(linear) * width, s + off * static_cast<int64_t>(width), width);
    for (size_t k = index.size(); k-- > 0;) {
      if (++index[k] < src.shape()[k]) break;
      index[k] = 0;
    }
  }
}

}  // namespace qkv::kernels
