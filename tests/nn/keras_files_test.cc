// Files qkv writes load into the layers in one call: qkv::io::load of every Keras format
// (Keras 3 .weights.h5, tf.keras .h5, .keras, TF checkpoint, safetensors) goes into
// nn::keras_mha_from_weights, and PyTorch-layout files into MultiheadAttention::from_state_dict,
// whatever the key scheme and prefix. Oracles: the outputs Keras 3 computed for the seed-001
// model (tests/fixtures/seed001/probe_outputs.npy, dense(mha(x, x))) and for mha_keras/self.
#include <gtest/gtest.h>

#include "common/expect.h"
#include "io/io_test_util.h"
#include "nn/fixtures.h"
#include "qkv/io.h"
#include "qkv/io_keras.h"
#include "qkv/io_tf.h"
#include "qkv/nn/keras_layers.h"
#include "qkv/nn/keras_weights.h"
#include "qkv/nn/mha.h"

namespace {

using qkv::Tensor;
using namespace qkv::nn::testing;
namespace io = qkv::io;
namespace nn = qkv::nn;

constexpr double kTolerance = 1e-5;

fs::path seed_file(const std::string& name) { return fixture_dir("seed001") / name; }

// The Dense layer of a seed-001 file's tensors (the one layer with a 2-D kernel).
qkv::nn::Linear dense_of(const std::map<std::string, Tensor>& tensors) {
  for (const auto& [name, w] : nn::keras_layer_weights(tensors)) {
    if (w.count("kernel") && w.at("kernel").dim() == 2) return qkv::nn::Linear::keras(w.at("kernel"), w.at("bias"), 1);
  }
  ADD_FAILURE() << "no Dense layer";
  return {};
}

// dense(mha(x, x)) of the layers qkv::io::load(path) gives, against Keras' model outputs.
double seed_model_error(const fs::path& path) {
  const auto tensors = io::load(path);
  const auto mha = qkv::nn::keras_mha_from_weights(tensors);
  const Tensor x = io::load_npy(seed_file("probe_inputs.npy"));  // [5, 2, 3]
  const Tensor y = dense_of(tensors).forward(mha.forward(x, x).output);
  return relative_error(y, io::load_npy(seed_file("probe_outputs.npy")));
}

TEST(LayerFiles, KerasFilesLoadIntoTheLayerInOneCall) {
  for (const char* name : {"model.weights.h5", "model.h5", "model.keras"}) {
    SCOPED_TRACE(name);
    EXPECT_LE(seed_model_error(seed_file(name)), kTolerance);
  }
}

// Each Keras format qkv writes (what `qkv convert --to keras` writes) loads back into the layers.
TEST(LayerFiles, EveryKerasFormatQkvWritesLoadsIntoTheLayer) {
  const nn::LayerWeights layers = nn::keras_layer_weights(io::load_weights(seed_file("ckpt")));
  const std::vector<std::string> order = {"multi_head_attention", "dense"};
  const auto dir = qkv::io::testing::temp_path("formats");
  fs::create_directories(dir);
  io::save_keras_weights_h5(dir / "m.weights.h5", nn::keras3_paths(layers));
  nn::save_keras_legacy_h5(dir / "m.h5", layers, order);
  io::save_keras_archive(dir / "m.keras", nn::keras3_paths(layers), nn::keras_model_config(layers, order));
  const nn::TfKerasCheckpoint ck = nn::tf_keras_checkpoint_keys(layers, order);
  io::save_tf_checkpoint(dir / "ck", ck.tensors, ck.full_names);
  io::save_safetensors(dir / "m.safetensors", nn::keras3_paths(layers));
  for (const char* name : {"m.weights.h5", "m.h5", "m.keras", "ck", "ck.index", "m.safetensors"}) {
    SCOPED_TRACE(name);
    EXPECT_LE(seed_model_error(dir / name), kTolerance);
  }
}

// `qkv convert --to torch`'s keys ("<layer>.in_proj_weight") go into from_state_dict as they are.
TEST(LayerFiles, TorchLayoutFilesLoadIntoMultiheadAttention) {
  const Fixture fx = load_fixture(fixture_dir("mha_keras") / "self.safetensors");
  const auto sd =
      nn::keras_to_torch(nn::keras_layer_weights(io::load_weights(fixture_dir("mha_keras") / "self.safetensors")));
  ASSERT_EQ(sd.count("mha.in_proj_weight"), 1u);
  qkv::nn::MultiheadAttentionConfig c;
  c.embed_dim = 8;
  c.num_heads = 2;
  c.batch_first = true;
  qkv::nn::MultiheadAttentionOptions o;
  o.need_weights = false;
  const Tensor x = fx.at("input.query");  // [2, 5, 8]
  for (const char* name : {"t.safetensors", "t.weights.h5"}) {
    SCOPED_TRACE(name);
    const auto path = qkv::io::testing::temp_path(name);
    io::save(path, sd);
    const auto m = qkv::nn::MultiheadAttention::from_state_dict(c, io::load(path));
    EXPECT_LE(relative_error(m.forward(x, x, x, o).output, fx.at("expected.output")), kTolerance);
  }
}

TEST(LayerFiles, SeveralLayersNeedANameAndMissingOnesListWhatWasFound) {
  const auto one = io::load(seed_file("model.weights.h5"));
  std::map<std::string, Tensor> two = one;
  for (const auto& [k, t] : one) {
    if (k.starts_with("layers/multi_head_attention/")) two["layers/encoder/" + k.substr(7)] = t;
  }
  EXPECT_THROW_WITH(qkv::nn::keras_mha_weights(two), qkv::ValueError,
                    "2 MultiHeadAttention layers ('encoder/multi_head_attention', 'multi_head_attention')");
  EXPECT_EQ(qkv::nn::keras_mha_weights(two, "encoder/multi_head_attention").size(), 8u);
  EXPECT_THROW_WITH(qkv::nn::keras_mha_weights(two, "decoder"), qkv::ValueError,
                    "no MultiHeadAttention layer named 'decoder'");
  EXPECT_THROW_WITH(qkv::nn::keras_mha_weights({{"w", Tensor::ones({2})}}), qkv::ValueError, "the tensors: w [2]");
  // An MHA layer with a weight missing names the weights it has.
  std::map<std::string, Tensor> partial = one;
  partial.erase("layers/multi_head_attention/key_dense/vars/1");
  qkv::nn::KerasMultiHeadAttention layer(qkv::nn::keras_mha_config(qkv::nn::keras_mha_weights(partial)));
  EXPECT_THROW_WITH(layer.load_weights(partial), qkv::ValueError, "no weight named \"key/bias\"");
  // PyTorch: one prefix is found, several need prefix=, none lists the keys.
  std::map<std::string, Tensor> sd;
  for (const char* p : {"a.", "b.attn."}) {
    sd[std::string(p) + "in_proj_weight"] = Tensor::ones({12, 4});
    sd[std::string(p) + "out_proj.weight"] = Tensor::ones({4, 4});
  }
  EXPECT_THROW_WITH(qkv::nn::mha_state_dict(sd), qkv::ValueError,
                    "2 MultiheadAttention layers (prefixes 'a.', 'b.attn.')");
  EXPECT_EQ(qkv::nn::mha_state_dict(sd, "attn").count("in_proj_weight"), 1u);
  EXPECT_EQ(qkv::nn::mha_state_dict(sd, "a.").size(), 2u);
  EXPECT_THROW_WITH(qkv::nn::mha_state_dict({{"dense.weight", Tensor::ones({1, 3})}}), qkv::ValueError,
                    "no <prefix>out_proj.weight); the keys: dense.weight [1, 3]");
}

// Keras 3.15's use_gate: Keras' own weight file of a gated layer (its gate saved as
// layers/multi_head_attention/_gate_dense/vars/0) loads into a layer whose use_gate comes from the
// weights and gives Keras' output (mha_keras/gate_window: gate, sliding_window=3, causal, masks),
// and every Keras format qkv writes keeps the gate (between key and value in Keras' order).
TEST(LayerFiles, KerasGateWeightsLoadAndRoundTrip) {
  const Fixture fx = load_fixture(fixture_dir("mha_keras") / "gate_window.safetensors");
  const auto check = [&](const std::map<std::string, Tensor>& tensors) {
    const auto w = nn::keras_mha_weights(tensors);
    nn::KerasMultiHeadAttentionConfig c = nn::keras_mha_config(w);
    EXPECT_TRUE(c.use_gate);
    c.sliding_window = fx.options.at("sliding_window").get<int64_t>();  // not in weight files (a call option)
    nn::KerasMultiHeadAttention layer(c);
    layer.load_weights(w);
    nn::KerasMultiHeadAttentionOptions o;
    o.value_mask = fx.at("input.value_mask");
    o.attention_mask = fx.at("input.attention_mask");
    o.use_causal_mask = true;
    o.return_attention_scores = true;
    const auto r = layer.forward(fx.at("input.query"), fx.at("input.value"), o);
    EXPECT_LE(relative_error(r.output, fx.at("expected.output")), kTolerance);
    EXPECT_LE(relative_error(*r.scores, fx.at("expected.scores")), kTolerance);
  };
  const auto keras_file = io::load(fixture_dir("mha_keras") / "gate_window.weights.h5");
  ASSERT_EQ(keras_file.count("layers/multi_head_attention/_gate_dense/vars/0"), 1u);
  check(keras_file);
  const nn::LayerWeights layers = nn::keras_layer_weights(keras_file);
  ASSERT_EQ(layers.at("multi_head_attention").size(), 10u);
  const auto order = nn::keras_weight_order(layers.at("multi_head_attention"));
  EXPECT_EQ(order.at(4), "gate/kernel");
  EXPECT_EQ(order.at(6), "value/kernel");
  EXPECT_NE(nn::keras_model_config(layers).find("\"use_gate\":true"), std::string::npos);
  const auto dir = qkv::io::testing::temp_path("gate");
  fs::create_directories(dir);
  io::save_keras_weights_h5(dir / "m.weights.h5", nn::keras3_paths(layers));
  nn::save_keras_legacy_h5(dir / "m.h5", layers);
  io::save_keras_archive(dir / "m.keras", nn::keras3_paths(layers), nn::keras_model_config(layers));
  const nn::TfKerasCheckpoint ck = nn::tf_keras_checkpoint_keys(layers);
  io::save_tf_checkpoint(dir / "ck", ck.tensors, ck.full_names);
  io::save_safetensors(dir / "m.safetensors", nn::keras3_paths(layers));
  EXPECT_EQ(nn::keras3_paths(layers).count("layers/multi_head_attention/_gate_dense/vars/1"),
            1u);  // as Keras 3.15 saves it
  for (const char* name : {"m.weights.h5", "m.h5", "m.keras", "ck", "m.safetensors"}) {
    SCOPED_TRACE(name);
    check(io::load(dir / name));
  }
  // PyTorch's layer has no gate: the conversion refuses it.
  EXPECT_THROW_WITH(nn::keras_to_torch(layers), qkv::ValueError, "has a gate (Keras' use_gate)");
}

}  // namespace
