// The Keras MultiHeadAttention fixtures' layer config and call (tests/fixtures/mha_keras and
// mha_keras_grad, written by make_keras_mha_fixtures.py / make_keras_mha_grad_fixtures.py),
// shared by the forward and backward tests.
#pragma once

#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/fixtures.h"
#include "qkv/nn/keras_mha.h"

namespace qkv::nn::testing {

// The layer's constructor arguments from the fixture's options.
inline KerasMultiHeadAttentionConfig keras_config_of(const nlohmann::json& o) {
  KerasMultiHeadAttentionConfig c;
  c.num_heads = o.at("num_heads");
  c.key_dim = o.at("key_dim");
  if (!o.at("value_dim").is_null()) c.value_dim = o.at("value_dim").get<int64_t>();
  c.use_bias = o.at("use_bias");
  if (!o.at("output_shape").is_null()) c.output_shape = o.at("output_shape").get<std::vector<int64_t>>();
  if (!o.at("attention_axes").is_null()) c.attention_axes = o.at("attention_axes").get<std::vector<int64_t>>();
  if (o.contains("sliding_window")) c.sliding_window = o.at("sliding_window").get<int64_t>();  // Keras 3.15
  c.use_gate = o.value("use_gate", false);
  return c;
}

// The call: query, value (the query when the fixture has none) and the call's options.
struct KerasInputs {
  Tensor query, value;
  KerasMultiHeadAttentionOptions call;
};

inline KerasInputs keras_inputs_of(const Fixture& fx) {
  KerasInputs r;
  r.query = fx.at("input.query");
  r.value = fx.has("input.value") ? fx.at("input.value") : r.query;
  r.call.key = fx.maybe("input.key");
  r.call.query_mask = fx.maybe("input.query_mask");
  r.call.value_mask = fx.maybe("input.value_mask");
  r.call.key_mask = fx.maybe("input.key_mask");
  r.call.attention_mask = fx.maybe("input.attention_mask");
  r.call.return_attention_scores = fx.options.at("return_attention_scores");
  r.call.use_causal_mask = fx.options.at("use_causal_mask");
  return r;
}

}  // namespace qkv::nn::testing
