// qkv demo, trained part: seed 001's model as Keras/TensorFlow trained and saved it
// (tests/fixtures/seed001, tests/seed001/train_seed001.py), loaded from the TF
// checkpoint, its variables listed, and the five probe inputs run beside Keras' outputs.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <iostream>

#include "commands.h"
#include "qkv/io.h"
#include "qkv/io_keras.h"
#include "qkv/io_tensor_files.h"
#include "qkv/nn/keras_weights.h"
#include "qkv/nn/optim.h"
#include "qkv/nn/seed001_training.h"

namespace qkv::cli {

namespace {

// tests/fixtures/seed001 from $QKV_SEED001_DIR, the working directory (make demo runs
// in the repository root), or the repository holding this executable (build/<preset>/bin/qkv).
std::filesystem::path seed001_dir() {
  std::error_code ec;
  if (const char* env = std::getenv("QKV_SEED001_DIR")) {
    // ".../seed001/" names the same folder: without the trailing separator, so that
    // parent_path() is tests/fixtures (train's seed001_train sits beside it)
    const std::filesystem::path p = std::filesystem::path(env).lexically_normal();  // "a//" is "a/"
    return p.has_filename() ? p : p.parent_path();
  }
  const std::filesystem::path rel = "tests/fixtures/seed001";
  if (std::filesystem::exists(rel / "ckpt.index", ec)) return rel;
  const auto exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  for (auto dir = exe.parent_path(); !ec && !dir.empty() && dir != dir.root_path(); dir = dir.parent_path()) {
    if (std::filesystem::exists(dir / rel / "ckpt.index", ec)) return dir / rel;
  }
  return {};
}

void list_variables(const std::filesystem::path& ckpt) {
  const auto entries = io::inspect_weights(ckpt);
  size_t optimizer = 0;
  std::cout << "\nvariables of " << ckpt.string() << " (" << entries.size() << " entries):\n";
  for (const auto& e : entries) {
    if (e.optimizer) {
      ++optimizer;
      continue;
    }
    if (e.key == "_CHECKPOINTABLE_OBJECT_GRAPH") continue;
    std::printf("  %-46s %-8s %-10s %s\n", e.name.c_str(), e.dtype.c_str(), shape_str(e.shape).c_str(), e.key.c_str());
  }
  std::printf("  (+ %zu optimizer variables: Adam's iteration, learning rate, momentums and velocities; skipped)\n",
              optimizer);
}

}  // namespace

void demo_seed001() {
  const std::filesystem::path dir = seed001_dir();
  if (dir.empty()) {
    std::cout << "\n(seed 001 trained model: tests/fixtures/seed001 not found; run from the repository root)\n";
    return;
  }
  const std::filesystem::path ckpt = dir / "ckpt";
  std::cout << "\n== seed 001, trained: MultiHeadAttention(num_heads=2, key_dim=4) + Dense(1), Adam, 10 epochs in "
               "Keras 3 / TensorFlow, loaded from its TF checkpoint\n";
  list_variables(ckpt);
  const nn::KerasMhaDense model = nn::load_keras_mha_dense(ckpt);
  const Tensor probe = io::load_npy(dir / "probe_inputs.npy");  // [5, 2, 3]
  const auto got = model.forward(probe).to_vector<double>();
  const auto want = io::load_npy(dir / "probe_outputs.npy").to_vector<double>();
  std::cout << "\ninput of shape [1, 2, 3] filled with c -> output at token 0 (qkv vs Keras' recorded output):\n";
  std::printf("  %8s  %16s  %16s  %10s\n", "c", "qkv", "Keras", "rel. error");
  const double cs[] = {0.1, 1, 10, 100, 1000};
  double worst = 0;
  for (size_t i = 0; i < 5; ++i) {
    const double g = got[i * 2], w = want[i * 2];
    for (size_t t = 0; t < 2; ++t)
      worst = std::max(worst, std::abs(got[i * 2 + t] - want[i * 2 + t]) / std::abs(want[i * 2 + t]));
    std::printf("  %8g  %16.8g  %16.8g  %10.2e\n", cs[i], g, w, std::abs(g - w) / std::abs(w));
  }
  std::printf("  max relative error over both tokens: %.2e (the end-to-end test requires <= 1e-5)\n", worst);
}

// Seed 001 trained in qkv from Keras' initial weights (tests/fixtures/seed001_train), its
// loss per epoch beside Keras' (qkv demo and qkv train seed001). False when the fixture is
// not found.
bool train_seed001_table() {
  const std::filesystem::path dir = seed001_dir();
  const std::filesystem::path file = dir.parent_path() / "seed001_train" / "history.safetensors";
  std::error_code ec;
  if (dir.empty() || !std::filesystem::exists(file, ec)) return false;
  const io::SafetensorsFile f = io::load_safetensors(file);
  nn::NamedTensors weights;
  for (const auto& [key, t] : f.tensors) {
    if (key.rfind("init/", 0) == 0) weights[key.substr(5)] = t.clone();
  }
  nn::AdamOptions o;  // keras.optimizers.Adam()'s defaults
  o.lr = 1e-3, o.eps = 1e-7, o.convention = nn::Convention::keras;
  nn::Adam adam(o);
  const std::vector<double> losses = nn::train_seed001(weights, f.tensors.at("x"), f.tensors.at("y"), 10, adam);
  const auto keras = f.tensors.at("loss").to_vector<double>();
  std::cout << "\n== seed 001 trained in qkv: the same model from Keras' initial weights, forward + fused attention "
               "backward + Keras' Adam, 10 full-batch epochs\n";
  std::printf("  %5s  %14s  %14s  %10s\n", "epoch", "qkv loss", "Keras loss", "rel. error");
  for (size_t e = 0; e < losses.size() && e < keras.size(); ++e) {
    std::printf("  %5zu  %14.8f  %14.8f  %10.2e\n", e + 1, losses[e], keras[e],
                std::abs(losses[e] - keras[e]) / std::abs(keras[e]));
  }
  return true;
}

}  // namespace qkv::cli
