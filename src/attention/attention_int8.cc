// int8 Q K^T of the fused CPU attention forward: see attention_int8.h.
#include "attention/attention_int8.h"

#include <algorithm>
#include <cmath>

#include "kernels/cpu/quantize.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"

namespace qkv::attention::int8 {

namespace {

size_t at(int64_t i) { return static_cast<size_t>(i); }

// Entry e of keys: K rows k [Lk, Dk] (row stride ld), smoothed and quantized.
void quantize_entry(const float* k, int64_t ld, bool smooth, QuantizedKeys& keys, int64_t e) {
  const int64_t lk = keys.lk, dk = keys.dk;
  std::vector<double> sum(at(dk), 0.0);  // [Dk]; a NaN or Inf anywhere makes it non-finite
  for (int64_t j = 0; j < lk; ++j) {
    for (int64_t d = 0; d < dk; ++d) sum[at(d)] += k[j * ld + d];
  }
  float* mean = keys.mean.data() + e * dk;  // [Dk]
  bool finite = true;
  for (int64_t d = 0; d < dk; ++d) {
    finite = finite && std::isfinite(sum[at(d)]);
    mean[d] = smooth ? static_cast<float>(sum[at(d)] / static_cast<double>(lk)) : 0.0f;
  }
  keys.finite[at(e)] = finite ? 1 : 0;
  if (!finite) return;
  std::vector<float> block(at(kKeyBlock * dk));  // [block keys, Dk] smoothed
  for (int64_t j0 = 0; j0 < lk; j0 += kKeyBlock) {
    const int64_t n = std::min(kKeyBlock, lk - j0);
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t d = 0; d < dk; ++d) block[at(j * dk + d)] = k[(j0 + j) * ld + d] - mean[d];
    }
    const float s = kernels::symmetric_scale(kernels::max_abs(block.data(), n * dk));
    kernels::quantize_with(block.data(), n * dk, s, keys.k8.data() + (e * lk + j0) * dk);
    std::fill_n(keys.scale.data() + e * lk + j0, n, s);
  }
}

}  // namespace

QuantizedKeys quantize_keys(const Problem& p, bool smooth) {
  QuantizedKeys keys;
  keys.lk = p.lk;
  keys.dk = p.dk;
  // The distinct K (batch, head)s: flat batch entries that read the same K (broadcast
  // leading dims, GQA groups) share one entry.
  std::vector<int64_t> offset(at(p.batch_size));  // [batch_size]
  for (int64_t b = 0; b < p.batch_size; ++b) offset[at(b)] = batch_offset(p.k, p.batch, b, p.gqa_group);
  std::vector<int64_t> distinct = offset;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  keys.entry.resize(at(p.batch_size));
  for (int64_t b = 0; b < p.batch_size; ++b) {
    keys.entry[at(b)] = std::lower_bound(distinct.begin(), distinct.end(), offset[at(b)]) - distinct.begin();
  }
  const auto entries = static_cast<int64_t>(distinct.size());
  keys.k8.resize(at(entries * p.lk * p.dk));
  keys.scale.resize(at(entries * p.lk));
  keys.mean.resize(at(entries * p.dk));
  keys.finite.resize(at(entries));
  const float* k = p.k.data<float>();
  const int64_t ld = p.k.stride(-2);
  // Inline below ~1M elements: a second parallel region per call cost small calls more than
  // the pass itself on a loaded 2-vCPU VM ((1, 8, 512, 64) causal, 2 threads: 12.0 ms with
  // the pass threaded against 5.3 ms for float32 tiles).
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 20) / std::max<int64_t>(1, p.lk * p.dk));
  parallel_for(0, entries, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t e = lo; e < hi; ++e) quantize_entry(k + distinct[at(e)], ld, smooth, keys, e);
  });
  return keys;
}

QuantizedQuery::QuantizedQuery(int64_t br, int64_t bc, int64_t dk) : q8(at(br * dk)), bias(at(br)), acc(at(br * bc)) {}

void quantize_query(const float* q, int64_t rows, int64_t ld, const QuantizedKeys& keys, int64_t b,
                    QuantizedQuery& out) {
  const int64_t dk = keys.dk;
  out.keys = &keys;
  out.entry = keys.entry[at(b)];
  float amax = 0.0f;
  bool finite = true;  // no Inf or NaN in the tile (max_abs returns them)
  for (int64_t x = 0; x < rows; ++x) {
    const float a = kernels::max_abs(q + x * ld, dk);
    finite = finite && std::isfinite(a);
    amax = std::max(amax, a);
  }
  out.ok = finite && keys.finite[at(out.entry)] != 0;
  if (!out.ok) return;
  out.scale = kernels::symmetric_scale(amax);
  for (int64_t x = 0; x < rows; ++x) kernels::quantize_with(q + x * ld, dk, out.scale, out.q8.data() + x * dk);
  // bias [rows] = Q [rows, Dk] mean [Dk, 1]: the shift the smoothing took from each row's scores.
  GemmShape g;
  g.m = rows;
  g.n = 1;
  g.k = dk;
  g.lda = ld;
  g.ldb = 1;
  g.ldc = 1;
  gemm(g, 1.0f, q, keys.mean.data() + out.entry * dk, 0.0f, out.bias.data());
}

void quantized_scores(QuantizedQuery& q, int64_t rows, int64_t j0, int64_t cols, float alpha, float* s, int64_t lds) {
  const QuantizedKeys& keys = *q.keys;
  GemmShape g;
  g.trans_b = true;
  g.m = rows;
  g.n = cols;
  g.k = keys.dk;
  g.lda = keys.dk;
  g.ldb = keys.dk;
  g.ldc = cols;
  gemm(g, q.q8.data(), keys.k8.data() + (q.entry * keys.lk + j0) * keys.dk, q.acc.data());  // [rows, cols]
  const float* ks = keys.scale.data() + q.entry * keys.lk + j0;                             // [cols]
  for (int64_t x = 0; x < rows; ++x) {
    const int32_t* a = q.acc.data() + x * cols;  // [cols]
    float* row = s + x * lds;                    // [cols]
    const float sq = alpha * q.scale, bias = alpha * q.bias[at(x)];
    for (int64_t c = 0; c < cols; ++c) row[c] = sq * ks[c] * static_cast<float>(a[c]) + bias;
  }
}

}  // namespace qkv::attention::int8
