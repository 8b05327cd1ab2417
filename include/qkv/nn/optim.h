// Optimizers with PyTorch's and Keras 3's exact update rules (seed 001 trains with Adam),
// gradient clipping, and their state. Parameters are floating point tensors updated in place, by
// name (a layer's state_dict() names), each stepped in its own dtype (as torch's): float32 and
// float64 with state of that dtype, float16 and bfloat16 computed in float32 (float32 state) and
// rounded to nearest into the parameter. Integer and bool parameters are a DTypeError (torch trains
// only floating point tensors). Gradients have the parameters' shapes and are converted.
//
// The conventions differ, and both are here (Convention::torch / Convention::keras):
//   SGD   torch: g += wd p; buf = g (first step) else momentum buf + (1 - dampening) g;
//               g = nesterov ? g + momentum buf : buf; p -= lr g.
//         keras: m = momentum m - lr g; p += nesterov ? momentum m - lr g : m (the velocity
//               carries lr; no dampening); weight decay decoupled: p -= lr wd p first.
//   Adam  torch: g += wd p (L2; AdamW instead: p *= 1 - lr wd); m = b1 m + (1 - b1) g;
//               v = b2 v + (1 - b2) g^2; p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps).
//         keras: m += (g - m)(1 - b1); v += (g^2 - v)(1 - b2);
//               p -= lr sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) + eps): eps is added to
//               sqrt(v) before the bias correction, i.e. torch's eps divided by sqrt(1 - b2^t)
//               (Keras' default eps 1e-7, torch's 1e-8). Weight decay (AdamW) decoupled as
//               torch's AdamW: p -= lr wd p before the step.
// Checked step by step against torch.optim and keras.optimizers (tests/nn/optim_test.cc,
// fixtures from tests/nn/make_optim_fixtures.py).
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "qkv/tensor.h"

namespace qkv::nn {

enum class Convention { torch, keras };

struct SgdOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;     // torch only
  double weight_decay = 0.0;  // torch: L2 added to the gradient; keras: decoupled
  bool nesterov = false;      // torch: needs momentum > 0 and dampening 0 (ValueError otherwise, as torch);
                              // keras: momentum in [0, 1], no dampening (ValueError), nesterov with
                              // momentum 0 the plain step (as keras.optimizers.SGD)
  Convention convention = Convention::torch;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;                    // keras' default is 1e-7: set it for Convention::keras
  double weight_decay = 0.0;            // torch Adam: L2; decoupled (AdamW) or keras: p -= lr wd p
  bool decoupled_weight_decay = false;  // torch: AdamW
  Convention convention = Convention::torch;
};

using NamedTensors = std::map<std::string, Tensor>;

class Sgd {
 public:
  explicit Sgd(const SgdOptions& options);  // ValueError for a negative lr/momentum/weight decay
  // One step: every params[name] (f32, f64, f16, bf16; DTypeError for another) updated in place from
  // grads[name] (same shape; ValueError naming the parameter when missing or of another shape).
  void step(NamedTensors& params, const NamedTensors& grads);
  const NamedTensors& state() const { return momentum_; }  // the momentum buffers, by name

 private:
  SgdOptions o_;
  NamedTensors momentum_;
};

class Adam {
 public:
  explicit Adam(const AdamOptions& options);
  void step(NamedTensors& params, const NamedTensors& grads);
  int64_t steps() const { return t_; }
  // "m/<name>", "v/<name>": the moment estimates; load_state restores them with steps
  // (ValueError for an unknown key or a parameter with one moment and not the other: stepping
  // from a missing v = 0 moved it by lr m / eps; ShapeError when its two differ).
  NamedTensors state() const;
  void load_state(const NamedTensors& state, int64_t steps);

 private:
  AdamOptions o_;
  int64_t t_ = 0;
  NamedTensors m_, v_;
};

// torch.nn.utils.clip_grad_norm_: the total 2-norm of every gradient together; when it
// exceeds max_norm, every gradient is scaled in place by max_norm / (norm + 1e-6).
// Returns the norm before clipping. Written into each gradient's storage (every handle of it
// sees the clipped values); ValueError for a read-only gradient, before any is written.
double clip_grad_norm(NamedTensors& grads, double max_norm);

}  // namespace qkv::nn
