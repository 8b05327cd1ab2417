// The tf.keras .h5 and .keras writers against files tf_keras 2.21 and Keras 3.15
// wrote (tests/io/make_keras_tf_fixtures.py, tests/seed001/train_seed001.py): the
// same datasets, names, order and values; a generated config.json with the layers
// Keras wrote for seed 001. tests/io/check_writers_with_tf.py has real tf_keras
// and Keras load qkv's files.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string_view>

#include "io/io_test_util.h"
#include "qkv/io_keras.h"
#include "qkv/nn/keras_layers.h"

namespace qkv::io {
namespace {

// The layer view of weight files lives in qkv::nn (qkv/nn/keras_layers.h).
using nn::keras3_paths;
using nn::keras_config_layer_order;
using nn::keras_layer_weights;
using nn::keras_model_config;
using nn::LayerWeights;
using nn::save_keras_legacy_h5;

using testing::expect_same_values;
using testing::fixture;
using testing::temp_path;

TEST(KerasLegacyH5Writer, WritesTheDatasetsNamesAndValuesTfKerasWrote) {
  const WeightFile tf = load_keras_h5(fixture("keras_tf", "tfkeras2_weights.h5"));
  const LayerWeights layers = keras_layer_weights(tf);
  const auto path = temp_path("legacy.h5");
  save_keras_legacy_h5(path, layers, {"multi_head_attention", "dense"});
  const WeightFile ours = load_keras_h5(path);
  ASSERT_EQ(ours.entries.size(), tf.entries.size());
  for (const TensorInfo& want : tf.entries) {
    const auto it =
        std::find_if(ours.entries.begin(), ours.entries.end(), [&](const auto& e) { return e.key == want.key; });
    ASSERT_NE(it, ours.entries.end()) << want.key;
    EXPECT_EQ(it->name, want.name);
    EXPECT_EQ(it->dtype, want.dtype);
    expect_same_values(ours.tensors.at(want.key), tf.tensors.at(want.key), want.key);
  }
  // Our layer_names / weight_names are fixed-length strings, which qkv reads: the
  // entries come in model order and in Keras' weight order, as tf_keras loads them.
  const std::vector<std::string>& order = testing::kKerasMhaWeightsAsTfWrites;
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(ours.entries[i].key, "multi_head_attention/multi_head_attention/" + order[i] + ":0");
  }
  EXPECT_EQ(ours.entries[8].key, "dense/dense/kernel:0");
  EXPECT_EQ(ours.entries[9].key, "dense/dense/bias:0");
}

TEST(KerasLegacyH5Writer, RoundTripsDtypesScalarsAndEmptyTensors) {
  LayerWeights layers;
  layers["a"]["kernel"] = Tensor::from_vector<double>({1, 2, 3, 4, 5, 6}, {2, 3}).to(DType::f16);
  layers["a"]["bias"] = Tensor::from_vector<double>({}, {0}).to(DType::f64);
  layers["b"]["step"] = Tensor::from_vector<double>({7}, {}).to(DType::i64);
  const auto path = temp_path("dtypes.h5");
  save_keras_legacy_h5(path, layers, {"b"});
  const WeightFile back = load_keras_h5(path);
  ASSERT_EQ(back.entries.size(), 3u);
  EXPECT_EQ(back.entries[0].key, "b/b/step:0");  // b first, as ordered
  for (const auto& [layer, weights] : layers) {
    for (const auto& [name, t] : weights)
      expect_same_values(back.tensors.at(layer + "/" + layer + "/" + name + ":0"), t, name);
  }
  EXPECT_THROW(save_keras_legacy_h5(path, {{"x/y", {{"kernel", Tensor::ones({1})}}}}), ValueError);
}

// A refused layer list leaves an existing file as it was (checked before the file is
// created; a bfloat16 weight truncated the file, then failed in libhdf5's hands).
TEST(KerasLegacyH5Writer, RefusesBeforeTouchingTheFile) {
  const auto path = temp_path("keep_legacy.h5");
  save_keras_legacy_h5(path, {{"a", {{"kernel", Tensor::ones({2})}}}});
  const auto before = testing::read_bytes(path);
  const Tensor x = Tensor::ones({2});
  EXPECT_THROW(save_keras_legacy_h5(path, {{"a", {{"kernel", x}}}, {"b", {{"k", Tensor::ones({2}, DType::bf16)}}}}),
               DTypeError);
  EXPECT_THROW(io::save_keras_legacy_h5(path, {{"a", {{"k", x}}}, {"a", {{"k", x}}}}), ValueError);
  EXPECT_THROW(io::save_keras_legacy_h5(path, {{"a", {{"k", x}, {"k", x}}}}), ValueError);
  EXPECT_THROW(io::save_keras_legacy_h5(path, {{".", {{"k", x}}}}), ValueError);
  EXPECT_TRUE(testing::read_bytes(path) == before) << "the existing file changed";
}

TEST(KerasArchiveWriter, ConfigHasTheLayersKerasWroteForSeed001) {
  const KerasArchive keras = load_keras_archive(fixture("seed001", "model.keras"));
  const LayerWeights layers = keras_layer_weights(keras.weights);
  EXPECT_EQ(keras_config_layer_order(keras.config_json),
            (std::vector<std::string>{"input_layer", "multi_head_attention", "dense"}));
  const auto ours = nlohmann::json::parse(keras_model_config(layers, {"multi_head_attention", "dense"}));
  const auto want = nlohmann::json::parse(keras.config_json);
  EXPECT_EQ(ours["class_name"], want["class_name"]);
  EXPECT_EQ(ours["config"]["input_layers"], want["config"]["input_layers"]);
  EXPECT_EQ(ours["config"]["output_layers"], want["config"]["output_layers"]);
  const auto& ol = ours["config"]["layers"];
  const auto& wl = want["config"]["layers"];
  ASSERT_EQ(ol.size(), wl.size());
  for (size_t i = 0; i < ol.size(); ++i) {
    EXPECT_EQ(ol[i]["class_name"], wl[i]["class_name"]) << i;
    EXPECT_EQ(ol[i]["name"], wl[i]["name"]) << i;
    for (const char* k : {"num_heads", "key_dim", "value_dim", "use_bias", "units", "activation", "dropout"}) {
      EXPECT_EQ(ol[i]["config"].value(k, nlohmann::json()), wl[i]["config"].value(k, nlohmann::json()))
          << i << " " << k;
    }
    for (size_t n = 0; n < ol[i]["inbound_nodes"].size(); ++n) {
      const auto& oa = ol[i]["inbound_nodes"][n]["args"];
      const auto& wa = wl[i]["inbound_nodes"][n]["args"];
      ASSERT_EQ(oa.size(), wa.size());
      for (size_t a = 0; a < oa.size(); ++a)
        EXPECT_EQ(oa[a]["config"]["keras_history"], wa[a]["config"]["keras_history"]);
    }
  }
}

TEST(KerasArchiveWriter, RoundTripsThroughTheZipReader) {
  const KerasArchive keras = load_keras_archive(fixture("seed001", "model.keras"));
  const std::map<std::string, Tensor> paths = keras3_paths(keras_layer_weights(keras.weights));
  const auto path = temp_path("model.keras");
  save_keras_archive(path, paths, keras.config_json);
  const KerasArchive back = load_keras_archive(path);
  EXPECT_EQ(back.config_json, keras.config_json);
  EXPECT_EQ(nlohmann::json::parse(back.metadata_json)["keras_version"], "3.15.1");
  ASSERT_EQ(back.weights.tensors.size(), paths.size());
  for (const auto& [p, t] : paths) expect_same_values(back.weights.tensors.at(p), keras.weights.tensors.at(p), p);
  EXPECT_THROW(save_keras_archive(path, paths, "{not json"), ValueError);
}

// 4 levels around `arrays` arrays: {"config": {"layers": [{"name": "a", "x": [[...]]}]}}.
std::string nested_config(size_t arrays) {
  return R"({"config":{"layers":[{"name":"a","x":)" + std::string(arrays, '[') + std::string(arrays, ']') + "}]}}";
}

uint32_t crc32_of(std::string_view s) {  // zip's CRC-32 (reflected 0xEDB88320), bit by bit
  uint32_t c = 0xffffffffu;
  for (const char ch : s) {
    c ^= static_cast<uint8_t>(ch);
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0xedb88320u & (0u - (c & 1u)));
  }
  return ~c;
}

// A .keras archive at `path` holding `config` as its config.json, which save_keras_archive
// refuses to write past 1000 levels: written with a flat config of the same length
// ({... "x": 0<spaces>}), then the member's bytes and its crc32 (local and central header) replaced.
void write_archive_with_config(const std::filesystem::path& path, const std::map<std::string, Tensor>& paths,
                               const std::string& config) {
  const size_t x = config.find(R"("x":)") + 4;
  std::string flat = config.substr(0, x) + "0" + std::string(config.size() - x - 5, ' ') + "}]}}";
  ASSERT_EQ(flat.size(), config.size());
  save_keras_archive(path, paths, flat);
  std::vector<std::byte> zip = testing::read_bytes(path);
  const std::string_view bytes(reinterpret_cast<const char*>(zip.data()), zip.size());
  const size_t data = bytes.find(flat), central = bytes.rfind("config.json");
  ASSERT_NE(data, std::string_view::npos);
  ASSERT_EQ(bytes.substr(data - 11, 11), "config.json");  // 30-byte local header, the name, the data
  std::memcpy(zip.data() + data, config.data(), config.size());
  const uint32_t crc = crc32_of(config);
  for (const size_t at : {data - 11 - 30 + 14, central - 46 + 16}) {
    ASSERT_EQ(zip[at], static_cast<std::byte>(crc32_of(flat)));  // where the old crc32 was
    for (int i = 0; i < 4; ++i) zip[at + i] = static_cast<std::byte>(crc >> (8 * i));
  }
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(zip.data()), std::streamsize(zip.size()));
}

// A deflated config.json inflates up to 1 GiB (1032:1), and nlohmann builds JSON of any
// depth: 1 MB of '[' could ask for tens of GB. 1000 levels are read (Keras' Python json
// refuses about as many), 1001 are a FormatError naming the member, before anything is built.
TEST(KerasArchive, RejectsConfigNestedPastTheLimit) {
  const KerasArchive keras = load_keras_archive(fixture("seed001", "model.keras"));
  const std::map<std::string, Tensor> paths = keras3_paths(keras_layer_weights(keras.weights));
  const auto path = temp_path("deep.keras");
  save_keras_archive(path, paths, nested_config(996));
  EXPECT_EQ(keras_config_layer_order(load_keras_archive(path).config_json), std::vector<std::string>{"a"});
  for (const size_t arrays : {size_t{997}, size_t{1'000'000}}) {
    write_archive_with_config(path, paths, nested_config(arrays));
    EXPECT_THROW_WITH((void)load_keras_archive(path), FormatError,
                      path.string() + ": config.json nests JSON 1001 levels deep, more than the 1000 qkv reads");
    EXPECT_THROW_WITH((void)keras_config_layer_order(nested_config(arrays)), FormatError,
                      "keras_config_layer_order: config_json: it nests JSON 1001 levels deep");
  }
  write_archive_with_config(path, paths, nested_config(996));  // the patching itself reads back
  EXPECT_EQ(keras_config_layer_order(load_keras_archive(path).config_json), std::vector<std::string>{"a"});
  EXPECT_THROW_WITH((void)keras_config_layer_order("{not json"), FormatError,
                    "keras_config_layer_order: config_json: it is not valid JSON: ");
}

// The writer refused only invalid JSON: it wrote 1001 levels, which load_keras_archive then
// refused. It refuses them now, with the reader's limit, before the file is touched.
TEST(KerasArchiveWriter, RefusesConfigNestedPastTheReadersLimit) {
  const KerasArchive keras = load_keras_archive(fixture("seed001", "model.keras"));
  const std::map<std::string, Tensor> paths = keras3_paths(keras_layer_weights(keras.weights));
  const auto path = temp_path("deep_written.keras");
  save_keras_archive(path, paths, nested_config(996));  // 1000 levels: written and read back
  EXPECT_EQ(load_keras_archive(path).config_json, nested_config(996));
  const auto before = testing::read_bytes(path);
  for (const size_t arrays : {size_t{997}, size_t{1'000'000}}) {
    EXPECT_THROW_WITH(save_keras_archive(path, paths, nested_config(arrays)), ValueError,
                      "save_keras_archive: " + path.string() +
                          ": config_json nests JSON 1001 levels deep, more than the 1000 qkv reads");
  }
  EXPECT_THROW_WITH(save_keras_archive(path, paths, "{not json"), ValueError,
                    "save_keras_archive: " + path.string() + ": config_json is not valid JSON: ");
  EXPECT_TRUE(testing::read_bytes(path) == before) << "the existing archive changed";
}

// The CLI restated the reader's check for `qkv convert --config`; io::check_keras_config is
// the reader's own: 1000 levels pass, 1001 and invalid JSON are the reader's FormatError.
TEST(KerasArchive, CheckKerasConfigIsTheReadersCheck) {
  check_keras_config(nested_config(996), "ok.json");  // 1000 levels, as the reader reads them
  for (const size_t arrays : {size_t{997}, size_t{1'000'000}}) {
    EXPECT_THROW_WITH(check_keras_config(nested_config(arrays), "deep.json"), FormatError,
                      "check_keras_config: deep.json: config.json nests JSON 1001 levels deep, more than the 1000 qkv "
                      "reads (Python's json, which Keras reads it with, refuses about 1000)");
  }
  EXPECT_THROW_WITH(check_keras_config("{not json", "bad.json"), FormatError,
                    "check_keras_config: bad.json: config.json is not valid JSON: [json.exception.parse_error.");
}

// The limit is written once (qkv/io_keras.h): nn's is the same constant, and every check,
// nn::keras_config_layer_order's included, passes kMaxKerasConfigLevels levels and refuses one
// more with that number in its message (built from the constant, not written again).
TEST(KerasArchive, OneConfigLimitForIoAndNn) {
  constexpr const int* nn_limit = &nn::kMaxKerasConfigLevels;  // one object, not an equal copy
  static_assert(nn_limit == &kMaxKerasConfigLevels, "nn's limit is io's");
  const auto levels = static_cast<size_t>(kMaxKerasConfigLevels);
  const std::string more =
      std::to_string(levels + 1) + " levels deep, more than the " + std::to_string(levels) + " qkv";
  EXPECT_EQ(keras_config_layer_order(nested_config(levels - 4)), std::vector<std::string>{"a"});
  check_keras_config(nested_config(levels - 4), "ok.json");
  EXPECT_THROW_WITH(check_keras_config(nested_config(levels - 3), "deep.json"), FormatError,
                    "check_keras_config: deep.json: config.json nests JSON " + more);
  EXPECT_THROW_WITH(keras_config_layer_order(nested_config(levels - 3)), FormatError,
                    "keras_config_layer_order: config_json: it nests JSON " + more);
}

// metadata.json was only checked to be JSON: 10^6 levels were written. Keras 3.15's
// KerasFileEditor json.loads it (Python's json refuses about 1000), so the writer holds it to
// config.json's limit, before the file is touched; 1000 levels are written as given.
TEST(KerasArchiveWriter, RefusesMetadataNestedPastTheLimit) {
  const KerasArchive keras = load_keras_archive(fixture("seed001", "model.keras"));
  const std::map<std::string, Tensor> paths = keras3_paths(keras_layer_weights(keras.weights));
  const auto path = temp_path("deep_metadata.keras");
  save_keras_archive(path, paths, keras.config_json, nested_config(996));
  EXPECT_EQ(load_keras_archive(path).metadata_json, nested_config(996));
  const auto before = testing::read_bytes(path);
  for (const size_t arrays : {size_t{997}, size_t{1'000'000}}) {
    EXPECT_THROW_WITH(save_keras_archive(path, paths, keras.config_json, nested_config(arrays)), ValueError,
                      "save_keras_archive: " + path.string() +
                          ": metadata_json nests JSON 1001 levels deep, more than the 1000 qkv reads");
  }
  EXPECT_THROW_WITH(save_keras_archive(path, paths, keras.config_json, "{not json"), ValueError,
                    "save_keras_archive: " + path.string() + ": metadata_json is not valid JSON: ");
  EXPECT_TRUE(testing::read_bytes(path) == before) << "the existing archive changed";
}

TEST(KerasArchiveWriter, InMemoryWeightsFileParsesAsWritten) {
  const std::map<std::string, Tensor> t = {{"layers/d/vars/0", Tensor::ones({2, 2})},
                                           {"layers/d/vars/1", Tensor::from_vector<double>({}, {0}).to(DType::f32)}};
  const WeightFile back = parse_keras_h5(serialize_keras_weights_h5(t), "memory");
  ASSERT_EQ(back.tensors.size(), 2u);
  for (const auto& [p, v] : t) expect_same_values(back.tensors.at(p), v, p);
}

}  // namespace
}  // namespace qkv::io
