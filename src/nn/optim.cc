// qkv::nn optimizers (qkv/nn/optim.h): PyTorch's and Keras 3's update rules, written in
// the parameter's type (float32 or float64; float16 and bfloat16 in float32) in the order the frameworks compute them
// (torch.optim.SGD/Adam/AdamW's single-tensor paths; keras.optimizers' update_step), so that steps agree to rounding.
#include "qkv/nn/optim.h"

#include <cmath>
#include <tuple>
#include <utility>
#include <vector>

#include "qkv/error.h"

namespace qkv::nn {

namespace {

// A parameter, the tensor its step writes (`work`) and its gradient in work's dtype (checked:
// present, same shape, a contiguous floating point parameter). float32 and float64 parameters
// step in place in their own dtype, as torch's; float16 and bfloat16 ones step a float32 copy
// (state float32 too) that is rounded back into the parameter after the step (torch steps them
// in their dtype, each operation computed in float32). Integer and bool parameters are refused:
// torch trains only floating point tensors (only they can require gradients).
struct Pair {
  Tensor* param;
  Tensor work;
  Tensor grad;
};

bool is_half(DType d) { return d == DType::f16 || d == DType::bf16; }

Pair pair_of(const char* op, const std::string& name, Tensor& param, const NamedTensors& grads) {
  const auto it = grads.find(name);
  if (it == grads.end()) fail<ValueError>(op, ".step: no gradient for parameter '", name, "'");
  if (it->second.shape() != param.shape()) {
    fail<ShapeError>(op, ".step: gradient of '", name, "' has shape ", shape_str(it->second.shape()),
                     ", the parameter ", shape_str(param.shape()));
  }
  const DType d = param.dtype();
  if (d != DType::f32 && d != DType::f64 && !is_half(d)) {
    fail<DTypeError>(op, ".step: parameter '", name, "' is ", dtype_name(d),
                     "; only floating point parameters (float32, float64, float16, bfloat16) are trained, as "
                     "torch's optimizers train only tensors that can require gradients");
  }
  if (!param.is_contiguous())
    fail<ValueError>(op, ".step: parameter '", name, "' must be contiguous (updated in place)");
  if (param.is_read_only()) fail<ValueError>(op, ".step: parameter '", name, "' is read-only (updated in place)");
  Tensor work = is_half(d) ? param.to(DType::f32).contiguous().clone() : param;
  Tensor grad = it->second.to(work.dtype()).contiguous();
  return {&param, std::move(work), std::move(grad)};
}

// A float16 / bfloat16 parameter's stepped float32 copy, rounded back into it.
void write_back(const Pair& x) {
  if (is_half(x.param->dtype())) x.param->copy_from(x.work);
}

// Every parameter's pair, all checked before any parameter is written: a missing or misshapen
// gradient leaves the parameters, the state and the step count as they were.
std::vector<Pair> pairs_of(const char* op, NamedTensors& params, const NamedTensors& grads) {
  std::vector<Pair> pairs;
  pairs.reserve(params.size());
  for (auto& [name, param] : params) pairs.push_back(pair_of(op, name, param, grads));
  return pairs;
}

// A state buffer of `state` (kept or loaded) must have its parameter's shape: the step walks
// the parameter's elements through it.
void check_state(const char* op, const NamedTensors& state, const char* prefix, const NamedTensors& params) {
  for (const auto& [name, param] : params) {
    const auto it = state.find(name);
    if (it != state.end() && it->second.shape() != param.shape()) {
      fail<ShapeError>(op, ".step: state '", prefix, name, "' has shape ", shape_str(it->second.shape()),
                       ", the parameter ", shape_str(param.shape()), " (state of another model?)");
    }
  }
}

// The state buffer `name` of `state` in the parameter's dtype (zeros of its shape on first use;
// a loaded buffer of another dtype converted, as torch's load_state_dict casts to the parameter's).
template <class T>
T* buffer(NamedTensors& state, const std::string& name, const Tensor& like, bool* fresh = nullptr) {
  auto it = state.find(name);
  if (fresh) *fresh = it == state.end();
  if (it == state.end()) {
    it = state.emplace(name, Tensor::zeros(like.shape(), like.dtype())).first;
  } else if (it->second.dtype() != like.dtype()) {
    it->second = it->second.to(like.dtype()).contiguous();
  }
  return it->second.data<T>();
}

template <class T>
void sgd_update(const SgdOptions& o, T* p, const T* g, T* buf, bool fresh, int64_t n) {
  const auto lr = static_cast<T>(o.lr), mu = static_cast<T>(o.momentum);
  const auto wd = static_cast<T>(o.weight_decay), damp = static_cast<T>(1.0 - o.dampening);
  for (int64_t i = 0; i < n; ++i) {
    if (o.convention == Convention::keras) {
      if (wd != T(0)) p[i] -= p[i] * wd * lr;  // keras' _apply_weight_decay, before the step
      if (!buf) {
        p[i] -= g[i] * lr;
        continue;
      }
      buf[i] = buf[i] * mu - g[i] * lr;
      p[i] += o.nesterov ? buf[i] * mu - g[i] * lr : buf[i];
      continue;
    }
    T d = wd != T(0) ? g[i] + wd * p[i] : g[i];  // torch: L2 in the gradient
    if (buf) {
      buf[i] = fresh ? d : buf[i] * mu + damp * d;
      d = o.nesterov ? d + mu * buf[i] : buf[i];
    }
    p[i] += -lr * d;
  }
}

template <class T>
void adam_update(const AdamOptions& o, int64_t t, T* p, const T* g, T* m, T* v, int64_t n) {
  const auto b1 = static_cast<T>(o.beta1), b2 = static_cast<T>(o.beta2);
  const auto lr = static_cast<T>(o.lr), wd = static_cast<T>(o.weight_decay), eps = static_cast<T>(o.eps);
  const bool keras = o.convention == Convention::keras, decoupled = keras || o.decoupled_weight_decay;
  // torch: bias corrections in double (Python floats), step size lr / bc1, denominator
  // sqrt(v) / sqrt(bc2) + eps. keras: alpha = lr sqrt(1 - b2^t) / (1 - b1^t) in the variable's type.
  const double bc1 = 1.0 - std::pow(o.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(o.beta2, static_cast<double>(t));
  const auto step_size = static_cast<T>(o.lr / bc1), bc2_sqrt = static_cast<T>(std::sqrt(bc2));
  const auto tf = static_cast<T>(t);
  const T alpha = lr * std::sqrt(T(1) - std::pow(b2, tf)) / (T(1) - std::pow(b1, tf));
  for (int64_t i = 0; i < n; ++i) {
    if (decoupled && wd != T(0)) p[i] = keras ? p[i] - p[i] * wd * lr : p[i] * (T(1) - lr * wd);  // AdamW / keras
    const T gi = !decoupled && wd != T(0) ? g[i] + wd * p[i] : g[i];                              // torch Adam: L2
    if (keras) {
      m[i] += (gi - m[i]) * (T(1) - b1);
      v[i] += (gi * gi - v[i]) * (T(1) - b2);
      p[i] -= m[i] * alpha / (std::sqrt(v[i]) + eps);
    } else {
      m[i] += (T(1) - b1) * (gi - m[i]);  // torch's lerp
      v[i] = v[i] * b2 + (T(1) - b2) * gi * gi;
      p[i] += -step_size * (m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps));
    }
  }
}

void check_nonnegative(const char* op, const char* what, double x) {
  if (!(x >= 0.0) || !std::isfinite(x)) fail<ValueError>(op, ": ", what, " must be finite and >= 0, got ", x);
}

}  // namespace

Sgd::Sgd(const SgdOptions& options) : o_(options) {
  check_nonnegative("SGD", "lr", o_.lr);
  check_nonnegative("SGD", "momentum", o_.momentum);
  check_nonnegative("SGD", "weight_decay", o_.weight_decay);
  if (o_.convention == Convention::keras) {
    // keras.optimizers.SGD: "`momentum` must be a float between [0, 1]"; it has no dampening (one
    // set here was ignored without a word), and nesterov without momentum is its plain step
    // (Keras 3.15.1 takes it; the torch rule below refused it).
    if (o_.momentum > 1.0) fail<ValueError>("SGD: momentum must be in [0, 1] (Keras), got ", o_.momentum);
    if (o_.dampening != 0.0) fail<ValueError>("SGD: Keras' SGD has no dampening, got ", o_.dampening);
    return;
  }
  // torch.optim.SGD refuses both: "Nesterov momentum requires a momentum and zero dampening".
  if (o_.nesterov && (o_.momentum == 0.0 || o_.dampening != 0.0)) {
    fail<ValueError>("SGD: nesterov needs a momentum and zero dampening, got momentum ", o_.momentum, " and dampening ",
                     o_.dampening);
  }
}

void Sgd::step(NamedTensors& params, const NamedTensors& grads) {
  const std::vector<Pair> pairs = pairs_of("SGD", params, grads);
  check_state("SGD", momentum_, "momentum/", params);
  size_t k = 0;
  for (const auto& [name, param] : params) {
    const Pair& x = pairs[k++];
    bool fresh = false;
    const bool has_buf = o_.momentum != 0.0;
    if (x.work.dtype() == DType::f64) {
      double* buf = has_buf ? buffer<double>(momentum_, name, x.work, &fresh) : nullptr;
      sgd_update(o_, x.work.data<double>(), x.grad.data<double>(), buf, fresh, param.numel());
    } else {
      float* buf = has_buf ? buffer<float>(momentum_, name, x.work, &fresh) : nullptr;
      sgd_update(o_, x.work.data<float>(), x.grad.data<float>(), buf, fresh, param.numel());
    }
    write_back(x);
  }
}

Adam::Adam(const AdamOptions& options) : o_(options) {
  check_nonnegative("Adam", "lr", o_.lr);
  check_nonnegative("Adam", "weight_decay", o_.weight_decay);
  check_nonnegative("Adam", "eps", o_.eps);
  if (!(o_.beta1 >= 0.0 && o_.beta1 < 1.0) || !(o_.beta2 >= 0.0 && o_.beta2 < 1.0)) {
    fail<ValueError>("Adam: betas must be in [0, 1), got ", o_.beta1, ", ", o_.beta2);
  }
}

void Adam::step(NamedTensors& params, const NamedTensors& grads) {
  const std::vector<Pair> pairs = pairs_of("Adam", params, grads);
  check_state("Adam", m_, "m/", params);
  check_state("Adam", v_, "v/", params);
  ++t_;
  size_t k = 0;
  for (const auto& [name, param] : params) {
    const Pair& x = pairs[k++];
    if (x.work.dtype() == DType::f64) {
      adam_update(o_, t_, x.work.data<double>(), x.grad.data<double>(), buffer<double>(m_, name, x.work),
                  buffer<double>(v_, name, x.work), param.numel());
    } else {
      adam_update(o_, t_, x.work.data<float>(), x.grad.data<float>(), buffer<float>(m_, name, x.work),
                  buffer<float>(v_, name, x.work), param.numel());
    }
    write_back(x);
  }
}

NamedTensors Adam::state() const {
  NamedTensors s;
  for (const auto& [name, t] : m_) s.emplace("m/" + name, t.clone());
  for (const auto& [name, t] : v_) s.emplace("v/" + name, t.clone());
  return s;
}

void Adam::load_state(const NamedTensors& state, int64_t steps) {
  if (steps < 0) fail<ValueError>("Adam.load_state: steps must be >= 0, got ", steps);
  NamedTensors m, v;
  for (const auto& [key, t] : state) {
    const bool is_m = key.rfind("m/", 0) == 0, is_v = key.rfind("v/", 0) == 0;
    if (!is_m && !is_v) fail<ValueError>("Adam.load_state: unknown key '", key, "' (expected m/<name> or v/<name>)");
    // float64 moments stay float64 (a float64 run's); each is cast to its parameter's dtype at the step
    (is_m ? m : v).emplace(key.substr(2), t.to(t.dtype() == DType::f64 ? DType::f64 : DType::f32).contiguous().clone());
  }
  // Each parameter's two moments come together: an m without its v stepped from v = 0, which
  // moves an element whose gradient is 0 by lr m / eps (1e5 lr for m = 1e-3).
  for (const auto& [one, other, have, lack] : {std::tuple{&m, &v, "m/", "v/"}, std::tuple{&v, &m, "v/", "m/"}}) {
    for (const auto& [name, t] : *one) {
      if (!other->count(name)) {
        fail<ValueError>("Adam.load_state: '", have, name, "' has no '", lack, name,
                         "' (each parameter's state is both moments)");
      }
      if (other->at(name).shape() != t.shape()) {
        fail<ShapeError>("Adam.load_state: '", have, name, "' ", shape_str(t.shape()), " and '", lack, name, "' ",
                         shape_str(other->at(name).shape()), " differ");
      }
    }
  }
  m_ = std::move(m), v_ = std::move(v), t_ = steps;
}

double clip_grad_norm(NamedTensors& grads, double max_norm) {
  double sum = 0.0;
  for (auto& [name, g] : grads) {
    for (double x : g.to_vector<double>()) sum += x * x;
  }
  const double norm = std::sqrt(sum);
  const double scale = max_norm / (norm + 1e-6);
  if (scale >= 1.0) return norm;
  for (const auto& [name, g] : grads) {
    if (g.is_read_only()) fail<ValueError>("clip_grad_norm: gradient '", name, "' is read-only (scaled in place)");
  }
  // Written back into each gradient's own storage (copy_from), as torch's mul_: every handle
  // of it sees the clipped values, not only this map's entry. float64 scaled in float64.
  for (auto& [name, g] : grads) {
    if (g.dtype() == DType::f64) {
      Tensor d = g.contiguous().clone();
      double* x = d.data<double>();
      for (int64_t i = 0; i < d.numel(); ++i) x[i] *= scale;
      g.copy_from(d);
      continue;
    }
    Tensor f = g.to(DType::f32).contiguous().clone();
    float* x = f.data<float>();
    for (int64_t i = 0; i < f.numel(); ++i) x[i] *= static_cast<float>(scale);
    g.copy_from(f);
  }
  return norm;
}

}  // namespace qkv::nn
