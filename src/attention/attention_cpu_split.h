// The fused CPU forward's key parts (split-KV): where a call has too few work items to keep
// its workers busy (one head of a long prefill chunk: B H ceil(Lq / Br) items on more
// workers; or a few items not a multiple of them, 3 on 2), each item's key tiles are cut into
// P contiguous parts of near-equal tile counts, each part run by any worker with the item's
// own tile code into a partial (unnormalised O, row max m, row sum l), and the parts merged
// by logsumexp (lse_merge.h) before the item's rows are finished as unsplit ones. Internal to
// attention_cpu.cc, which includes it once.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <numeric>
#include <vector>

#include "attention/attention_cpu_tiles.h"
#include "attention/lse_merge.h"
#include "kernels/cpu/aligned_vector.h"

namespace qkv::attention {

// Key parts run by the forward so far in this process (a count for the tests: that a call
// meant to split did).
inline std::atomic<int64_t>& forward_key_parts_run() {
  static std::atomic<int64_t> parts{0};
  return parts;
}

namespace tiles {

// Part s of n of an item whose key walk has `tiles` key tiles (tile 0 at the item's
// last keys, then backwards): tiles [s tiles / n, (s + 1) tiles / n), near-equal counts; under
// causal masking every tile but the diagonal's and the first keys' is a full [Br, Bc] product,
// so near-equal counts are near-equal work.
struct KeyPart {
  int64_t item = 0, s = 0, n = 1;
  int64_t first(int64_t tiles) const { return s * tiles / n; }
  int64_t last(int64_t tiles) const { return (s + 1) * tiles / n; }
};

// The partials of a call's key parts: unit u (KeyPart) holds o [Br, Dv], m [Br], l [Br].
template <class T>
struct Partials {
  int64_t br = 0, dv = 0;
  std::vector<KeyPart> units;   // by item, its parts in order
  std::vector<int64_t> first;   // [items + 1]: the units of item i are [first[i], first[i + 1])
  kernels::AlignedVector<T> o;  // [units, Br, Dv]: the parts' O, each a GEMM's C (64-byte aligned)
  std::vector<T> m, l;          // [units, Br]
  T* o_of(size_t u) { return o.data() + static_cast<int64_t>(u) * br * dv; }
  T* m_of(size_t u) { return m.data() + static_cast<int64_t>(u) * br; }
  T* l_of(size_t u) { return l.data() + static_cast<int64_t>(u) * br; }
};

// Units for `items` items, item i cut into min(parts, tiles(i)) parts (at least 1).
template <class T, class TilesOf>
Partials<T> make_partials(int64_t items, int64_t parts, int64_t br, int64_t dv, const TilesOf& tiles_of) {
  Partials<T> pa;
  pa.br = br, pa.dv = dv;
  pa.first.push_back(0);
  for (int64_t i = 0; i < items; ++i) {
    const int64_t n = std::max<int64_t>(1, std::min(parts, tiles_of(i)));
    for (int64_t s = 0; s < n; ++s) pa.units.push_back({i, s, n});
    pa.first.push_back(static_cast<int64_t>(pa.units.size()));
  }
  const auto count = static_cast<int64_t>(pa.units.size());
  pa.o.resize(static_cast<size_t>(count * br * dv)), pa.m.resize(static_cast<size_t>(count * br));
  pa.l.resize(static_cast<size_t>(count * br));
  return pa;
}

// o [rows, Dv] (dense), m and l [rows] of item i from its parts' partials (merge_row, in part
// order, so the bits do not depend on which worker ran which part). A NaN row gets m = l = NaN
// (finish_rows then makes it NaN, as unsplit); a row with no allowed key m = -inf, l = 0 and
// o = the parts' sum of 0 v (as unsplit).
template <class T>
void merge_item(Partials<T>& pa, int64_t item, int64_t rows, T* o, T* m, T* l) {
  const auto u0 = static_cast<size_t>(pa.first[static_cast<size_t>(item)]);
  const auto u1 = static_cast<size_t>(pa.first[static_cast<size_t>(item) + 1]);
  thread_local std::vector<double> acc;
  acc.resize(static_cast<size_t>(pa.dv));
  for (int64_t x = 0; x < rows; ++x) {
    auto part = [&](size_t c) {
      const size_t u = u0 + c;
      return RowPart<T>{static_cast<double>(pa.m_of(u)[x]), static_cast<double>(pa.l_of(u)[x]), pa.o_of(u) + x * pa.dv};
    };
    const MergedRow r = merge_row(u1 - u0, part, pa.dv, acc.data());
    for (int64_t d = 0; d < pa.dv; ++d) o[x * pa.dv + d] = static_cast<T>(acc[static_cast<size_t>(d)]);
    m[x] = static_cast<T>(r.nan ? r.sum : r.max);
    l[x] = static_cast<T>(r.sum);
  }
}

}  // namespace tiles
}  // namespace qkv::attention
