// Seed 001 trained in qkv (issue 15 item 4): its model, MultiHeadAttention(num_heads=2,
// key_dim=4) self-attention + Dense(1) with Keras 3's weight layout, forward and backward
// written side by side from qkv's ops (Linear, scaled_dot_product_attention and its fused
// backward, Linear and its backward), binary cross-entropy from logits, Keras' Adam. Reproduces Keras'
// per-epoch losses and final weights (tests/nn/seed001_training_test.cc, fixture from
// tests/seed001/train_seed001_history.py).
#pragma once

#include <vector>

#include "qkv/nn/optim.h"
#include "qkv/tensor.h"

namespace qkv::nn {

// Weight names: query_kernel [D, H, K], query_bias [H, K], key_*, value_*,
// attention_output_kernel [H, K, D], attention_output_bias [D], dense_kernel [D, 1],
// dense_bias [1] (Keras' variables of the two layers).
struct Seed001Step {
  double loss = 0.0;
  NamedTensors grads;  // d loss / d weight, same names and shapes
};

// The mean binary cross-entropy (from logits) of the model on x [B, T, D] against
// y [B, T, 1], and its gradient with respect to every weight.
Seed001Step seed001_loss_and_grads(const NamedTensors& weights, const Tensor& x, const Tensor& y);

// `epochs` full-batch steps of `optimizer` (Keras' model.fit on one batch): returns each
// epoch's loss, computed before that epoch's update (what Keras' History records).
std::vector<double> train_seed001(NamedTensors& weights, const Tensor& x, const Tensor& y, int epochs, Adam& optimizer);

}  // namespace qkv::nn
