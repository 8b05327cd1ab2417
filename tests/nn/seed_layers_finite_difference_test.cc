// Central differences of every gradient of the seed layers' backward passes (issue 15: finite-
// difference checks of every backward), with tests/common/finite_difference.h's steps and
// criterion: SelfAttention, MultiHeadSelfAttention (with a mask), SeparateHeadsAttention
// (causal, Lq != Lk, Dkq != Dv) and LazyMultiHeadAttention, every element of every input and
// parameter.
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "common/finite_difference.h"
#include "qkv/nn/seed_layers.h"

namespace qkv::nn {
namespace {

using test::Comparison;
using test::dot;
using test::numeric_grad;

// The layer's parameters replaced by random ones at a moderate scale (biases too).
template <class Layer>
std::map<std::string, Tensor> randomize(Layer& layer, uint64_t seed) {
  std::map<std::string, Tensor> sd = layer.state_dict();
  for (auto& [name, t] : sd) {
    auto v = Tensor::randn(t.shape(), seed++).template to_vector<float>();
    for (float& x : v) x *= 0.5f;
    t = Tensor::from_vector(v, t.shape());
  }
  layer.load_state_dict(sd);
  return sd;
}

// Numeric gradients of every parameter of `layer` for loss(layer).
template <class Layer, class Loss>
void add_params(Comparison& c, Layer layer, const std::map<std::string, Tensor>& sd,
                const std::map<std::string, Tensor>& analytic, Loss loss) {
  for (const auto& [name, t] : sd) {
    c.add(name, analytic.at(name), numeric_grad(t, [&](const Tensor& p) {
            std::map<std::string, Tensor> changed = sd;
            changed[name] = p;
            layer.load_state_dict(changed);
            return loss(layer);
          }));
  }
}

TEST(FiniteDifferenceBackward, SeedSelfAttentionLayers) {
  const Tensor x = Tensor::randn({2, 4, 6}, 1), g = Tensor::randn({2, 4, 6}, 2);
  Tensor mask = Tensor::zeros({4, 4}, DType::b8);  // True = masked
  mask.set_item({0, 3}, 1.0), mask.set_item({1, 2}, 1.0);
  {
    SelfAttention layer(6);
    const auto sd = randomize(layer, 10);
    const SelfAttentionGradients an = layer.backward(x, g);
    Comparison c;
    c.add("x", an.x, numeric_grad(x, [&](const Tensor& t) { return dot(layer.forward(t), g); }));
    add_params(c, layer, sd, an.params, [&](const SelfAttention& l) { return dot(l.forward(x), g); });
    c.check("SelfAttention");
  }
  {
    MultiHeadSelfAttention layer(6, 2, 4);  // dim_head 4 != 6 / 2
    const auto sd = randomize(layer, 20);
    const SelfAttentionGradients an = layer.backward(x, g, mask);
    Comparison c;
    c.add("x", an.x, numeric_grad(x, [&](const Tensor& t) { return dot(layer.forward(t, mask), g); }));
    add_params(c, layer, sd, an.params, [&](const MultiHeadSelfAttention& l) { return dot(l.forward(x, mask), g); });
    c.check("MultiHeadSelfAttention (mask)");
  }
}

TEST(FiniteDifferenceBackward, SeedLayersWithQueryKeyValue) {
  const Tensor q = Tensor::randn({2, 3, 4}, 3), k = Tensor::randn({2, 5, 4}, 4), v = Tensor::randn({2, 5, 4}, 5);
  {
    SeparateHeadsAttention layer(4, 2, 3, 5, 0.7, true);  // Dkq 3, Dv 5, scale 0.7, causal
    const auto sd = randomize(layer, 30);
    const Tensor g = Tensor::randn(layer.forward(q, k, v).output.shape(), 6);
    const MultiheadAttentionGradients an = layer.backward(q, k, v, g);
    auto loss = [&](const Tensor& a, const Tensor& b, const Tensor& c2) {
      return dot(layer.forward(a, b, c2).output, g);
    };
    Comparison c;
    c.add("q", an.query, numeric_grad(q, [&](const Tensor& t) { return loss(t, k, v); }));
    c.add("k", an.key, numeric_grad(k, [&](const Tensor& t) { return loss(q, t, v); }));
    c.add("v", an.value, numeric_grad(v, [&](const Tensor& t) { return loss(q, k, t); }));
    add_params(c, layer, sd, an.params,
               [&](const SeparateHeadsAttention& l) { return dot(l.forward(q, k, v).output, g); });
    c.check("SeparateHeadsAttention (causal)");
  }
  {
    LazyMultiHeadAttention layer(4, 2);
    (void)layer.forward(q, k, v);  // materializes the lazy projections
    const auto sd = randomize(layer, 40);
    const Tensor g = Tensor::randn({2, 3, 4}, 7);
    const MultiheadAttentionGradients an = layer.backward(q, k, v, g);
    Comparison c;
    c.add("q", an.query, numeric_grad(q, [&](const Tensor& t) { return dot(layer.forward(t, k, v), g); }));
    c.add("k", an.key, numeric_grad(k, [&](const Tensor& t) { return dot(layer.forward(q, t, v), g); }));
    c.add("v", an.value, numeric_grad(v, [&](const Tensor& t) { return dot(layer.forward(q, k, t), g); }));
    add_params(c, layer, sd, an.params, [&](LazyMultiHeadAttention l) { return dot(l.forward(q, k, v), g); });
    c.check("LazyMultiHeadAttention");
  }
}

}  // namespace
}  // namespace qkv::nn
