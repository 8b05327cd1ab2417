// decode_attention_reference (qkv/kv_cache.h): float64 loops, one thread; each row's keys
// written out from the definition (not decode_cpu.cc's decode_keys).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/decode_cpu.h"
#include "attention/decode_rows.h"
#include "qkv/parallel.h"

namespace qkv {

namespace {

// int8 caches: decode_attention rounds q r (the query times the key spreads r) to int16 per row
// (attention/decode_rows.h); the reference rounds the same float32 values the same way and
// takes the rest in float64: q . k = sigma sum_c q_hat_c s_j,c/16 k_hat_j,c + q . c (offsets c).
std::vector<double> int8_query(const KVCache& cache, int64_t b, int64_t hk, const float* q) {
  const int64_t dk = cache.config().head_dim, bh = b * cache.config().kv_heads + hk;
  const float* spread = cache.key_spreads().data<float>() + bh * dk;
  std::vector<float> qs(static_cast<size_t>(dk));
  std::vector<int16_t> q_hat(static_cast<size_t>(dk));
  for (int64_t c = 0; c < dk; ++c) qs[c] = q[c] * spread[c];
  const double sigma = attention::quantize_query_row(qs.data(), dk, q_hat.data());
  std::vector<double> out(static_cast<size_t>(dk));  // sigma q_hat
  for (int64_t c = 0; c < dk; ++c) out[c] = sigma * q_hat[c];
  return out;
}

double int8_key_dot(const KVCache& cache, int64_t b, int64_t hk, int64_t row, const double* q,
                    const std::vector<double>& qk) {
  const int64_t dk = cache.config().head_dim, bh = b * cache.config().kv_heads + hk;
  const int64_t groups = cache.key_scales().size(3);
  const int8_t* k = cache.keys().data<int8_t>() + row * dk;
  const bfloat16* scales = cache.key_scales().data<bfloat16>() + row * groups;
  const float* offset = cache.key_offsets().data<float>() + bh * dk;
  double dot = 0.0;
  for (int64_t c = 0; c < dk; ++c) {
    dot += qk[c] * static_cast<double>(static_cast<float>(scales[c / KVCache::kInt8Group])) * k[c] + q[c] * offset[c];
  }
  return dot;
}

}  // namespace

AttentionResult decode_attention_reference(const Tensor& q, const KVCache& cache, const DecodeOptions& o) {
  const auto lock = cache.read_lock();  // one state of the cache throughout (qkv/kv_cache.h)
  const attention::DecodeCall d = attention::check_decode(q, cache, o, "decode_attention_reference");
  // q [B, Hq, Lq, D], rotated in float64 at its positions when the cache has rotary settings
  const Tensor q64 = q.to(DType::f64).contiguous();
  const std::vector<double> qd =
      (cache.config().rotary ? attention::rotate_queries(q64, cache, true) : q64).to_vector<double>();
  const std::vector<double> kd = cache.keys_f32().to_vector<double>();  // storage rows [-1, D] (dequantized)
  const bool int8 = cache.config().dtype == DType::i8;
  // int8 caches: the kernel's float32 query (rotated in float32), whose q r it rounds per row
  const Tensor q32 = q.to(DType::f32).contiguous();
  const std::vector<float> qf = int8 && cache.config().rotary
                                    ? attention::rotate_queries(q32, cache, false).to_vector<float>()
                                    : q32.to_vector<float>();
  const std::vector<double> vd = cache.values_f32().to_vector<double>();  // [-1, Dv]: row(b, hk, j)
  std::vector<double> out(static_cast<size_t>(d.b * d.hq * d.lq * d.dv), 0.0);
  std::vector<double> lse(static_cast<size_t>(d.b * d.hq * d.lq), -std::numeric_limits<double>::infinity());
  for (int64_t b = 0; b < d.b; ++b) {
    const int64_t n = cache.length(b);
    for (int64_t h = 0; h < d.hq; ++h) {
      check_interrupt("decode_attention_reference");
      const int64_t hk = h / d.group;
      for (int64_t t = 0; t < d.lq; ++t) {
        const int64_t pos = n - d.lq + t, row = (b * d.hq + h) * d.lq + t;
        // j <= pos (causal), pos - window < j (the options' or the cache's; as pos - j < window: pos - window
        // overflowed for a window near INT64_MAX), j < n; from the window's start (a ring's lengths are unbounded)
        std::vector<int64_t> keys;
        for (int64_t j = d.window > 0 && pos >= d.window ? pos - d.window + 1 : 0; j < n; ++j) {
          if ((!o.causal || j <= pos) && (d.window == 0 || pos - j < d.window)) keys.push_back(j);
        }
        std::vector<double> s;
        const std::vector<double> qk = int8 ? int8_query(cache, b, hk, qf.data() + row * d.dk) : std::vector<double>{};
        for (int64_t j : keys) {
          double dot = 0.0;
          if (int8) {
            dot = int8_key_dot(cache, b, hk, cache.row(b, hk, j), qd.data() + row * d.dk, qk);
          } else {
            for (int64_t c = 0; c < d.dk; ++c) dot += qd[row * d.dk + c] * kd[cache.row(b, hk, j) * d.dk + c];
          }
          double x = dot * d.scale;
          if (o.softcap > 0.0) x = o.softcap * std::tanh(x / o.softcap);
          s.push_back(x);
        }
        if (s.empty()) continue;
        const double mx = *std::max_element(s.begin(), s.end());
        double sum = 0.0;
        for (double& x : s) sum += (x = std::exp(x - mx));
        for (size_t x = 0; x < keys.size(); ++x) {
          const double w = s[x] / sum;
          for (int64_t c = 0; c < d.dv; ++c) out[row * d.dv + c] += w * vd[cache.row(b, hk, keys[x]) * d.dv + c];
        }
        lse[row] = mx + std::log(sum);
      }
    }
  }
  AttentionResult r;
  r.output = Tensor::from_vector(out, {d.b, d.hq, d.lq, d.dv}).to(q.dtype() == DType::f64 ? DType::f64 : DType::f32);
  if (o.return_logsumexp) r.logsumexp = Tensor::from_vector(lse, {d.b, d.hq, d.lq}).to(DType::f32);
  return r;
}

}  // namespace qkv
