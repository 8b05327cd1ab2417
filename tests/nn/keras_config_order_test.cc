// nn::keras_config_layer_order reads config.layers[].name without building the config:
// the names of odd configs are those of nlohmann's tree of them (what it returned when it
// built one), and a wide config costs its text, not a tree of it (checked in a child
// process under an address-space limit). Depth and invalid JSON: tests/io/keras_writers_test.cc.
#include <gtest/gtest.h>

#include <cstring>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/io_test_util.h"
#include "io/keras_tf/isolated.h"
#include "qkv/io_keras.h"
#include "qkv/nn/keras_layers.h"

namespace qkv::nn {
namespace {

// The oracle: the layer names read off nlohmann's tree of the whole config.
std::vector<std::string> names_of_tree(const std::string& config_json) {
  std::vector<std::string> out;
  const auto j = nlohmann::json::parse(config_json);
  if (!j.is_object() || !j.contains("config") || !j["config"].is_object()) return out;
  const auto& layers = j["config"].value("layers", nlohmann::json::array());
  if (!layers.is_array()) return out;
  for (const auto& l : layers) {
    if (l.is_object() && l.contains("name") && l["name"].is_string()) out.push_back(l["name"].get<std::string>());
  }
  return out;
}

TEST(KerasConfigLayerOrder, NamesAreThoseOfTheWholeTree) {
  const std::vector<std::string> configs = {
      R"({"config": {"layers": [{"name": "a"}, {"name": "b"}, {"name": "c"}]}})",
      R"({"config": {"layers": [{"name": "a", "config": {"name": "inner"}}, {"x": 1, "name": "b"}]}})",
      // skipped: not an object, no name, a name that is not a string, nested lists
      R"({"config": {"layers": [1, "a", null, [{"name": "x"}], {"nom": "y"}, {"name": 3}, {"name": ["z"]},
          {"name": {"name": "w"}}, {"name": "ok"}]}})",
      // a key given twice keeps its last value
      R"({"config": {"layers": [{"name": "a"}]}, "config": {"layers": [{"name": "b"}]}})",
      R"({"config": {"layers": [{"name": "a"}]}, "config": 1})",
      R"({"config": {"layers": [{"name": "a"}], "layers": [{"name": "b"}, {"name": "c"}]}})",
      R"({"config": {"layers": [{"name": "a"}], "layers": {"name": "b"}}})",
      R"({"config": {"layers": [{"name": "a", "name": "b"}, {"name": "c", "name": 1}, {"name": 1, "name": "d"}]}})",
      // off the path: no layers
      R"({"layers": [{"name": "a"}], "x": {"config": {"layers": [{"name": "b"}]}}})",
      R"({"config": [{"layers": [{"name": "a"}]}]})",
      R"({"config": {"layers": "a"}})",
      R"({"config": {"layer": [{"name": "a"}]}})",
      R"({"config": {"config": {"layers": [{"name": "a"}]}}})",
      R"([{"config": {"layers": [{"name": "a"}]}}])",
      R"("config")",
      R"(null)",
      R"({})",
      R"({"config": {"layers": []}})",
      R"({"config": {"layers": [{}, {"name": ""}, {"name": "\u00e9\"\\"}]}, "name": "top"})",
  };
  for (const std::string& c : configs) EXPECT_EQ(keras_config_layer_order(c), names_of_tree(c)) << c;
  const std::string seed = io::load_keras_archive(io::testing::fixture("seed001", "model.keras")).config_json;
  EXPECT_EQ(keras_config_layer_order(seed), (std::vector<std::string>{"input_layer", "multi_head_attention", "dense"}));
  EXPECT_EQ(keras_config_layer_order(seed), names_of_tree(seed));
}

// 4M zeros (8 MB of text) beside the layers: nlohmann's tree of them takes 64 MB and more
// (16 bytes a value, the vector's growth), the names alone take next to nothing. The child
// may add 32 MiB of address space to the text it inherits.
TEST(KerasConfigLayerOrder, AWideConfigCostsItsTextNotATree) {
  std::string wide = R"({"x": [)";
  for (int i = 0; i < 4'000'000; ++i) wide += "0,";
  wide += R"(0], "config": {"layers": [{"name": "a"}, {"name": "b"}], "y": [[], {}, 1.5, "s"]}})";
  io::detail::IsolationOptions o;
  o.failure = "keras_config_layer_order failed";
  o.timeout = std::chrono::seconds(60);
  o.memory_bytes = size_t{32} << 20;
  const auto out = io::detail::run_isolated({"test", "wide config"}, o, [&] {
    std::string joined;
    for (const std::string& n : keras_config_layer_order(wide)) joined += n + ",";
    std::vector<std::byte> b(joined.size());
    std::memcpy(b.data(), joined.data(), joined.size());
    return io::detail::reply_of(std::move(b));
  });
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out->data()), out->nbytes()), "a,b,");
}

}  // namespace
}  // namespace qkv::nn
