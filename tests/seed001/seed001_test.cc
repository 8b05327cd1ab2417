// Seed 001 end to end: the model Keras 3 trained (tests/seed001/train_seed001.py),
// loaded by qkv from each file Keras/TensorFlow saved, reproduces the outputs Keras
// computed for the constant inputs 0.1, 1, 10, 100, 1000 and for the toy batch.
#include <gtest/gtest.h>

#include <cmath>

#include "common/expect.h"
#include "qkv/io.h"
#include "qkv/nn/keras_weights.h"

namespace qkv {
namespace {

std::filesystem::path seed(const std::string& name) {
  return std::filesystem::path(QKV_SOURCE_DIR) / "tests" / "fixtures" / "seed001" / name;
}

double max_relative_error(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) worst = std::max(worst, std::abs(g[i] - w[i]) / std::abs(w[i]));
  return worst;
}

class Seed001 : public ::testing::TestWithParam<const char*> {};

TEST_P(Seed001, ReproducesKerasOutputsFromTheSavedFile) {
  const nn::KerasMhaDense model = nn::load_keras_mha_dense(seed(GetParam()));
  EXPECT_EQ(model.attention.config().num_heads, 2);
  EXPECT_EQ(model.attention.config().key_dim, 4);
  const Tensor probe = io::load_npy(seed("probe_inputs.npy"));  // [5, 2, 3]: constants 0.1 .. 1000
  EXPECT_LE(max_relative_error(model.forward(probe), io::load_npy(seed("probe_outputs.npy"))), 1e-5);
  const Tensor toy = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 1, 1, 1, 2, 2, 6}, {2, 2, 3});
  EXPECT_LE(max_relative_error(model.forward(toy), io::load_npy(seed("toy_outputs.npy"))), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(EveryFormat, Seed001,
                         ::testing::Values("ckpt", "ckpt.index", "model.weights.h5", "model.h5", "model.keras"),
                         [](const auto& param_info) {
                           std::string n = param_info.param;
                           for (char& c : n) c = std::isalnum(static_cast<unsigned char>(c)) ? c : '_';
                           return n;
                         });

TEST(Seed001Load, MissingLayerNameListsTheLayersFound) {
  EXPECT_THROW_WITH(nn::load_keras_mha_dense(seed("ckpt"), "attention"), FormatError,
                    "no layer named 'attention'; the file has: dense (bias[1] kernel[3, 1]), multi_head_attention "
                    "(attention_output/bias[3]");
}

}  // namespace
}  // namespace qkv
