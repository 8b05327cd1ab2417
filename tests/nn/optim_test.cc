// qkv::nn optimizers and losses against PyTorch and Keras 3 (tests/fixtures/optim, from
// tests/nn/make_optim_fixtures.py: torch.optim / keras.optimizers stepping the same float32
// parameters with the same gradients for 5 steps; torch autograd for the losses).
// Criterion: every step's parameters within 2e-6 of the parameter's scale (float32
// arithmetic in the same order; the frameworks' vectorised kernels may round differently).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "common/expect.h"
#include "common/sdpa_fixtures.h"
#include "qkv/io_tensor_files.h"
#include "qkv/nn/losses.h"
#include "qkv/nn/optim.h"

#include <nlohmann/json.hpp>

namespace qkv::nn {
namespace {

double max_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0.0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

// One fixture's optimizer, built from its recorded arguments.
struct Stepper {
  std::optional<Sgd> sgd;
  std::optional<Adam> adam;
  void step(NamedTensors& p, const NamedTensors& g) { sgd ? sgd->step(p, g) : adam->step(p, g); }
};

Stepper make_stepper(const nlohmann::json& o) {
  const bool keras = o.at("framework") == "keras";
  const std::string kind = o.at("optimizer");
  const nlohmann::json& a = o.at("args");
  Stepper s;
  if (kind == "SGD") {
    SgdOptions so;
    so.convention = keras ? Convention::keras : Convention::torch;
    so.lr = a.value(keras ? "learning_rate" : "lr", 0.01);
    so.momentum = a.value("momentum", 0.0);
    so.dampening = a.value("dampening", 0.0);
    so.weight_decay = a.value("weight_decay", 0.0);
    so.nesterov = a.value("nesterov", false);
    s.sgd.emplace(so);
    return s;
  }
  AdamOptions ao;
  ao.convention = keras ? Convention::keras : Convention::torch;
  ao.lr = a.value(keras ? "learning_rate" : "lr", 1e-3);
  if (keras) {
    ao.beta1 = a.value("beta_1", 0.9), ao.beta2 = a.value("beta_2", 0.999), ao.eps = a.value("epsilon", 1e-7);
    ao.weight_decay = kind == "AdamW" ? a.value("weight_decay", 0.004) : 0.0;  // keras AdamW's default 0.004
  } else {
    if (a.contains("betas")) ao.beta1 = a.at("betas")[0], ao.beta2 = a.at("betas")[1];
    ao.eps = a.value("eps", 1e-8);
    ao.weight_decay = a.value("weight_decay", kind == "AdamW" ? 0.01 : 0.0);
    ao.decoupled_weight_decay = kind == "AdamW";
  }
  s.adam.emplace(ao);
  return s;
}

TEST(Optimizers, MatchTorchAndKerasStepByStep) {
  const auto files = sdpa_fixtures::fixture_files(sdpa_fixtures::fixture_dir("optim"));
  int checked = 0;
  for (const auto& path : files) {
    if (path.stem() == "losses") continue;
    const io::SafetensorsFile f = io::load_safetensors(path);
    const nlohmann::json o = nlohmann::json::parse(f.metadata.at("options"));
    Stepper opt = make_stepper(o);
    NamedTensors params{{"w", f.tensors.at("w0").clone()}, {"b", f.tensors.at("b0").clone()}};
    const Tensor &gw = f.tensors.at("gw"), &gb = f.tensors.at("gb"), &ws = f.tensors.at("w"), &bs = f.tensors.at("b");
    // torch steps float64 parameters in float64 (*_f64: 1.4e-7 and 1.7e-7 from the float32 runs by
    // step 5); the steps of a float32 copy would miss 1e-12 from the first.
    const DType dtype = f.tensors.at("w0").dtype();
    const double tol = dtype == DType::f64 ? 1e-12 : 2e-6;
    for (int64_t t = 0; t < gw.size(0); ++t) {
      opt.step(params, {{"w", gw.select(0, t)}, {"b", gb.select(0, t)}});
      EXPECT_EQ(params.at("w").dtype(), dtype) << path.stem();
      EXPECT_LE(max_diff(params.at("w"), ws.select(0, t)), tol) << path.stem() << " step " << t + 1;
      EXPECT_LE(max_diff(params.at("b"), bs.select(0, t)), tol) << path.stem() << " step " << t + 1;
    }
    checked += dtype == DType::f64 ? 100 : 1;
  }
  EXPECT_EQ(checked, 13 + 2 * 100);  // 13 float32 fixtures, 2 float64
}

// float64 parameters keep float64 state (torch's exp_avg / momentum_buffer have the parameter's
// dtype); state loaded in another dtype is cast to the parameter's at the step, as torch's
// load_state_dict casts it; other dtypes are refused, naming the parameter and its dtype.
TEST(Optimizers, Float64ParametersKeepFloat64State) {
  Adam a(AdamOptions{.lr = 0.1});
  NamedTensors p{{"w", Tensor::randn({3}, 1).to(DType::f64)}};
  const NamedTensors g{{"w", Tensor::randn({3}, 2).to(DType::f64)}};
  a.step(p, g);
  EXPECT_EQ(p.at("w").dtype(), DType::f64);
  EXPECT_EQ(a.state().at("m/w").dtype(), DType::f64);
  Adam b(AdamOptions{.lr = 0.1});  // resumed from a's float64 state: the same steps, bit for bit
  b.load_state(a.state(), a.steps());
  NamedTensors q{{"w", p.at("w").clone()}};
  a.step(p, g), b.step(q, g);
  EXPECT_EQ(max_diff(p.at("w"), q.at("w")), 0.0);
  EXPECT_EQ(b.state().at("v/w").dtype(), DType::f64);
  NamedTensors f{{"w", p.at("w").to(DType::f32)}};  // float32 parameters take the float64 state as float32
  b.step(f, g);
  EXPECT_EQ(b.state().at("m/w").dtype(), DType::f32);
  EXPECT_LE(max_diff(f.at("w"), q.at("w")), 0.2);  // one more step of about lr
  Sgd s(SgdOptions{.lr = 0.1, .momentum = 0.9});
  s.step(p, g);
  EXPECT_EQ(s.state().at("w").dtype(), DType::f64);
  NamedTensors h{{"w", Tensor::zeros({3}, DType::i32)}};
  EXPECT_THROW_WITH(s.step(h, g), DTypeError,
                    "SGD.step: parameter 'w' is int32; only floating point parameters (float32, float64, float16, "
                    "bfloat16) are trained");
}

// A float64 reference of torch's SGD (momentum, dampening, nesterov, L2) and Adam / AdamW rules,
// state in float64, stepping the parameter's stored (rounded) values.
struct Reference {
  bool adam = false;
  SgdOptions s;
  AdamOptions a;
  int64_t t = 0;
  std::vector<double> m, v;
  std::vector<double> step(std::vector<double> p, const std::vector<double>& g) {
    const bool fresh = m.empty();
    if (fresh) m.assign(p.size(), 0.0), v.assign(p.size(), 0.0);
    ++t;
    for (size_t i = 0; i < p.size(); ++i) {
      if (!adam) {
        double d = g[i] + s.weight_decay * p[i];
        m[i] = fresh ? d : s.momentum * m[i] + (1.0 - s.dampening) * d;
        d = s.nesterov ? d + s.momentum * m[i] : m[i];
        p[i] -= s.lr * d;
        continue;
      }
      if (a.decoupled_weight_decay) p[i] *= 1.0 - a.lr * a.weight_decay;
      const double gi = a.decoupled_weight_decay ? g[i] : g[i] + a.weight_decay * p[i];
      m[i] = a.beta1 * m[i] + (1.0 - a.beta1) * gi;
      v[i] = a.beta2 * v[i] + (1.0 - a.beta2) * gi * gi;
      const double bc1 = 1.0 - std::pow(a.beta1, t), bc2 = 1.0 - std::pow(a.beta2, t);
      p[i] -= a.lr / bc1 * m[i] / (std::sqrt(v[i]) / std::sqrt(bc2) + a.eps);
    }
    return p;
  }
};

// float16 and bfloat16 parameters step in their own dtype (torch's behaviour; they were refused
// here, and Python's step returned float32 copies): the math in float32, each step's result
// rounded to the nearest value of the dtype. So every stored value is within half a unit in the
// last place (plus float32's slack, far below it) of the float64 rule applied to the stored
// values before the step.
TEST(Optimizers, HalfParametersStepInTheirDtypeRoundedToNearest) {
  const auto half_ulp = [](double x, DType d) {  // half the spacing of d's values at |x|
    const int mantissa = d == DType::f16 ? 10 : 7;
    const double ax = std::max(std::fabs(x), d == DType::f16 ? 6.103515625e-05 : 1.1754943508222875e-38);
    return std::ldexp(1.0, std::ilogb(ax) - mantissa) / 2;
  };
  for (const DType dtype : {DType::f16, DType::bf16}) {
    for (int kind = 0; kind < 3; ++kind) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (kind == 0 ? " SGD" : kind == 1 ? " Adam" : " AdamW"));
      Reference ref;
      ref.adam = kind > 0;
      ref.s = SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.01, .nesterov = true};
      ref.a = AdamOptions{.lr = 0.01, .beta1 = 0.8, .beta2 = 0.95, .eps = 1e-6, .weight_decay = 0.01};
      ref.a.decoupled_weight_decay = kind == 2;
      Stepper opt;
      if (kind == 0) opt.sgd.emplace(ref.s);
      if (kind > 0) opt.adam.emplace(ref.a);
      NamedTensors p{{"w", Tensor::randn({64}, 1).to(dtype)}};
      const Tensor storage = p.at("w");  // updated in place: this handle sees every step
      for (int step = 0; step < 5; ++step) {
        const Tensor g = Tensor::randn({64}, 10 + static_cast<uint64_t>(step));
        const std::vector<double> want = ref.step(p.at("w").to_vector<double>(), g.to_vector<double>());
        opt.step(p, {{"w", g}});
        ASSERT_EQ(p.at("w").dtype(), dtype);
        const std::vector<double> got = storage.to_vector<double>();
        for (size_t i = 0; i < got.size(); ++i) {
          EXPECT_LE(std::fabs(got[i] - want[i]),
                    half_ulp(std::min(std::fabs(got[i]), std::fabs(want[i])), dtype) * 1.001)
              << "step " << step + 1 << " element " << i << ": " << got[i] << " want " << want[i];
        }
      }
    }
  }
}

// keras.optimizers.SGD (3.15.1, checked live) takes nesterov=True without momentum (its plain step:
// 1 - 0.1 * 0.5 = 0.95) and refuses a momentum past 1; it has no dampening. qkv applied torch's
// rule to both conventions: it refused the first and took the others (dampening then ignored).
TEST(Optimizers, KerasSgdTakesKerasArguments) {
  const io::SafetensorsFile f = io::load_safetensors(sdpa_fixtures::fixture_dir("optim") / "keras_sgd.safetensors");
  Sgd opt(SgdOptions{.lr = 0.1, .nesterov = true, .convention = Convention::keras});  // keras_sgd: lr 0.1, plain
  NamedTensors params{{"w", f.tensors.at("w0").clone()}};
  for (int64_t t = 0; t < f.tensors.at("gw").size(0); ++t) {
    opt.step(params, {{"w", f.tensors.at("gw").select(0, t)}});
    EXPECT_LE(max_diff(params.at("w"), f.tensors.at("w").select(0, t)), 2e-6) << "step " << t + 1;
  }
  EXPECT_THROW_WITH(Sgd(SgdOptions{.momentum = 1.5, .convention = Convention::keras}), ValueError,
                    "SGD: momentum must be in [0, 1] (Keras), got 1.5");
  EXPECT_THROW_WITH(Sgd(SgdOptions{.momentum = 0.9, .dampening = 0.1, .convention = Convention::keras}), ValueError,
                    "SGD: Keras' SGD has no dampening");
  EXPECT_NO_THROW(Sgd(SgdOptions{.momentum = 1.5}));  // torch takes it
}

TEST(Optimizers, AdamStateRoundTripsAndBadInputsAreErrors) {
  AdamOptions ao;
  ao.lr = 0.1;
  Adam a(ao), b(ao);
  NamedTensors p1{{"w", Tensor::randn({3, 2}, 1)}}, p2{{"w", p1.at("w").clone()}};
  const NamedTensors g{{"w", Tensor::randn({3, 2}, 2)}};
  a.step(p1, g);
  b.load_state(a.state(), a.steps());
  p2.at("w").copy_from(p1.at("w"));
  a.step(p1, g);
  b.step(p2, g);
  EXPECT_EQ(max_diff(p1.at("w"), p2.at("w")), 0.0);
  NamedTensors missing{{"w", Tensor::randn({3, 2}, 1)}, {"b", Tensor::randn({2}, 1)}};
  EXPECT_THROW(a.step(missing, g), ValueError);                             // no gradient for "b"
  EXPECT_THROW(a.step(p1, {{"w", Tensor::randn({2, 3}, 3)}}), ShapeError);  // wrong shape
  EXPECT_THROW(Adam(AdamOptions{.beta1 = 1.0}), ValueError);
  std::vector<float> frozen(6, 1.0f);  // a read-only view is never written
  NamedTensors ro{{"w", Tensor::from_blob(frozen.data(), {3, 2}, DType::f32, {2, 1}, nullptr, true)}};
  EXPECT_THROW(a.step(ro, g), ValueError);
  EXPECT_EQ(frozen, std::vector<float>(6, 1.0f));
  EXPECT_THROW(Sgd(SgdOptions{.nesterov = true}), ValueError);
  // torch/optim/sgd.py: nesterov and (momentum <= 0 or dampening != 0) is a ValueError.
  EXPECT_THROW_WITH(Sgd(SgdOptions{.momentum = 0.9, .dampening = 0.1, .nesterov = true}), ValueError,
                    "SGD: nesterov needs a momentum and zero dampening, got momentum 0.9 and dampening 0.1");
}

// A failed step writes nothing: neither the parameters before the bad one, nor the step count;
// and state of another shape (loaded for another model) is refused, not walked past its end.
TEST(Optimizers, AFailedStepChangesNothingAndMisshapenStateIsRefused) {
  Adam a(AdamOptions{.lr = 0.1});
  const Tensor w0 = Tensor::randn({3, 2}, 1);
  NamedTensors p{{"a", w0.clone()}, {"b", Tensor::randn({2}, 2)}};
  EXPECT_THROW(a.step(p, {{"a", Tensor::randn({3, 2}, 3)}}), ValueError);  // no gradient for "b"
  EXPECT_EQ(a.steps(), 0);
  EXPECT_EQ(max_diff(p.at("a"), w0), 0.0);
  EXPECT_TRUE(a.state().empty());
  Sgd s(SgdOptions{.lr = 0.1, .momentum = 0.9});
  EXPECT_THROW(s.step(p, {{"a", Tensor::randn({3, 2}, 3)}}), ValueError);
  EXPECT_EQ(max_diff(p.at("a"), w0), 0.0);
  EXPECT_TRUE(s.state().empty());

  NamedTensors w{{"w", Tensor::randn({4}, 4)}};
  const NamedTensors g{{"w", Tensor::randn({4}, 5)}};
  a.load_state({{"m/w", Tensor::zeros({1})}, {"v/w", Tensor::zeros({1})}}, 1);
  EXPECT_THROW(a.step(w, g), ShapeError);
  EXPECT_EQ(a.steps(), 1);
  // moments of two shapes are refused as they load (the step refused them before)
  EXPECT_THROW(a.load_state({{"m/w", Tensor::zeros({4})}, {"v/w", Tensor::zeros({2, 2})}}, 1), ShapeError);
  EXPECT_THROW(a.step(w, g), ShapeError);  // the [1] state loaded above is still there
  s.step(w, g);                            // momentum buffer [4]; the same name with another shape is refused
  NamedTensors w2{{"w", Tensor::randn({8}, 6)}};
  EXPECT_THROW(s.step(w2, {{"w", Tensor::randn({8}, 7)}}), ShapeError);
}

// An m without its v (or a v without its m) loaded and stepped from a zero second moment: where
// that step's gradient is 0 (an attention layer's key bias has exactly 0 gradient) the parameter
// moved by lr m / eps, here 0.1 * 1e-2 / 1e-8 = 1e5 (torch's Adam keeps exp_avg and exp_avg_sq
// together and fails on a state without either). Refused at load now, the optimizer as it was.
TEST(Optimizers, AdamStateNeedsBothMomentsOfEachParameter) {
  Adam a(AdamOptions{.lr = 0.1});
  NamedTensors w{{"w", Tensor::zeros({4})}};
  const NamedTensors g{{"w", Tensor::full({4}, 1e-2)}};
  a.step(w, g);
  const NamedTensors before = a.state();
  EXPECT_THROW_WITH(a.load_state({{"m/w", Tensor::full({4}, 1e-2)}}, 5), ValueError,
                    "Adam.load_state: 'm/w' has no 'v/w'");
  EXPECT_THROW_WITH(a.load_state({{"v/w", Tensor::full({4}, 1e-4)}, {"m/b", Tensor::zeros({2})}}, 5), ValueError,
                    "has no");
  EXPECT_EQ(a.steps(), 1);
  EXPECT_EQ(a.state().size(), before.size());
  EXPECT_EQ(max_diff(a.state().at("v/w"), before.at("v/w")), 0.0);
  a.load_state({{"m/w", Tensor::full({4}, 1e-2)}, {"v/w", Tensor::full({4}, 1e-4)}}, 5);
  NamedTensors p{{"w", Tensor::zeros({4})}};
  a.step(p, {{"w", Tensor::zeros({4})}});
  EXPECT_LT(std::fabs(p.at("w").to_vector<double>()[0]), 1.0);  // a step of about lr, not 1e5
}

// clip_grad_norm scales each gradient in its own storage (the doc's "in place", torch's mul_):
// it replaced the map's entry with a new tensor, so the caller's handle of the gradient
// buffer kept the unclipped values. float64 gradients are scaled in float64.
TEST(Optimizers, ClipGradNormWritesIntoTheGradientsStorage) {
  const Tensor buf = Tensor::full({4}, 1.0);  // norm 2; with big's sqrt(3), sqrt(7)
  const Tensor big = Tensor::from_vector(std::vector<double>{std::sqrt(3.0)}, {1});
  NamedTensors grads{{"w", buf}, {"b", big}};
  const double norm = clip_grad_norm(grads, 0.5);
  EXPECT_NEAR(norm, std::sqrt(7.0), 1e-12);
  const double scale = 0.5 / (std::sqrt(7.0) + 1e-6);
  for (float x : buf.to_vector<float>()) EXPECT_FLOAT_EQ(x, static_cast<float>(scale));  // the caller's handle
  EXPECT_EQ(grads.at("b").dtype(), DType::f64);
  EXPECT_EQ(big.to_vector<double>()[0], std::sqrt(3.0) * scale);  // exact in float64
  std::vector<float> frozen(2, 5.0f);
  NamedTensors ro{{"r", Tensor::from_blob(frozen.data(), {2}, DType::f32, {1}, nullptr, true)}};
  EXPECT_THROW(clip_grad_norm(ro, 1.0), ValueError);
  EXPECT_EQ(frozen, std::vector<float>(2, 5.0f));
}

TEST(Losses, MatchTorchAutograd) {
  const io::SafetensorsFile f = io::load_safetensors(sdpa_fixtures::fixture_dir("optim") / "losses.safetensors");
  auto t = [&](const char* k) { return f.tensors.at(k); };
  auto scalar = [&](const char* k) { return t(k).to_vector<double>()[0]; };
  const LossResult bce = binary_cross_entropy_with_logits(t("bce_logits"), t("bce_targets"));
  EXPECT_NEAR(bce.loss, scalar("bce_loss"), 1e-6 * std::fabs(scalar("bce_loss")));
  EXPECT_LE(max_diff(bce.grad, t("bce_grad")), 1e-7);
  const LossResult ce = cross_entropy(t("ce_logits"), t("ce_targets"));
  EXPECT_NEAR(ce.loss, scalar("ce_loss"), 1e-6 * std::fabs(scalar("ce_loss")));
  EXPECT_LE(max_diff(ce.grad, t("ce_grad")), 1e-7);
  const LossResult mse = mse_loss(t("mse_input"), t("mse_target"));
  EXPECT_NEAR(mse.loss, scalar("mse_loss"), 1e-6 * std::fabs(scalar("mse_loss")));
  EXPECT_LE(max_diff(mse.grad, t("mse_grad")), 1e-7);
  NamedTensors grads{{"a", t("clip_g1")}, {"b", t("clip_g2")}};
  EXPECT_NEAR(clip_grad_norm(grads, 1.0), scalar("clip_norm"), 1e-5 * scalar("clip_norm"));
  EXPECT_LE(max_diff(grads.at("a"), t("clip_out1")), 1e-7);
  EXPECT_LE(max_diff(grads.at("b"), t("clip_out2")), 1e-7);
  EXPECT_THROW(cross_entropy(t("ce_logits"), Tensor::from_vector(std::vector<int64_t>(7, 9), {7})), ValueError);
  EXPECT_THROW(mse_loss(t("mse_input"), t("ce_logits")), ShapeError);
  // float class indices are refused, not truncated (1.9 was class 1)
  EXPECT_THROW(cross_entropy(t("ce_logits"), t("ce_targets").to(DType::f32)), DTypeError);
  EXPECT_THROW(cross_entropy(Tensor::zeros({2, 3}), Tensor::from_vector(std::vector<float>{0.5f, 1.9f}, {2})),
               DTypeError);
  EXPECT_EQ(cross_entropy(t("ce_logits"), t("ce_targets").to(DType::i32)).loss, ce.loss);
}

// torch's reduction='mean' over no elements is NaN (losses.safetensors' *_empty_loss) and its
// gradient an empty tensor of the input's shape; qkv divided by max(N, 1) and returned 0.
TEST(Losses, EmptyInputsGiveNaNAsTorch) {
  const io::SafetensorsFile f = io::load_safetensors(sdpa_fixtures::fixture_dir("optim") / "losses.safetensors");
  auto t = [&](const char* k) { return f.tensors.at(k); };
  const std::vector<std::pair<LossResult, std::string>> results = {
      {binary_cross_entropy_with_logits(Tensor::zeros({0, 3}), Tensor::zeros({0, 3})), "bce"},
      {cross_entropy(Tensor::zeros({0, 4}), Tensor::zeros({0}, DType::i64)), "ce"},
      {mse_loss(Tensor::zeros({0}), Tensor::zeros({0})), "mse"}};
  for (const auto& [r, name] : results) {
    SCOPED_TRACE(name);
    const double expected = t((name + "_empty_loss").c_str()).to_vector<double>()[0];
    ASSERT_TRUE(std::isnan(expected));  // the fixture holds torch's NaN
    EXPECT_TRUE(std::isnan(r.loss)) << r.loss;
    EXPECT_EQ(r.grad.shape(), t((name + "_empty_grad").c_str()).shape());
    EXPECT_EQ(r.grad.dtype(), DType::f32);
  }
}

// torch's F.cross_entropy ignores rows whose target is ignore_index (-100 by default, the label
// padding of Hugging Face's collators): they count in neither the sum nor the mean's count and get
// gradient 0; every row ignored is NaN with a zero gradient. qkv refused -100 as a class out of range.
TEST(Losses, CrossEntropyIgnoresIgnoreIndexAsTorch) {
  const io::SafetensorsFile f = io::load_safetensors(sdpa_fixtures::fixture_dir("optim") / "losses.safetensors");
  auto t = [&](const char* k) { return f.tensors.at(k); };
  const Tensor x = t("ce_ignore_logits"), y = t("ce_ignore_targets");  // [6, 4], rows 1 and 4 are -100
  const double expected = t("ce_ignore_loss").to_vector<double>()[0];
  const LossResult r = cross_entropy(x, y);
  EXPECT_NEAR(r.loss, expected, 1e-6 * expected);
  EXPECT_LE(max_diff(r.grad, t("ce_ignore_grad")), 1e-7);
  const LossResult all = cross_entropy(x.slice(0, 0, 3), Tensor::full({3}, -100.0, DType::i64));
  ASSERT_TRUE(std::isnan(t("ce_all_ignored_loss").to_vector<double>()[0]));
  EXPECT_TRUE(std::isnan(all.loss)) << all.loss;
  EXPECT_EQ(max_diff(all.grad, t("ce_all_ignored_grad")), 0.0);  // zeros
  // another label out of range is still an error naming it and its row
  const std::vector<int64_t> bad{2, -100, 7, 0, -100, 1}, minus1{2, -1, 0, 3, -100, 1};
  EXPECT_THROW_WITH(cross_entropy(x, Tensor::from_vector(bad, {6})), ValueError,
                    "cross_entropy: target 7 of row 2 is not in [0, 4) nor ignore_index -100");
  EXPECT_THROW_WITH(cross_entropy(x, Tensor::from_vector(minus1, {6})), ValueError, "target -1 of row 1");
  // ignore_index -1: rows labelled -1 are ignored (torch's value for -100 there), -100 is out of range
  const std::vector<int64_t> ignore_minus1{2, -1, 0, 3, -1, 1};
  EXPECT_NEAR(cross_entropy(x, Tensor::from_vector(ignore_minus1, {6}), -1).loss, expected, 1e-6 * expected);
  EXPECT_THROW_WITH(cross_entropy(x, Tensor::from_vector(minus1, {6}), -1), ValueError, "target -100 of row 4");
}

// binary_cross_entropy_with_logits at infinite and NaN logits, element by element, against torch
// (bce_inf_*: x in {-inf, +inf, nan} x y in {0, 0.5, 1}): torch computes (1 - y) x - log_sigmoid(x),
// NaN at x = -inf for every y and at x = +inf, y = 1, inf at x = +inf, y < 1. qkv's
// max(x, 0) - x y + log1p(e^-|x|) gave inf at x = -inf, y = 0.5 and 1, NaN at x = +inf, y = 0.5.
TEST(Losses, BceWithLogitsAtInfiniteLogitsAsTorch) {
  const io::SafetensorsFile f = io::load_safetensors(sdpa_fixtures::fixture_dir("optim") / "losses.safetensors");
  const auto x = f.tensors.at("bce_inf_logits").to_vector<float>(),
             y = f.tensors.at("bce_inf_targets").to_vector<float>();
  const auto loss = f.tensors.at("bce_inf_loss").to_vector<double>();
  const auto grad = f.tensors.at("bce_inf_grad").to_vector<float>();
  ASSERT_EQ(x.size(), 9u);
  for (size_t i = 0; i < x.size(); ++i) {
    SCOPED_TRACE(testing::Message() << "x " << x[i] << " y " << y[i]);
    const LossResult r = binary_cross_entropy_with_logits(Tensor::from_vector(std::vector<float>{x[i]}, {1}),
                                                          Tensor::from_vector(std::vector<float>{y[i]}, {1}));
    if (std::isnan(loss[i])) {
      EXPECT_TRUE(std::isnan(r.loss)) << r.loss;
    } else {
      EXPECT_EQ(r.loss, loss[i]);  // inf
    }
    const float g = r.grad.to_vector<float>()[0];
    if (std::isnan(grad[i])) {
      EXPECT_TRUE(std::isnan(g)) << g;
    } else {
      EXPECT_EQ(g, grad[i]);
    }
  }
}

}  // namespace
}  // namespace qkv::nn
