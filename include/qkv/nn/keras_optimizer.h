// Keras' Adam state out of the files Keras saves it in, to resume training in qkv (issue 15
// item 3): a TF checkpoint (tf.train.Checkpoint(model=..., optimizer=...)), a legacy .h5
// model file (optimizer_weights/adam/...), a Keras 3 .keras archive or .weights.h5
// (optimizer/vars/N). qkv::io reads all of them (io::load_weights); this maps their
// optimizer entries onto qkv's nn::Adam state ("m/<name>", "v/<name>", Adam::load_state).
//
// How Keras names the slots (Keras 3, keras/src/optimizers/adam.py build()):
//   named files (TF checkpoints, .h5 models): "<optimizer>/<path>_momentum" and
//     "<optimizer>/<path>_velocity", <path> the variable's path with '/' replaced by '_'
//     ("adam/multi_head_attention_query_kernel_momentum"), "<optimizer>/iteration",
//     "<optimizer>/learning_rate";
//   Keras 3 .keras / .weights.h5: unnamed "optimizer/vars/N": 0 the iteration count, 1 the
//     learning rate, then (momentum, velocity) for each trainable variable in the model's
//     trainable_variables order (2 + 2i, 3 + 2i).
// So the caller gives the trainable variables in that order, each with its Keras path and
// qkv's name for it. Keras' m and v are the same quantities as nn::Adam's Convention::keras.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "qkv/io_tensor_files.h"
#include "qkv/nn/optim.h"

namespace qkv::nn {

struct KerasAdamState {
  NamedTensors state;                   // "m/<name>", "v/<name>" (float32, the variables' shapes)
  int64_t iterations = 0;               // steps taken: Adam::load_state(state, iterations)
  std::optional<double> learning_rate;  // as saved (a schedule's value is not saved by Keras)
};

// One trainable variable: Keras' path ("multi_head_attention/query/kernel") and qkv's name
// for it ("query_kernel"), in the model's trainable_variables order.
struct KerasVariable {
  std::string path;
  std::string name;
};

// The Adam state of `file` for `variables`. FormatError naming `source` when the file has no
// optimizer state, a slot is missing (listing the optimizer entries found), a slot's shape
// differs from the variable's `shapes` entry (when given: same order as `variables`), or the
// unnamed layout does not hold 2 + 2 n entries (another optimizer or amsgrad's extra slots).
KerasAdamState keras_adam_state(const io::WeightFile& file, const std::vector<KerasVariable>& variables,
                                const std::string& source, const std::vector<Shape>& shapes = {});

// Seed 001's variables (MultiHeadAttention "multi_head_attention" + Dense "dense") in Keras'
// trainable_variables order, with the names of qkv/nn/seed001_training.h.
std::vector<KerasVariable> seed001_keras_variables();

}  // namespace qkv::nn
