// Central differences of every gradient of Linear::backward and MultiheadAttention::backward
// on small shapes (issue 15: float64 finite-difference checks of every backward). The layers
// are float32: each element is moved by +-h in float32 (the step taken as the difference of the
// two rounded values), the loss sum(y * g) is accumulated in double from the float32 output.
// Every element of every input and parameter is checked, with random (not zero) biases. With
// h = 1e-2 the central difference is off by about h^2 |f'''| / 6 plus float32 rounding of the
// loss over 2h (measured worst 4.3e-5 of the configuration's largest gradient, 4.6e-6 for Linear);
// the criterion, 5e-4 of it, is far below what a wrong gradient gives (checked by breaking one
// line: a transposed weight gradient, bias_k's sum over one batch entry only).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/finite_difference.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/mha.h"

namespace qkv::nn {
namespace {

using test::Comparison;
using test::dot;
using test::numeric_grad;

TEST(FiniteDifferenceBackward, Linear) {
  const Tensor w = Tensor::randn({4, 5}, 1), b = Tensor::randn({4}, 2);
  const Tensor x = Tensor::randn({2, 3, 5}, 3), g = Tensor::randn({2, 3, 4}, 4);
  for (const bool keras : {false, true}) {
    const Tensor wl = keras ? w.transpose(0, 1).contiguous() : w;  // Keras: kernel [in, out]
    auto make = [&](const Tensor& weight, const Tensor& bias) {
      return keras ? Linear::keras(weight, bias) : Linear::torch(weight, bias);
    };
    const LinearGradients an = make(wl, b).backward(x, g);
    Comparison c;
    c.add("dx", an.dx, numeric_grad(x, [&](const Tensor& t) { return dot(make(wl, b).forward(t), g); }));
    c.add("dweight", an.dweight, numeric_grad(wl, [&](const Tensor& t) { return dot(make(t, b).forward(x), g); }));
    c.add("dbias", *an.dbias, numeric_grad(b, [&](const Tensor& t) { return dot(make(wl, t).forward(x), g); }));
    c.check(keras ? "Linear (Keras layout)" : "Linear (torch layout)");
  }
}

struct MhaCase {
  std::string name;
  MultiheadAttentionConfig config;
  int64_t l = 3, s = 4, n = 2;  // n = 0: unbatched
  bool self = false;            // query, key and value one tensor
  MultiheadAttentionOptions options;
};

Tensor input(const MhaCase& c, int64_t length, int64_t features, uint64_t seed) {
  if (c.n == 0) return Tensor::randn({length, features}, seed);
  return c.config.batch_first ? Tensor::randn({c.n, length, features}, seed)
                              : Tensor::randn({length, c.n, features}, seed);
}

void check_mha(const MhaCase& c) {
  MultiheadAttention layer(c.config);
  std::map<std::string, Tensor> sd = layer.state_dict();
  uint64_t seed = 100;
  for (auto& [name, t] : sd) {  // random parameters, biases included, at a moderate scale
    auto v = Tensor::randn(t.shape(), seed++).to_vector<float>();
    for (float& x : v) x *= 0.5f;
    t = Tensor::from_vector(v, t.shape());
  }
  layer.load_state_dict(sd);
  const int64_t e = c.config.embed_dim;
  const Tensor q = input(c, c.l, e, 1);
  const Tensor k = c.self ? q : input(c, c.s, c.config.kdim.value_or(e), 2);
  const Tensor v = c.self ? q : input(c, c.s, c.config.vdim.value_or(e), 3);
  const Tensor g = input(c, c.l, e, 4);
  const MultiheadAttentionGradients an = layer.backward(q, k, v, g, c.options);
  auto loss = [&](const MultiheadAttention& m, const Tensor& qq, const Tensor& kk, const Tensor& vv) {
    return dot(m.forward(qq, kk, vv, c.options).output, g);
  };
  Comparison cmp;
  if (c.self) {  // the one tensor's gradient is the sum of its three roles
    std::vector<double> sum = an.query.to_vector<double>();
    const auto dk = an.key.to_vector<double>(), dv = an.value.to_vector<double>();
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += dk[i] + dv[i];
    cmp.add("query=key=value", Tensor::from_vector(sum, q.shape()),
            numeric_grad(q, [&](const Tensor& t) { return loss(layer, t, t, t); }));
  } else {
    cmp.add("query", an.query, numeric_grad(q, [&](const Tensor& t) { return loss(layer, t, k, v); }));
    cmp.add("key", an.key, numeric_grad(k, [&](const Tensor& t) { return loss(layer, q, t, v); }));
    cmp.add("value", an.value, numeric_grad(v, [&](const Tensor& t) { return loss(layer, q, k, t); }));
  }
  EXPECT_EQ(an.params.size(), sd.size()) << c.name;
  for (const auto& [name, p] : sd) {
    ASSERT_TRUE(an.params.count(name)) << c.name << ": " << name;
    cmp.add(name, an.params.at(name), numeric_grad(p, [&](const Tensor& t) {
              std::map<std::string, Tensor> moved = sd;
              moved[name] = t;
              MultiheadAttention m = layer;
              m.load_state_dict(moved);
              return loss(m, q, k, v);
            }));
  }
  cmp.check("MultiheadAttention " + c.name);
}

MhaCase mha_case(const std::string& name, int64_t e, int64_t h) {
  MhaCase c;
  c.name = name, c.config.embed_dim = e, c.config.num_heads = h;
  return c;
}

TEST(FiniteDifferenceBackward, MultiheadAttentionPlain) {
  MhaCase c = mha_case("plain (cross, kdim = vdim = E)", 4, 2);
  check_mha(c);
  c = mha_case("self-attention, batch_first", 4, 2);
  c.config.batch_first = true, c.self = true, c.s = c.l;
  check_mha(c);
}

TEST(FiniteDifferenceBackward, MultiheadAttentionBiasKv) {
  MhaCase c = mha_case("add_bias_kv, self-attention", 4, 2);
  c.config.add_bias_kv = true, c.self = true, c.s = c.l;
  check_mha(c);
  c = mha_case("add_bias_kv, kdim/vdim, batch_first, float attn_mask", 4, 2);
  c.config.add_bias_kv = true, c.config.kdim = 3, c.config.vdim = 5, c.config.batch_first = true;
  c.options.attn_mask = Tensor::randn({3, 4}, 7);
  check_mha(c);
}

TEST(FiniteDifferenceBackward, MultiheadAttentionZeroAttn) {
  MhaCase c = mha_case("add_zero_attn, key_padding_mask (one batch entry fully padded), no bias", 4, 2);
  c.config.add_zero_attn = true, c.config.bias = false;
  Tensor kpm = Tensor::zeros({2, 4}, DType::b8);
  for (int64_t j = 0; j < 4; ++j) kpm.set_item({0, j}, 1.0);  // only the zero row is left for batch 0
  kpm.set_item({1, 1}, 1.0);
  c.options.key_padding_mask = kpm;
  check_mha(c);
  c = mha_case("add_zero_attn, unbatched, kdim/vdim", 4, 1);
  c.config.add_zero_attn = true, c.config.kdim = 2, c.config.vdim = 3, c.n = 0;
  check_mha(c);
}

TEST(FiniteDifferenceBackward, MultiheadAttentionBiasKvZeroAttnMasks) {
  MhaCase c = mha_case("add_bias_kv + add_zero_attn, kdim/vdim, key padding + 3-D bool mask", 4, 2);
  c.config.add_bias_kv = true, c.config.add_zero_attn = true, c.config.kdim = 5, c.config.vdim = 3;
  Tensor kpm = Tensor::zeros({2, 4}, DType::b8);
  kpm.set_item({1, 3}, 1.0);
  Tensor m3 = Tensor::zeros({4, 3, 4}, DType::b8);  // [N*H, L, S]
  for (int64_t i = 0; i < 48; i += 5) m3.set_item({i / 12, (i / 4) % 3, i % 4}, 1.0);
  c.options.key_padding_mask = kpm, c.options.attn_mask = m3;
  check_mha(c);
  c = mha_case("add_bias_kv + add_zero_attn, unbatched self-attention, causal hint", 4, 2);
  c.config.add_bias_kv = true, c.config.add_zero_attn = true, c.n = 0, c.self = true, c.s = c.l;
  Tensor causal = Tensor::zeros({3, 3}, DType::b8);
  for (int64_t i = 0; i < 3; ++i) {
    for (int64_t j = i + 1; j < 3; ++j) causal.set_item({i, j}, 1.0);
  }
  c.options.attn_mask = causal, c.options.is_causal = true, c.options.need_weights = false;
  check_mha(c);
}

}  // namespace
}  // namespace qkv::nn
