// nn::keras_adam_state: Keras' saved Adam slots resume seed 001's training in qkv as Keras
// resumes it (tests/fixtures/seed001_train/continued.safetensors from
// tests/seed001/continue_seed001.py: Keras 3.15.1 loads tests/fixtures/seed001/model.keras with
// its optimizer and trains 3 more epochs).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "common/expect.h"
#include "common/sdpa_fixtures.h"
#include "qkv/io_keras.h"
#include "qkv/nn/keras_optimizer.h"
#include "qkv/nn/keras_weights.h"
#include "qkv/nn/seed001_training.h"

namespace qkv::nn {
namespace {

using sdpa_fixtures::fixture_dir;

std::filesystem::path seed_file(const std::string& name) { return fixture_dir("seed001") / name; }

// Seed 001's weights (seed001_training.h names) out of the Keras 3 model.keras.
NamedTensors seed001_weights(const io::WeightFile& file) {
  NamedTensors w;
  for (const auto& [name, t] : keras_mha_weights(file.tensors, "multi_head_attention")) {
    std::string flat = name;
    std::replace(flat.begin(), flat.end(), '/', '_');
    w[flat] = t.clone();
  }
  w["dense_kernel"] = file.tensors.at("layers/dense/vars/0").clone();
  w["dense_bias"] = file.tensors.at("layers/dense/vars/1").clone();
  return w;
}

std::vector<Shape> shapes_of(const NamedTensors& w) {
  std::vector<Shape> out;
  for (const KerasVariable& v : seed001_keras_variables()) out.push_back(w.at(v.name).shape());
  return out;
}

AdamOptions keras_adam() {
  AdamOptions o;  // keras.optimizers.Adam()'s defaults
  o.lr = 1e-3, o.eps = 1e-7, o.convention = Convention::keras;
  return o;
}

// Trains 3 epochs from model.keras (with the file's Adam state when `resume`); returns the
// worst relative error of the losses and of the final weights against Keras' continuation.
std::pair<double, double> continue_training(bool resume) {
  const io::WeightFile file = io::load_weights(seed_file("model.keras"));
  NamedTensors w = seed001_weights(file);
  Adam adam(keras_adam());
  if (resume) {
    const KerasAdamState s = keras_adam_state(file, seed001_keras_variables(), "model.keras", shapes_of(w));
    adam.load_state(s.state, s.iterations);
  }
  const io::SafetensorsFile h = io::load_safetensors(fixture_dir("seed001_train") / "history.safetensors");
  const io::SafetensorsFile c = io::load_safetensors(fixture_dir("seed001_train") / "continued.safetensors");
  const std::vector<double> losses = train_seed001(w, h.tensors.at("x"), h.tensors.at("y"), 3, adam);
  const auto keras = c.tensors.at("loss").to_vector<double>();
  double worst_loss = 0.0, worst_weight = 0.0;
  for (size_t e = 0; e < keras.size(); ++e) {
    worst_loss = std::max(worst_loss, std::fabs(losses.at(e) - keras[e]) / std::fabs(keras[e]));
  }
  for (const auto& [key, t] : c.tensors) {
    // key_bias: exact gradient 0, moved by rounding noise in both (seed001_training_test.cc)
    if (key.rfind("final/", 0) != 0 || key == "final/key_bias") continue;
    const auto got = w.at(key.substr(6)).to_vector<double>(), want = t.to_vector<double>();
    double err = 0.0, scale = 0.0;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, std::fabs(got[i] - want[i]));
      scale = std::max(scale, std::fabs(want[i]));
    }
    worst_weight = std::max(worst_weight, err / scale);
  }
  return {worst_loss, worst_weight};
}

TEST(KerasAdamState, ResumesSeed001AsKerasResumesIt) {
  const auto [loss, weight] = continue_training(true);
  EXPECT_LE(loss, 1e-5);
  EXPECT_LE(weight, 1e-5);
  std::printf("seed 001 resumed from model.keras's Adam state, 3 epochs vs Keras: loss %.2e, weights %.2e\n", loss,
              weight);
}

TEST(KerasAdamState, AFreshOptimizerDoesNotReproduceTheResumedRun) {
  // The test above can fail: without the saved moments and step count the run differs.
  const auto [loss, weight] = continue_training(false);
  EXPECT_GT(std::max(loss, weight), 1e-3);
}

TEST(KerasAdamState, EveryFormatKerasSavedGivesTheSameState) {
  const io::WeightFile keras = io::load_weights(seed_file("model.keras"));
  const KerasAdamState want = keras_adam_state(keras, seed001_keras_variables(), "model.keras");
  EXPECT_EQ(want.iterations, 10);
  ASSERT_TRUE(want.learning_rate.has_value());
  EXPECT_NEAR(*want.learning_rate, 1e-3, 1e-9);
  ASSERT_EQ(want.state.size(), 20u);
  for (const char* name : {"ckpt.index", "model.h5", "model.weights.h5"}) {
    const KerasAdamState got = keras_adam_state(io::load_weights(seed_file(name)), seed001_keras_variables(), name);
    EXPECT_EQ(got.iterations, 10) << name;
    ASSERT_EQ(got.state.size(), want.state.size()) << name;
    for (const auto& [slot, t] : want.state) {
      EXPECT_EQ(got.state.at(slot).to_vector<float>(), t.to_vector<float>()) << name << " " << slot;
    }
  }
  // v is a running mean of squares: never negative (a swapped m/v would show negatives)
  for (const auto& [slot, t] : want.state) {
    if (slot.rfind("v/", 0) != 0) continue;
    for (float x : t.to_vector<float>()) ASSERT_GE(x, 0.0f) << slot;
  }
}

TEST(KerasAdamState, ErrorsNameTheFileAndWhatIsMissing) {
  const io::WeightFile keras = io::load_weights(seed_file("model.keras"));
  const io::WeightFile ckpt = io::load_weights(seed_file("ckpt.index"));
  std::vector<KerasVariable> vars = seed001_keras_variables();
  vars.pop_back();
  EXPECT_THROW_WITH(keras_adam_state(keras, vars, "model.keras"), FormatError,
                    "keras_adam_state: model.keras: 22 optimizer/vars entries for 9 variables");
  vars = seed001_keras_variables();
  vars[0].path = "mha/query/kernel";
  EXPECT_THROW_WITH(keras_adam_state(ckpt, vars, "ckpt"), FormatError,
                    "keras_adam_state: ckpt: no Adam slots mha_query_kernel_momentum");
  std::vector<Shape> shapes(vars.size(), Shape{2});
  EXPECT_THROW_WITH(keras_adam_state(keras, seed001_keras_variables(), "model.keras", shapes), FormatError,
                    "the momentum of 'multi_head_attention/query/kernel' has shape [3, 2, 4], the variable [2]");
  io::WeightFile plain;
  plain.entries.push_back({"w", "w", "float32", {2}, false});
  plain.tensors["w"] = Tensor::zeros({2});
  EXPECT_THROW_WITH(keras_adam_state(plain, vars, "w.safetensors"), FormatError,
                    "keras_adam_state: w.safetensors: the file holds no optimizer state");
}

// The iteration count is checked, not cast: a NaN, an inf, 1e300 or a fraction cast to int64
// was undefined behaviour (any number came out), and a negative one failed only in load_state.
TEST(KerasAdamState, AnIterationCountThatIsNoWholeNumberIsAFormatError) {
  const std::vector<KerasVariable> vars{{"dense/bias", "dense_bias"}};
  auto file_with = [](const Tensor& iteration) {
    io::WeightFile f;
    const Tensor slots[] = {iteration, Tensor::full({}, 1e-3), Tensor::zeros({1}), Tensor::zeros({1})};
    for (int i = 0; i < 4; ++i) {
      const std::string key = "optimizer/vars/" + std::to_string(i);
      f.entries.push_back({key, key, "float32", slots[i].shape(), true});
      f.tensors[key] = slots[i];
    }
    return f;
  };
  EXPECT_EQ(keras_adam_state(file_with(Tensor::full({}, 7.0)), vars, "a.keras").iterations, 7);
  for (const double bad : {std::nan(""), HUGE_VAL, 1e300, -3.0, 2.5}) {
    EXPECT_THROW_WITH(
        keras_adam_state(file_with(Tensor::full({}, bad, DType::f64)), vars, "a.keras"), FormatError,
        "keras_adam_state: a.keras: the iteration count 'optimizer/vars/0' must be one whole number >= 0");
  }
  EXPECT_THROW_WITH(keras_adam_state(file_with(Tensor::zeros({2})), vars, "a.keras"), FormatError,
                    "must be one whole number >= 0, got [2]");
}

}  // namespace
}  // namespace qkv::nn
