// Weight files as layers, and the Keras <-> PyTorch MHA layout conversion, checked
// against outputs Keras 3 computed (tests/io/make_keras_tf_fixtures.py) and the
// variables TensorFlow read from the seed-001 checkpoint.
#include <gtest/gtest.h>

#include <cmath>

#include "common/expect.h"
#include "io/io_test_util.h"
#include "qkv/io_keras.h"
#include "qkv/nn/keras_layers.h"

namespace qkv::io {
namespace {

// The layer view of weight files lives in qkv::nn (qkv/nn/keras_layers.h).
using nn::keras3_paths;
using nn::keras_layer_weights;
using nn::keras_to_torch;
using nn::layer_weights;
using nn::LayerWeights;
using nn::torch_to_keras;

std::filesystem::path fx(const std::string& dir, const std::string& name) {
  return std::filesystem::path(QKV_SOURCE_DIR) / "tests" / "fixtures" / dir / name;
}

// torch.nn.MultiheadAttention's forward (batch_first, no mask, no dropout) in float64,
// written from PyTorch's definition: in_proj, heads of E/N, softmax(q k^T / sqrt(E/N)) v, out_proj.
std::vector<double> torch_mha(const std::map<std::string, Tensor>& sd, const std::string& p, const Tensor& query,
                              const Tensor& value, int64_t heads) {
  const auto w = sd.at(p + ".in_proj_weight").to_vector<double>(), b = sd.at(p + ".in_proj_bias").to_vector<double>();
  const auto ow = sd.at(p + ".out_proj.weight").to_vector<double>(),
             ob = sd.at(p + ".out_proj.bias").to_vector<double>();
  const int64_t B = query.size(0), L = query.size(1), S = value.size(1), E = query.size(2), D = E / heads;
  const auto xq = query.to_vector<double>(), xv = value.to_vector<double>();
  auto proj = [&](const std::vector<double>& x, int64_t rows, int64_t part) {  // [rows, E] @ W[part].T + b[part]
    std::vector<double> y(static_cast<size_t>(rows * E));
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t o = 0; o < E; ++o) {
        double acc = b[static_cast<size_t>(part * E + o)];
        for (int64_t i = 0; i < E; ++i)
          acc += x[static_cast<size_t>(r * E + i)] * w[static_cast<size_t>((part * E + o) * E + i)];
        y[static_cast<size_t>(r * E + o)] = acc;
      }
    }
    return y;
  };
  const auto q = proj(xq, B * L, 0), k = proj(xv, B * S, 1), v = proj(xv, B * S, 2);
  std::vector<double> ctx(static_cast<size_t>(B * L * E)), out(static_cast<size_t>(B * L * E));
  for (int64_t bi = 0; bi < B; ++bi) {
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < L; ++i) {
        std::vector<double> s(static_cast<size_t>(S));
        double mx = -1e300, sum = 0;
        for (int64_t j = 0; j < S; ++j) {
          double d = 0;
          for (int64_t c = 0; c < D; ++c)
            d += q[static_cast<size_t>((bi * L + i) * E + h * D + c)] *
                 k[static_cast<size_t>((bi * S + j) * E + h * D + c)];
          s[static_cast<size_t>(j)] = d / std::sqrt(static_cast<double>(D));
          mx = std::max(mx, s[static_cast<size_t>(j)]);
        }
        for (auto& x : s) sum += (x = std::exp(x - mx));
        for (int64_t c = 0; c < D; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < S; ++j)
            acc += s[static_cast<size_t>(j)] / sum * v[static_cast<size_t>((bi * S + j) * E + h * D + c)];
          ctx[static_cast<size_t>((bi * L + i) * E + h * D + c)] = acc;
        }
      }
    }
  }
  for (int64_t r = 0; r < B * L; ++r) {
    for (int64_t o = 0; o < E; ++o) {
      double acc = ob[static_cast<size_t>(o)];
      for (int64_t i = 0; i < E; ++i) acc += ctx[static_cast<size_t>(r * E + i)] * ow[static_cast<size_t>(o * E + i)];
      out[static_cast<size_t>(r * E + o)] = acc;
    }
  }
  return out;
}

TEST(KerasConvert, TorchLayoutOfAKerasMhaReproducesKerasOutput) {
  const LayerWeights layers = keras_layer_weights(load_keras_h5(fx("keras_tf", "mha4.weights.h5")));
  const auto sd = keras_to_torch(layers);
  ASSERT_EQ(sd.size(), 4u);
  EXPECT_EQ(sd.at("multi_head_attention.in_proj_weight").shape(), (Shape{12, 4}));
  const Tensor q = load_npy(fx("keras_tf", "mha4_query.npy")), v = load_npy(fx("keras_tf", "mha4_value.npy"));
  const auto want = load_npy(fx("keras_tf", "mha4_output.npy")).to_vector<double>();
  const auto got = torch_mha(sd, "multi_head_attention", q, v, 2);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * std::max(1.0, std::abs(want[i]))) << i;
}

TEST(KerasConvert, TorchToKerasUndoesKerasToTorch) {
  const LayerWeights layers = keras_layer_weights(load_keras_h5(fx("keras_tf", "mha4.weights.h5")));
  const LayerWeights back = torch_to_keras(keras_to_torch(layers), 2);
  ASSERT_EQ(back.size(), 1u);
  for (const auto& [name, t] : layers.at("multi_head_attention")) {
    const Tensor& b = back.at("multi_head_attention").at(name);
    ASSERT_EQ(b.shape(), t.shape()) << name;
    EXPECT_EQ(b.to_vector<double>(), t.to_vector<double>()) << name;
  }
  EXPECT_EQ(keras3_paths(back).count("layers/multi_head_attention/output_dense/vars/0"), 1u);
}

TEST(KerasConvert, SeedModelHasNoTorchLayoutAndSaysWhy) {
  const LayerWeights layers = keras_layer_weights(load_weights(fx("seed001", "ckpt")));
  EXPECT_THROW_WITH(keras_to_torch(layers), ValueError, "num_heads * key_dim = 2 * 4 != embed dim 3");
}

TEST(KerasLayers, EveryFormatGivesTheSameLayersAsTensorFlowRead) {
  const SafetensorsFile tf = load_safetensors(fx("seed001", "variables.safetensors"));
  const std::vector<std::string>& weights = testing::kKerasMhaWeightsAsTfWrites;
  for (const char* file : {"ckpt", "ckpt.index", "model.weights.h5", "model.h5", "model.keras"}) {
    const LayerWeights layers = keras_layer_weights(load_weights(fx("seed001", file)));
    ASSERT_EQ(layers.size(), 2u) << file;
    const auto& mha = layer_weights(layers, "multi_head_attention", file);
    ASSERT_EQ(mha.size(), 8u) << file;
    for (size_t i = 0; i < weights.size(); ++i) {
      const auto key = "optimizer/_trainable_variables/" + std::to_string(i) + "/.ATTRIBUTES/VARIABLE_VALUE";
      EXPECT_EQ(mha.at(weights[i]).to_vector<double>(), tf.tensors.at(key).to_vector<double>())
          << file << " " << weights[i];
    }
    const auto& dense = layer_weights(layers, "dense", file);
    EXPECT_EQ(dense.at("kernel").to_vector<double>(),
              tf.tensors.at("optimizer/_trainable_variables/8/.ATTRIBUTES/VARIABLE_VALUE").to_vector<double>());
  }
  const LayerWeights tfk = keras_layer_weights(load_weights(fx("keras_tf", "tfkeras2_ckpt")));
  EXPECT_EQ(tfk.at("multi_head_attention").size(), 8u);  // from the object graph's names
}

TEST(KerasLayers, MissingLayerListsWhatTheFileHas) {
  const LayerWeights layers = keras_layer_weights(load_weights(fx("seed001", "model.weights.h5")));
  EXPECT_THROW_WITH(layer_weights(layers, "attention", "model.weights.h5"), FormatError,
                    "no layer named 'attention'; the file has: dense (bias[1] kernel[3, 1]), multi_head_attention (");
}

TEST(IoFiles, LoadAndInspectDispatchToWeightFormats) {
  const auto infos = inspect(fx("seed001", "ckpt.index"));
  ASSERT_EQ(infos.size(), 33u);
  int optimizer = 0;
  for (const auto& i : infos) optimizer += i.optimizer ? 1 : 0;
  EXPECT_EQ(optimizer, 22);
  EXPECT_EQ(load(fx("seed001", "model.weights.h5")).size(), 32u);
  EXPECT_EQ(load(fx("seed001", "model.keras")).size(), 32u);
  const auto path = testing::temp_path("x.weights.h5");
  save(path, {{"layers/dense/vars/0", Tensor::ones({3, 1})}});
  EXPECT_EQ(load(path).at("layers/dense/vars/0").shape(), (Shape{3, 1}));
}

}  // namespace
}  // namespace qkv::io
