// The copy engine's CPU kernels (copy_cpu.h): rows (memcpy, streamed, strided or
// converting) and, for same-dtype transposing copies, blocked multi-threaded SIMD tiles.
#include "kernels/cpu/copy_cpu.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <type_traits>
#include <utility>
#include <vector>

#include <hwy/cache_control.h>

#include "kernels/cpu/copy_transpose.h"
#include "qkv/error.h"
#include "qkv/parallel.h"

namespace qkv::kernels::detail {

namespace {

constexpr size_t kSrc = 0, kDst = 1;  // operands of a CopyDims

// Results at least this large are written with non-temporal stores: they would not
// stay in the cache anyway, and a normal store first reads the line it overwrites.
constexpr int64_t kStreamBytes = int64_t{8} << 20;

// Src runs (rows, or the runs of tiles, across tile borders) are prefetched this
// many bytes ahead of the read: short runs at large strides escape the hardware
// prefetchers (256-byte rows 4 KB apart were copied at half the speed without), and
// with power-of-two strides lines fetched much earlier would be evicted before use.
constexpr int64_t kPrefetchBytes = 2048;

// Rows longer than this are copied in pieces of this size, so that a long
// contiguous copy (clone of a contiguous tensor: one row) is split over threads.
constexpr int64_t kPieceBytes = int64_t{1} << 18;

template <class T>
void prefetch_run(const T* run, int64_t n, int64_t stride) {
  const auto* bytes = reinterpret_cast<const char*>(run);
  const int64_t span = ((n - 1) * stride + 1) * static_cast<int64_t>(sizeof(T));
  for (int64_t b = 0; b < span; b += 64) hwy::Prefetch(bytes + b);
}

// One piece of a row: memcpy when both sides are contiguous along it (streamed for
// large results), a fill (memset for zero bytes) when src repeats one element along
// it, else an element loop (converting when To != From).
template <class To, class From>
void copy_piece(const From* s, int64_t ss, To* d, int64_t ds, int64_t len, bool stream) {
  if constexpr (std::is_same_v<To, From>) {
    if (ss == 1 && ds == 1) {
      const auto bytes = len * static_cast<int64_t>(sizeof(To));
      if (stream) {
        detail::stream_copy(d, s, bytes);
      } else if (static_cast<const void*>(d) != static_cast<const void*>(s)) {
        std::memcpy(d, s, static_cast<size_t>(bytes));
      }
      return;
    }
  }
  if (ss == 0 && ds == 1) {  // a fill (Tensor::fill, zeros): the strided loop below ran one element a time
    const To value = convert_element<To>(*s);
    unsigned char bytes[sizeof(To)];
    std::memcpy(bytes, &value, sizeof(To));
    if (std::all_of(bytes, bytes + sizeof(To), [](unsigned char b) { return b == 0; })) {
      // void*: float16 and bfloat16 are classes (trivially copyable), which -Wclass-memaccess flags
      std::memset(static_cast<void*>(d), 0, static_cast<size_t>(len) * sizeof(To));
    } else {
      std::fill_n(d, len, value);
    }
    return;
  }
  for (int64_t j = 0; j < len; ++j) d[j * ds] = convert_element<To>(s[j * ss]);
}

// Rows along the last dim, each split in pieces of at most kPieceBytes; rows of
// short src runs are prefetched `ahead` rows on (long ones are left to the hardware).
template <class To, class From>
void copy_rows(const CopyDims& dims, const From* src, To* dst) {
  const WalkDim<2>& last = dims.back();
  const int64_t len = last.size, ss = last.stride[kSrc], ds = last.stride[kDst];
  const int64_t rows = walk_count<2>(dims) / len;
  constexpr auto kSize = static_cast<int64_t>(std::max(sizeof(To), sizeof(From)));
  const int64_t piece = std::max<int64_t>(1, std::min(len, kPieceBytes / kSize));
  const int64_t pieces = (len + piece - 1) / piece;  // per row
  const StridedWalk<2> base(CopyDims(dims.begin(), dims.end() - 1));
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 15) / (piece * kSize));
  const bool stream = rows * len * static_cast<int64_t>(sizeof(To)) >= kStreamBytes;
  const int64_t row_bytes = len * std::abs(ss) * static_cast<int64_t>(sizeof(From));
  const int64_t ahead =
      row_bytes <= kPrefetchBytes ? std::max<int64_t>(1, kPrefetchBytes / std::max<int64_t>(64, row_bytes)) : 0;
  parallel_for(0, rows * pieces, grain, [&](int64_t begin, int64_t end) {
    StridedWalk<2> row = base, next = base;
    row.seek(begin / pieces);
    next.seek(std::min(begin / pieces + ahead, rows - 1));
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / pieces, j0 = item % pieces * piece;
      if (pieces == 1 && ahead > 0 && r + ahead < rows) {
        prefetch_run(src + next.offset(kSrc), len, ss);
        next.next();
      }
      copy_piece(src + row.offset(kSrc) + j0 * ss, ss, dst + row.offset(kDst) + j0 * ds, ds, std::min(piece, len - j0),
                 stream);
      if (j0 + piece >= len) row.next();
    }
    if (stream) detail::stream_fence();
  });
}

// Tiles of dims (p, q), where q is dst's contiguous last dim and p is src's
// contiguous (smallest-stride) dim, are transposed in SIMD blocks (copy_transpose-inl.h):
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

// The loops over tiles: the outer dims and the tile indices along p and q (a tile
// index steps by a whole tile), as one walk. They run in order of decreasing src
// stride, so consecutive tiles continue the src lines and pages of the ones before:
// an outer dim with a src stride under a tile's extent along q (split heads' k: 8
// floats, inside 256-run tiles 24 floats apart) runs inside the tiles along q
// instead of re-reading all of src once per index.
struct TileLoops {
  StridedWalk<2> walk;
  size_t kp = 0, kq = 0;  // positions of the tile indices in the walk's dims
};

TileLoops tile_loops(const CopyDims& dims, size_t p, const TilePlan& plan) {
  const size_t q = dims.size() - 1;
  CopyDims loops;
  for (size_t d = 0; d < q; ++d) {
    if (d != p) loops.push_back(dims[d]);
  }
  const size_t ip = loops.size(), iq = ip + 1;
  loops.push_back({plan.tiles_p, {plan.tp * plan.ssp, plan.tp * plan.dsp}});
  loops.push_back({plan.tiles_q, {plan.tq * plan.ssq, plan.tq}});
  std::vector<size_t> order(loops.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    return std::abs(loops[a].stride[kSrc]) > std::abs(loops[b].stride[kSrc]);
  });
  TileLoops t;
  CopyDims sorted;
  for (size_t k = 0; k < order.size(); ++k) {
    sorted.push_back(loops[order[k]]);
    if (order[k] == ip) t.kp = k;
    if (order[k] == iq) t.kq = k;
  }
  t.walk = StridedWalk<2>(std::move(sorted));
  return t;
}

// Yields the tiles of a chunk of items in order; items never go backwards.
class TileCursor {
 public:
  TileCursor(const TileLoops& loops, const TilePlan& plan, int64_t first)
      : loops_(loops), plan_(plan), walk_(loops.walk), item_(first) {
    walk_.seek(first);
  }
  Tile at(int64_t item) {
    for (; item_ < item; ++item_) walk_.next();
    const int64_t i0 = walk_.index(loops_.kp) * plan_.tp;
    const int64_t j0 = walk_.index(loops_.kq) * plan_.tq;
    return {walk_.offset(kSrc), walk_.offset(kDst), std::min(plan_.np - i0, plan_.tp),
            std::min(plan_.nq - j0, plan_.tq)};
  }

 private:
  const TileLoops& loops_;
  const TilePlan& plan_;
  StridedWalk<2> walk_;
  int64_t item_;
};

TilePlan tile_plan(const CopyDims& dims, size_t p, int64_t size, bool& direct) {
  const WalkDim<2>& dp = dims[p];
  const WalkDim<2>& dq = dims.back();
  TilePlan plan{};
  plan.np = dp.size;
  plan.nq = dq.size;
  // Direct unless the runs-per-set cut would leave dst rows shorter than a line
  // per tile (partial lines of streamed stores are slow): then the buffer.
  const int64_t run_limit = runs_per_tile_limit(dq.stride[kSrc] * size);
  direct = dp.stride[kSrc] == 1 && run_limit >= std::min(plan.nq, 64 / size);
  plan.tq = std::min(plan.nq, 1024 / size);
  if (direct) plan.tq = std::min(plan.tq, run_limit);
  const int64_t tile_bytes = direct ? kTileBytes : kTileBufferBytes;  // when q is short, p takes the rest
  plan.tp = std::min(plan.np, std::max<int64_t>(16, tile_bytes / (plan.tq * size)));
  plan.tiles_p = (plan.np + plan.tp - 1) / plan.tp;
  plan.tiles_q = (plan.nq + plan.tq - 1) / plan.tq;
  plan.ssp = dp.stride[kSrc];
  plan.ssq = dq.stride[kSrc];
  plan.dsp = dp.stride[kDst];
  return plan;
}

template <class T>
void copy_tiles(const CopyDims& dims, size_t p, const T* src, T* dst) {
  constexpr auto kSize = static_cast<int64_t>(sizeof(T));
  bool direct = false;
  const TilePlan plan = tile_plan(dims, p, kSize, direct);
  const TileLoops loops = tile_loops(dims, p, plan);
  const int64_t items = walk_count<2>(loops.walk.dims());
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 16) / (plan.tp * plan.tq));
  const bool stream = walk_count<2>(dims) * kSize >= kStreamBytes;
  const int64_t run_bytes = std::max<int64_t>(64, std::abs(plan.tp * plan.ssp) * kSize);
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
        copy_piece(s + j * plan.ssq, plan.ssp, buf + j * plan.tp, 1, tile.in, false);
      }
      detail::transpose_tile(sizeof(T), buf, plan.tp, dst + tile.dst_off, plan.dsp, tile.in, tile.jn, stream);
    }
    if (stream) detail::stream_fence();
  });
}

// Tiling pays when dst is contiguous along q, src is not, and src's smallest
// |stride| (p) is short: p's index, else -1 (rows).
template <class T>
int tile_dim(const CopyDims& dims) {
  const size_t q = dims.size() - 1;
  const int64_t ssq = std::abs(dims[q].stride[kSrc]);
  if (dims[q].stride[kDst] != 1 || ssq == 1) return -1;
  int p = -1;
  int64_t best = ssq;
  for (size_t k = 0; k < q; ++k) {
    const int64_t s = std::abs(dims[k].stride[kSrc]);
    if (s != 0 && s < best) {
      p = static_cast<int>(k);
      best = s;
    }
  }
  return p >= 0 && best * static_cast<int64_t>(sizeof(T)) <= 64 ? p : -1;
}

template <class Fn>
void dispatch_width(size_t width, Fn&& fn) {
  switch (width) {
    case 1: return fn(uint8_t{});
    case 2: return fn(uint16_t{});
    case 4: return fn(uint32_t{});
    case 8: return fn(uint64_t{});
    default: fail<DTypeError>("copy: unsupported element size ", width);
  }
}

}  // namespace

void copy_same_width(const CopyDims& dims, size_t width, const void* src, void* dst) {
  dispatch_width(width, [&](auto tag) {
    using T = decltype(tag);
    const T* s = static_cast<const T*>(src);
    T* d = static_cast<T*>(dst);
    const int p = tile_dim<T>(dims);
    if (p >= 0) {
      copy_tiles(dims, static_cast<size_t>(p), s, d);
    } else {
      copy_rows(dims, s, d);
    }
  });
}

void copy_converting(const CopyDims& dims, DType from, const void* src, DType to, void* dst) {
  dispatch_dtype(to, [&](auto to_tag) {
    using To = typename decltype(to_tag)::type;
    dispatch_dtype(from, [&](auto from_tag) {
      using From = typename decltype(from_tag)::type;
      copy_rows(dims, static_cast<const From*>(src), static_cast<To*>(dst));
    });
  });
}

}  // namespace qkv::kernels::detail
