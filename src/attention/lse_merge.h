// Partial attention rows over disjoint sets of keys, merged by logsumexp, for the fused
// forward's key parts (attention_cpu_split.h: an item's key tiles cut among workers) and for
// the split-KV decode's chunks (decode_cpu.cc, merge; its parts where a row has no key hold
// O_c = 0, so such a row gives 0 whatever the values: decode's rule, docs/decode.md). Ring
// attention's merge_partial (src/dist/merge.cc, the layer above) merges normalised outputs two
// at a time with their logsumexp.
//
// Part c of a row holds m_c (its largest score), l_c = sum_j exp(s_j - m_c) and the
// unnormalised O_c = sum_j exp(s_j - m_c) v_j [Dv]. The whole row is
//   M = max_c m_c,  L = sum_c l_c e^(m_c - M),  O = sum_c O_c e^(m_c - M),
// so that out = O / L and lse = M + log L.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>

namespace qkv::attention {

// One part of a row (merge_row): m, l, and its O [Dv] (float or double).
template <class X>
struct RowPart {
  double m = 0, l = 0;
  const X* o = nullptr;
};

struct MergedRow {
  double max = 0;    // M (-inf: no part had an allowed key)
  double sum = 0;    // L (0 where M is -inf; NaN where `nan`)
  bool nan = false;  // a NaN m_c or l_c (a NaN score, or +inf - +inf): the row is NaN, as softmax makes it
};

// acc [Dv] = O, summed in part order in double, with M and L returned; part(c) gives part c
// (RowPart) of `parts`. A NaN row gets acc NaN. Where no part has an allowed key (M = -inf),
// acc = sum_c 0 O_c: 0, or NaN where a part's O_c is (the unsplit kernels' sum of 0 v_j over
// masked keys: a NaN or inf value stays visible).
template <class PartOf>
MergedRow merge_row(size_t parts, const PartOf& part, int64_t dv, double* acc) {
  MergedRow r;
  r.max = -std::numeric_limits<double>::infinity();
  for (size_t c = 0; c < parts; ++c) {
    const auto x = part(c);
    if (std::isnan(x.m) || std::isnan(x.l)) r.nan = true;
    if (x.m > r.max) r.max = x.m;
  }
  if (r.nan) {
    r.sum = std::numeric_limits<double>::quiet_NaN();
    std::fill(acc, acc + dv, r.sum);
    return r;
  }
  std::fill(acc, acc + dv, 0.0);
  const bool none = r.max == -std::numeric_limits<double>::infinity();
  for (size_t c = 0; c < parts; ++c) {
    const auto x = part(c);
    const double w = none ? 0.0 : std::exp(x.m - r.max);  // 0 for a part with no allowed key
    r.sum += w * x.l;
    for (int64_t d = 0; d < dv; ++d) acc[d] += w * static_cast<double>(x.o[d]);
  }
  return r;
}

}  // namespace qkv::attention
