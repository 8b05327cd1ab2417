// Training losses (mean reduction, PyTorch's definitions; Keras' from_logits binary
// cross-entropy is the same for finite logits) with the gradient of the loss with respect to
// the first input, for the backward passes. Checked against torch autograd (tests/nn/optim_test.cc).
// Empty inputs: the mean over no elements is NaN and the gradient an empty tensor of the
// input's shape, as torch's reduction='mean' gives (Losses.EmptyInputsGiveNaNAsTorch).
#pragma once

#include <cstdint>

#include "qkv/tensor.h"

namespace qkv::nn {

struct LossResult {
  double loss = 0.0;
  Tensor grad;  // d loss / d input: the input's shape, float32
};

// mean((1 - y) x - log_sigmoid(x)) over every element (torch's form: at infinite x its values,
// NaN at x = -inf and at x = +inf, y = 1); grad (sigmoid(x) - y) / N.
LossResult binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& targets);
// logits [N, C], targets [N] integer classes in [0, C) or ignore_index: mean of
// -log softmax(x_n)[y_n] over the M rows not ignored; grad (softmax(x_n) - onehot(y_n)) / M,
// 0 on ignored rows (torch's ignore_index, default -100: every row ignored gives NaN).
// ValueError naming the row for another class out of range, DTypeError for float or bool targets.
LossResult cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
// mean((x - y)^2); grad 2 (x - y) / N.
LossResult mse_loss(const Tensor& input, const Tensor& target);

}  // namespace qkv::nn
