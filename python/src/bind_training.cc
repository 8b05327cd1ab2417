// qkv._qkv.nn's training half: optimizers, losses (qkv/nn/optim.h, qkv/nn/losses.h) and
// Keras' saved Adam state (qkv/nn/keras_optimizer.h).
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "interrupt.h"
#include "qkv/io_keras.h"
#include "qkv/nn/keras_optimizer.h"
#include "qkv/nn/losses.h"
#include "qkv/nn/optim.h"
#include "tensor_convert.h"

namespace nb = nanobind;
using qkv::Tensor;
using qkv::python::to_dict;
using qkv::python::to_numpy;
using qkv::python::to_tensor;
using qkv::python::to_tensor_map;

namespace {

qkv::nn::Convention convention_arg(const std::string& name, const char* op) {
  if (name == "torch") return qkv::nn::Convention::torch;
  if (name == "keras") return qkv::nn::Convention::keras;
  throw nb::value_error((std::string(op) + ": convention must be 'torch' or 'keras', got '" + name + "'").c_str());
}

// Functional steps: the parameters are copied, stepped and returned (an in-place update of a
// NumPy array could be lost silently where the binding reads a copy, e.g. a misaligned one).
// Each comes back in its own dtype, as torch keeps a parameter's: float16 and bfloat16 step in
// float32 and are rounded back (they came back as float32 copies, as float64 ones once did);
// integer and bool parameters are a TypeError (the C++ step's DTypeError: torch trains only
// floating point tensors; they were stepped as float32 copies).
template <class Opt>
nb::dict step_copy(Opt& opt, nb::handle params, nb::handle grads, const char* op) {
  std::map<std::string, Tensor> p = to_tensor_map(params, (std::string(op) + ".step: params").c_str());
  for (auto& [name, t] : p) t = t.contiguous().clone();
  const std::map<std::string, Tensor> g = to_tensor_map(grads, (std::string(op) + ".step: grads").c_str());
  {
    qkv::python::InterruptibleRelease release;
    opt.step(p, g);
  }
  return to_dict(p);
}

nb::tuple loss_tuple(const qkv::nn::LossResult& r) { return nb::make_tuple(r.loss, to_numpy(r.grad)); }

// qkv.nn._keras_adam_state(path, [(keras path, name), ...]) -> (state, iterations, learning_rate)
void bind_keras_adam_state(nb::module_& nn) {
  nn.def(
      "_keras_adam_state",
      [](const std::string& path, const std::vector<std::pair<std::string, std::string>>& variables) {
        std::vector<qkv::nn::KerasVariable> vars;
        for (const auto& [keras_path, name] : variables) vars.push_back({keras_path, name});
        qkv::nn::KerasAdamState s;
        {
          qkv::python::InterruptibleRelease release;
          s = qkv::nn::keras_adam_state(qkv::io::load_weights(path), vars, path);
        }
        return nb::make_tuple(to_dict(s.state), s.iterations,
                              s.learning_rate ? nb::cast(*s.learning_rate) : nb::none());
      },
      nb::arg("path"), nb::arg("variables"));
}

}  // namespace

void bind_training(nb::module_& nn) {
  nb::class_<qkv::nn::Adam>(nn, "Adam")
      .def(
          "__init__",
          [](qkv::nn::Adam* self, double lr, std::pair<double, double> betas, double eps, double weight_decay,
             bool decoupled_weight_decay, const std::string& convention) {
            qkv::nn::AdamOptions o;
            o.lr = lr, o.beta1 = betas.first, o.beta2 = betas.second, o.eps = eps, o.weight_decay = weight_decay;
            o.decoupled_weight_decay = decoupled_weight_decay;
            o.convention = convention_arg(convention, "Adam");
            new (self) qkv::nn::Adam(o);
          },
          nb::arg("lr") = 1e-3, nb::arg("betas") = std::make_pair(0.9, 0.999), nb::arg("eps") = 1e-8,
          nb::arg("weight_decay") = 0.0, nb::arg("decoupled_weight_decay") = false, nb::arg("convention") = "torch")
      .def(
          "step",
          [](qkv::nn::Adam& a, nb::handle params, nb::handle grads) { return step_copy(a, params, grads, "Adam"); },
          nb::arg("params"), nb::arg("grads"),
          "One Adam step: returns the updated copies of params ({name: array}) from grads.")
      .def_prop_ro("steps", &qkv::nn::Adam::steps)
      .def(
          "state", [](const qkv::nn::Adam& a) { return to_dict(a.state()); },
          "The moment estimates {'m/<name>': array, 'v/<name>': array} (save them with qkv.save).")
      .def(
          "load_state",
          [](qkv::nn::Adam& a, nb::handle state, int64_t steps) {
            a.load_state(to_tensor_map(state, "Adam.load_state: state"), steps);
          },
          nb::arg("state"), nb::arg("steps"), "Restores state() and the step count (resuming a run).");
  bind_keras_adam_state(nn);
  nb::class_<qkv::nn::Sgd>(nn, "SGD")
      .def(
          "__init__",
          [](qkv::nn::Sgd* self, double lr, double momentum, double dampening, double weight_decay, bool nesterov,
             const std::string& convention) {
            qkv::nn::SgdOptions o;
            o.lr = lr, o.momentum = momentum, o.dampening = dampening, o.weight_decay = weight_decay;
            o.nesterov = nesterov;
            o.convention = convention_arg(convention, "SGD");
            new (self) qkv::nn::Sgd(o);
          },
          nb::arg("lr") = 0.01, nb::arg("momentum") = 0.0, nb::arg("dampening") = 0.0, nb::arg("weight_decay") = 0.0,
          nb::arg("nesterov") = false, nb::arg("convention") = "torch")
      .def(
          "step",
          [](qkv::nn::Sgd& s, nb::handle params, nb::handle grads) { return step_copy(s, params, grads, "SGD"); },
          nb::arg("params"), nb::arg("grads"),
          "One SGD step: returns the updated copies of params ({name: array}) from grads.");
  nn.def(
      "binary_cross_entropy_with_logits",
      [](nb::handle x, nb::handle y) {
        return loss_tuple(
            qkv::nn::binary_cross_entropy_with_logits(to_tensor(x, "binary_cross_entropy_with_logits: input"),
                                                      to_tensor(y, "binary_cross_entropy_with_logits: target")));
      },
      nb::arg("input"), nb::arg("target"), "(mean loss, d loss / d input), PyTorch's definition.");
  nn.def(
      "cross_entropy",
      [](nb::handle x, nb::handle y, int64_t ignore_index) {
        return loss_tuple(qkv::nn::cross_entropy(to_tensor(x, "cross_entropy: input"),
                                                 to_tensor(y, "cross_entropy: target"), ignore_index));
      },
      nb::arg("input"), nb::arg("target"), nb::arg("ignore_index") = -100,
      "(mean loss, d loss / d input) for logits [N, C] and classes [N]; rows whose class is ignore_index\n"
      "(torch's default -100, Hugging Face's label padding) count in neither the sum nor the mean.");
  nn.def(
      "mse_loss",
      [](nb::handle x, nb::handle y) {
        return loss_tuple(qkv::nn::mse_loss(to_tensor(x, "mse_loss: input"), to_tensor(y, "mse_loss: target")));
      },
      nb::arg("input"), nb::arg("target"), "(mean loss, d loss / d input).");
}
