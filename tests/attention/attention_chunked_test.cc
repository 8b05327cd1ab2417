// float32 fused attention at head dims > 128, where Q K^T is summed over Dk chunks
// (attention_cpu_tiles.h, score_chunk): forward and backward against float64 oracles,
// on an RMS error bound that one FMA chain over Dk (the scores before the chunks) exceeds.
//
// The bound comes from an emulation in the test: attention in long double from float32
// scores, each score summed as qkv's chunked products sum it (float32 fused multiply-add
// chains over blocks of 64 of Dk, the blocks added in float32) or as one chain over all
// of Dk. Its RMS error against the exact attention is the part of the fused kernel's error
// that the scores cause; the rest (exp, the online softmax, P V) is D-independent float32
// rounding of the same size as at D = 64. The fused forward must stay below kForward x
// the one-chain emulation's error: measured 0.98-1.21x before the chunks (one product over
// Dk), 0.34-0.84x with chunks of 64 (0.43-0.93x with 128), on the shapes below. The backward
// recomputes the forward's scores (the same chunks): its dV = (P o M)^T dO carries P's error,
// 1.14-1.31x the forward's one-chain error before, 0.66-0.98x after; its dQ and dK also carry
// dP = dO V^T, still one chain over Dv (1.29-1.74x before, 0.96-1.45x after).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <vector>

#include "attention/attention_test_configs.h"
#include "common/attention_oracle.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/parallel.h"

namespace qkv {
namespace {

// Dot product of a [d] and b [d] in float32: fused multiply-add chains over blocks of
// `block`, the blocks' sums added in float32 (block >= d: one chain).
float chained_dot(const float* a, const float* b, int64_t d, int64_t block) {
  float total = 0.0f;
  for (int64_t c0 = 0; c0 < d; c0 += block) {
    float acc = 0.0f;
    for (int64_t x = c0; x < std::min(d, c0 + block); ++x) acc = std::fma(a[x], b[x], acc);
    total = c0 == 0 ? acc : total + acc;
  }
  return total;
}

// Attention of a test configuration (no dropout) in long double from float32 scores
// summed as chained_dot sums them: out [B, Hq, Lq, Dv].
std::vector<long double> emulated(const test::Config& c, const test::Inputs& in, int64_t block) {
  const std::vector<float> q = in.q.to_vector<float>(), k = in.k.to_vector<float>(), v = in.v.to_vector<float>();
  std::vector<double> mask;
  Shape ms;
  if (in.options.attn_mask)
    mask = in.options.attn_mask->to_vector<double>(), ms = attention_oracle::rank4(in.options.attn_mask->shape());
  const bool bool_mask = in.options.attn_mask && in.options.attn_mask->dtype() == DType::b8;
  const long double scale = 1.0L / std::sqrt(static_cast<long double>(c.dk));
  std::vector<long double> out(static_cast<size_t>(c.b * c.hq * c.lq * c.dv), 0.0L), s(static_cast<size_t>(c.lk));
  for (int64_t b = 0; b < c.b; ++b) {
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t hk = c.hk == c.hq ? h : h / (c.hq / c.hk), bk = c.kv_batch_one ? 0 : b;
      const float* kh = k.data() + (bk * c.hk + hk) * c.lk * c.dk;
      const float* vh = v.data() + (bk * c.hk + hk) * c.lk * c.dv;
      for (int64_t i = 0; i < c.lq; ++i) {
        const float* qi = q.data() + ((b * c.hq + h) * c.lq + i) * c.dk;
        const int64_t keys = c.causal ? std::min(c.lk, i + 1) : c.lk;
        long double m = -INFINITY, sum = 0;
        for (int64_t j = 0; j < keys; ++j) {
          long double bias = mask.empty() ? 0.0L : attention_oracle::at(mask, ms, b, h, i, j);
          if (bool_mask) bias = bias != 0 ? 0.0L : -INFINITY;
          s[static_cast<size_t>(j)] = scale * chained_dot(qi, kh + j * c.dk, c.dk, block) + bias;
          m = std::max(m, s[static_cast<size_t>(j)]);
        }
        if (m == -INFINITY) continue;
        for (int64_t j = 0; j < keys; ++j) sum += std::exp(s[static_cast<size_t>(j)] - m);
        long double* o = out.data() + ((b * c.hq + h) * c.lq + i) * c.dv;
        for (int64_t j = 0; j < keys; ++j) {
          const long double w = std::exp(s[static_cast<size_t>(j)] - m) / sum;
          for (int64_t d = 0; d < c.dv; ++d) o[d] += w * vh[j * c.dv + d];
        }
      }
    }
  }
  return out;
}

// RMS(got - want) / RMS(want).
template <class X>
double rms_error(const std::vector<X>& got, const std::vector<long double>& want) {
  EXPECT_EQ(got.size(), want.size());
  long double e = 0, r = 0;
  for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
    const long double d = static_cast<long double>(got[i]) - want[i];
    e += d * d, r += want[i] * want[i];
  }
  return static_cast<double>(std::sqrt(e / (r == 0 ? 1 : r)));
}

test::Config config(int64_t hq, int64_t hk, int64_t lq, int64_t lk, int64_t dk, int64_t dv, bool causal,
                    test::MaskKind mask, uint64_t seed) {
  test::Config c;
  c.b = 1, c.hq = hq, c.hk = hk, c.gqa = hq != hk && hk > 1, c.lq = lq, c.lk = lk, c.dk = dk, c.dv = dv;
  c.causal = causal, c.mask = mask, c.seed = seed;
  return c;
}

// The shapes: packed keys and ragged last tiles (L = 520 at D = 256: 128 x 256 tiles, 4+
// query tiles a head; D = 512: 64 x 64 tiles; the backward's 256 x 256 tiles packed), causal,
// GQA with Lq != Lk and a float mask, causal Lq < Lk, one query tile on 2 threads with a
// broadcast bool mask (the forward's key parts, attention_cpu_split.h; the backward's key tile
// parts), and Dk = 200 (a last chunk of 8) with Dv = 72 and K broadcast over heads.
struct Case {
  test::Config c;
  int threads = 1;
};

std::vector<Case> shapes() {
  using test::MaskKind;
  std::vector<Case> out;
  uint64_t seed = 2026112701;
  for (const int64_t d : {256, 512}) {
    out.push_back({config(1, 1, 520, 520, d, d, false, MaskKind::none, seed++), 1});
    out.push_back({config(2, 2, 300, 300, d, d, true, MaskKind::none, seed++), 1});
    out.push_back({config(4, 2, 200, 330, d, d, false, MaskKind::float_full, seed++), 1});
    out.push_back({config(2, 2, 100, 300, d, d, true, MaskKind::none, seed++), 1});
    out.push_back({config(1, 1, 60, 700, d, d, false, MaskKind::bool_broadcast, seed++), 2});
  }
  out.push_back({config(2, 1, 260, 260, 200, 72, false, MaskKind::none, seed++), 1});
  return out;
}

// Bounds on RMS error / the forward's one-chain emulation's RMS error (see the top).
constexpr double kForward = 0.9, kBackwardDv = 1.05, kBackwardDqDk = 1.6;

TEST(ChunkedScores, ForwardFloat32ErrorBelowOneFmaChainOverDk) {
  const int threads = get_num_threads();
  for (const Case& sh : shapes()) {
    const test::Config& c = sh.c;
    const test::Inputs in = test::make_inputs(c);
    const attention_oracle::Oracle ref = attention_oracle::oracle(in.q, in.k, in.v, in.options);
    set_num_threads(sh.threads);
    const AttentionResult got = scaled_dot_product_attention(in.q, in.k, in.v, in.options);
    set_num_threads(threads);
    const double fused = rms_error(got.output.to_vector<double>(), ref.out);
    const double chain = rms_error(emulated(c, in, c.dk), ref.out);
    const double blocks = rms_error(emulated(c, in, 64), ref.out);
    std::printf("%s threads=%d: RMS error fused %.3e, one chain %.3e, blocks of 64 %.3e (fused / chain %.2f)\n",
                c.str().c_str(), sh.threads, fused, chain, blocks, fused / chain);
    EXPECT_LE(fused, kForward * chain) << c.str();
    EXPECT_LT(blocks, chain) << c.str();  // the emulation itself: blocks of 64 sum more exactly
  }
}

// RMS(got - want) / RMS(want) of float32 gradients against float64 ones.
double rms_error(const Tensor& got, const Tensor& want) {
  const std::vector<double> w = want.to_vector<double>();
  return rms_error(got.to_vector<double>(), std::vector<long double>(w.begin(), w.end()));
}

TEST(ChunkedScores, BackwardFloat32ErrorAtD256) {
  const int threads = get_num_threads();
  std::vector<Case> cases;
  for (const Case& sh : shapes()) {
    if (sh.c.dk == 256 || sh.c.dk == 200) cases.push_back(sh);
  }
  for (const Case& sh : cases) {
    const test::Config& c = sh.c;
    const test::Inputs in = test::make_inputs(c);
    Shape out_shape = in.q.shape();
    out_shape.back() = c.dv;
    const Tensor grad_out = Tensor::randn(out_shape, c.seed + 9);
    AttentionOptions o = in.options;
    o.return_logsumexp = true;
    set_num_threads(sh.threads);
    const AttentionResult fwd = scaled_dot_product_attention(in.q, in.k, in.v, o);
    const AttentionGradients got =
        scaled_dot_product_attention_backward(in.q, in.k, in.v, fwd.output, grad_out, *fwd.logsumexp, o);
    set_num_threads(threads);
    AttentionOptions o64 = in.options;
    if (o64.attn_mask && o64.attn_mask->dtype() != DType::b8) o64.attn_mask = o64.attn_mask->to(DType::f64);
    const AttentionGradients ref = attention_backward_reference(in.q.to(DType::f64), in.k.to(DType::f64),
                                                                in.v.to(DType::f64), grad_out.to(DType::f64), o64);
    const double chain = rms_error(emulated(c, in, c.dk), attention_oracle::oracle(in.q, in.k, in.v, in.options).out);
    const double e[3] = {rms_error(got.dq, ref.dq), rms_error(got.dk, ref.dk), rms_error(got.dv, ref.dv)};
    std::printf("%s threads=%d: RMS error / forward one chain's: dq %.2f dk %.2f dv %.2f (chain %.3e)\n",
                c.str().c_str(), sh.threads, e[0] / chain, e[1] / chain, e[2] / chain, chain);
    EXPECT_LE(e[0], kBackwardDqDk * chain) << "dq " << c.str();
    EXPECT_LE(e[1], kBackwardDqDk * chain) << "dk " << c.str();
    EXPECT_LE(e[2], kBackwardDv * chain) << "dv " << c.str();
  }
}

}  // namespace
}  // namespace qkv
