// Keras weight files written by Keras 3.15 and tf_keras 2.21 (tests/seed001/train_seed001.py,
// tests/io/make_keras_tf_fixtures.py), read through libhdf5 and the zip reader, compared
// with the values TensorFlow read from the checkpoint / the model and numpy saved as .safetensors.
#include <gtest/gtest.h>

#include "io/io_test_util.h"
#include "qkv/io_keras.h"

namespace qkv::io {
namespace {

using testing::fixture;
using testing::read_bytes;
using testing::temp_path;

void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], w[i]) << what << " element " << i;
}

// Keras 3 weight paths of seed 001's model and the TF checkpoint keys TF saved them under.
const std::vector<std::pair<std::string, std::string>> kSeedPaths = {
    {"layers/multi_head_attention/query_dense/vars/0", "optimizer/_trainable_variables/0"},
    {"layers/multi_head_attention/query_dense/vars/1", "optimizer/_trainable_variables/1"},
    {"layers/multi_head_attention/key_dense/vars/0", "optimizer/_trainable_variables/2"},
    {"layers/multi_head_attention/key_dense/vars/1", "optimizer/_trainable_variables/3"},
    {"layers/multi_head_attention/value_dense/vars/0", "optimizer/_trainable_variables/4"},
    {"layers/multi_head_attention/value_dense/vars/1", "optimizer/_trainable_variables/5"},
    {"layers/multi_head_attention/output_dense/vars/0", "optimizer/_trainable_variables/6"},
    {"layers/multi_head_attention/output_dense/vars/1", "optimizer/_trainable_variables/7"},
    {"layers/dense/vars/0", "optimizer/_trainable_variables/8"},
    {"layers/dense/vars/1", "optimizer/_trainable_variables/9"}};

const Tensor& tf_value(const SafetensorsFile& tf, const std::string& key) {
  return tf.tensors.at(key + "/.ATTRIBUTES/VARIABLE_VALUE");
}

TEST(KerasH5, ReadsKeras3WeightsFileAndMarksOptimizerVariables) {
  const WeightFile w = load_keras_h5(fixture("seed001", "model.weights.h5"));
  const SafetensorsFile tf = load_safetensors(fixture("seed001", "variables.safetensors"));
  for (const auto& [path, key] : kSeedPaths) expect_same(w.tensors.at(path), tf_value(tf, key), path);
  int optimizer = 0;
  for (const auto& e : w.entries) optimizer += e.optimizer ? 1 : 0;
  EXPECT_EQ(optimizer, 22);  // iteration, learning rate, 10 momentums, 10 velocities
  EXPECT_EQ(w.entries.size(), 32u);
  expect_same(w.tensors.at("optimizer/vars/2"), tf_value(tf, "optimizer/_variables/2"), "momentum");
  EXPECT_EQ(w.tensors.at("optimizer/vars/0").dtype(), DType::i64);
}

TEST(KerasH5, ReadsLegacyH5ModelFileByLayerAndWeightNames) {
  const WeightFile w = load_keras_h5(fixture("seed001", "model.h5"));  // Keras 3's legacy HDF5 model.save
  const SafetensorsFile tf = load_safetensors(fixture("seed001", "variables.safetensors"));
  const std::string q = "model_weights/multi_head_attention/multi_head_attention/query/kernel";
  ASSERT_TRUE(w.tensors.count(q));
  expect_same(w.tensors.at(q), tf_value(tf, "optimizer/_trainable_variables/0"), q);
  expect_same(w.tensors.at("model_weights/dense/dense/bias"), tf_value(tf, "optimizer/_trainable_variables/9"), "bias");
  int model = 0;
  for (const auto& e : w.entries) {
    if (e.optimizer) continue;
    ++model;
    EXPECT_EQ(e.key, "model_weights/" + e.name.substr(0, e.name.find('/')) + "/" + e.name) << e.key;
  }
  EXPECT_EQ(model, 10);
  EXPECT_EQ(w.entries.size(), 32u);
}

TEST(KerasH5, ReadsTfKeras2ModelAndWeightsFilesWithColonZeroNames) {
  const SafetensorsFile want = load_safetensors(fixture("keras_tf", "tfkeras2_expected.safetensors"));
  for (const char* file : {"tfkeras2_model.h5", "tfkeras2_weights.h5"}) {
    const WeightFile w = load_keras_h5(fixture("keras_tf", file));
    int model = 0;
    for (const auto& e : w.entries) {
      if (e.optimizer) continue;
      ++model;
      EXPECT_TRUE(e.key.ends_with(":0")) << e.key;
      expect_same(w.tensors.at(e.key), want.tensors.at(e.name + ":0"), e.key);
    }
    EXPECT_EQ(model, 10) << file;
  }
  EXPECT_TRUE(load_keras_h5(fixture("keras_tf", "tfkeras2_model.h5"))
                  .tensors.count("model_weights/multi_head_attention/multi_head_attention/query/kernel:0"));
}

TEST(KerasH5, InspectListsWithoutReadingData) {
  const auto entries = inspect_keras_h5(fixture("seed001", "model.weights.h5"));
  ASSERT_EQ(entries.size(), 32u);
  bool found = false;
  for (const auto& e : entries) {
    if (e.key == "layers/multi_head_attention/output_dense/vars/0") {
      found = true;
      EXPECT_EQ(e.shape, (Shape{2, 4, 3}));
      EXPECT_EQ(e.dtype, "float32");
    }
  }
  EXPECT_TRUE(found);
}

TEST(KerasH5, WriterRoundTripsEveryDtypeHdf5Holds) {
  const auto path = temp_path("w.weights.h5");
  std::map<std::string, Tensor> in;
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::i8, DType::i32, DType::i64, DType::b8}) {
    in["layers/t_" + std::string(dtype_name(dt)) + "/vars/0"] = Tensor::arange(6, DType::f64).reshape({2, 3}).to(dt);
  }
  in["scalar"] = Tensor::full({}, 2.5);
  save_keras_weights_h5(path, in);
  const WeightFile back = load_keras_h5(path);
  ASSERT_EQ(back.tensors.size(), in.size());
  for (const auto& [k, t] : in) {
    EXPECT_EQ(back.tensors.at(k).dtype(), t.dtype()) << k;
    expect_same(back.tensors.at(k), t, k);
  }
  EXPECT_THROW(save_keras_weights_h5(temp_path("b.weights.h5"), {{"x", Tensor::zeros({2}, DType::bf16)}}), DTypeError);
}

// A refused save leaves an existing file as it was: the refusal comes before the file is
// created. A bfloat16 tensor, a dataset that another path needs as a group, '.' and NUL in
// a path were refused by libhdf5 (or not at all) after the file was truncated, which left
// the tensors before the refusal in it ('a/b' after 'a': an IOError and a file with 'a'
// alone); 'a/./b' was written as 'a/b' and 'a\0b' as 'a'.
TEST(KerasH5, WriterRefusesBeforeTouchingTheFile) {
  const auto path = temp_path("keep.weights.h5");
  const Tensor kept = Tensor::arange(3, DType::f32);
  save_keras_weights_h5(path, {{"w", kept}});
  const auto refused = [&](const std::map<std::string, Tensor>& tensors) {
    SCOPED_TRACE(tensors.rbegin()->first);
    const auto before = read_bytes(path);
    try {
      save_keras_weights_h5(path, tensors);
      ADD_FAILURE() << "not refused";
    } catch (const Error& e) {  // ValueError, DTypeError for bfloat16
      EXPECT_TRUE(dynamic_cast<const ValueError*>(&e) || dynamic_cast<const DTypeError*>(&e)) << e.what();
      EXPECT_NE(std::string(e.what()).find("keep.weights.h5"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(read_bytes(path) == before) << "the existing file changed";
    EXPECT_THROW((void)serialize_keras_weights_h5(tensors), Error);
  };
  const Tensor x = Tensor::ones({2});
  refused({{"a", x}, {"b", Tensor::zeros({2}, DType::bf16)}});
  refused({{"a", x}, {"a/b", x}});
  refused({{"a", x}, {"a/b/c", x}, {"a-b", x}});
  refused({{"a", x}, {"a/./b", x}});
  refused({{"a", x}, {".", x}});
  refused({{"a", x}, {std::string("b\0c", 3), x}});
  refused({{"a", x}, {"b//c", x}});
  // '..' is a plain name to HDF5 (no parent links): written and read back as it is.
  save_keras_weights_h5(path, {{"a/../b", x}, {"a-b", x}});
  const WeightFile back = load_keras_h5(path);
  EXPECT_EQ(back.tensors.size(), 2u);
  EXPECT_EQ(back.tensors.count("a/../b"), 1u);
}

TEST(KerasH5, RejectsFilesThatAreNotHdf5OrAreTruncated) {
  EXPECT_THROW((void)parse_keras_h5(read_bytes(fixture("seed001", "probe_inputs.npy")), "x.h5"), FormatError);
  const auto h5 = read_bytes(fixture("seed001", "model.weights.h5"));
  for (size_t n : {size_t{8}, size_t{100}, size_t{2048}, h5.size() / 2}) {
    EXPECT_THROW((void)parse_keras_h5(std::span(h5).first(n), "x.h5"), FormatError) << n;
  }
  EXPECT_THROW((void)load_keras_h5(temp_path("missing.h5")), IOError);
}

TEST(KerasArchive, ReadsConfigAndWeightsOfAKerasZip) {
  const KerasArchive a = load_keras_archive(fixture("seed001", "model.keras"));
  EXPECT_NE(a.config_json.find("MultiHeadAttention"), std::string::npos);
  EXPECT_NE(a.metadata_json.find("keras_version"), std::string::npos);
  const SafetensorsFile tf = load_safetensors(fixture("seed001", "variables.safetensors"));
  for (const auto& [path, key] : kSeedPaths) expect_same(a.weights.tensors.at(path), tf_value(tf, key), path);
}

// qkv convert read a .keras input twice, for its weights and for its config.json; it reads
// both from one load_weights_and_config now, which must give what the two readers give.
TEST(KerasArchive, LoadWeightsAndConfigGivesWhatBothReadersGive) {
  const SafetensorsFile tf = load_safetensors(fixture("seed001", "variables.safetensors"));
  const KerasArchive a = load_weights_and_config(fixture("seed001", "model.keras"));
  const KerasArchive want = load_keras_archive(fixture("seed001", "model.keras"));
  EXPECT_EQ(a.config_json, want.config_json);
  EXPECT_EQ(a.metadata_json, want.metadata_json);
  ASSERT_EQ(a.weights.entries.size(), want.weights.entries.size());
  for (size_t i = 0; i < a.weights.entries.size(); ++i)
    EXPECT_EQ(a.weights.entries[i].key, want.weights.entries[i].key);
  for (const auto& [path, key] : kSeedPaths) expect_same(a.weights.tensors.at(path), tf_value(tf, key), path);
  const KerasArchive h5 = load_weights_and_config(fixture("seed001", "model.weights.h5"));  // no config: ""
  EXPECT_EQ(h5.config_json, "");
  EXPECT_EQ(h5.metadata_json, "");
  for (const auto& [path, key] : kSeedPaths) expect_same(h5.weights.tensors.at(path), tf_value(tf, key), path);
  EXPECT_THROW_WITH((void)load_weights_and_config("x.foo"), FormatError,
                    "load_weights_and_config: x.foo: unknown file extension '.foo'");
}

TEST(KerasArchive, RejectsCorruptArchives) {
  auto zip = read_bytes(fixture("seed001", "model.keras"));
  EXPECT_THROW((void)parse_keras_archive(std::span(zip).first(zip.size() - 30), "x.keras"), FormatError);
  EXPECT_THROW((void)parse_keras_archive(read_bytes(fixture("seed001", "model.h5")), "x.keras"), FormatError);
  // Flip a byte inside the first member's data: its crc32 no longer matches.
  zip[60] = static_cast<std::byte>(~static_cast<unsigned>(zip[60]));
  try {
    (void)parse_keras_archive(zip, "x.keras");
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("x.keras"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace qkv::io
