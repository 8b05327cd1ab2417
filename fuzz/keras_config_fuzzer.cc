// libFuzzer target: a .keras config.json on arbitrary text, through the places that
// read one: nn::keras_config_layer_order (config.layers[].name by nlohmann's SAX events,
// src/nn/keras_layout.cc), io::check_keras_config (what qkv convert --config calls), the
// .keras reader's check (parse_keras_archive of a stored zip holding the text as
// config.json) and save_keras_archive's check of config_json. Seeds: fuzz/corpus/keras_config
// (the committed fixtures' config.json and hand-made ones).
//
// The oracle is nlohmann's whole tree of the text (what keras_config_layer_order read
// before it went to SAX events): the text is refused when nlohmann refuses it or when
// it nests more than kMaxKerasConfigLevels objects and arrays; otherwise the names are
// the string "name"s of the objects in config.layers, in order. A qkv::Error other than
// FormatError (the readers) or ValueError (the writer), a refusal or an acceptance the
// oracle disagrees with, or names that differ from the tree's are findings (abort).
#include <zlib.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "qkv/error.h"
#include "qkv/io_keras.h"
#include "qkv/nn/keras_layers.h"

namespace {

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "keras_config_fuzzer: %s: %s\n", what, detail.c_str());
  std::abort();
}

// Objects and arrays inside one another, the outermost counted (0 for a scalar); a
// walk with its own stack (an input may nest as deep as it is long).
int levels(const nlohmann::json& root) {
  int deepest = 0;
  std::vector<std::pair<const nlohmann::json*, int>> todo{{&root, 0}};
  while (!todo.empty()) {
    const auto [j, around] = todo.back();
    todo.pop_back();
    if (!j->is_structured()) continue;
    deepest = std::max(deepest, around + 1);
    for (const auto& child : *j) todo.emplace_back(&child, around + 1);
  }
  return deepest;
}

// The tree's answer: nullopt when the text is to be refused, else config.layers[].name.
std::optional<std::vector<std::string>> expected_names(const std::string& text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
  if (levels(j) > qkv::nn::kMaxKerasConfigLevels) return std::nullopt;
  std::vector<std::string> names;
  if (!j.is_object() || !j.contains("config") || !j["config"].is_object()) return names;
  const nlohmann::json& config = j["config"];
  if (!config.contains("layers") || !config["layers"].is_array()) return names;
  for (const auto& layer : config["layers"]) {
    if (layer.is_object() && layer.contains("name") && layer["name"].is_string()) names.push_back(layer["name"]);
  }
  return names;
}

void put(std::string& out, uint32_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((v >> (8 * i)) & 0xffu);
}

// A zip holding `text` as its one stored member config.json (no model.weights.h5: the
// reader checks config.json first, then says the weights are missing).
std::string zip_with_config(const std::string& text) {
  static const std::string kName = "config.json";
  const auto crc =
      static_cast<uint32_t>(::crc32(0L, reinterpret_cast<const Bytef*>(text.data()), static_cast<uInt>(text.size())));
  const auto fields = [&](std::string& out) {
    put(out, 20, 2);  // version needed
    put(out, 0, 2);   // flags
    put(out, 0, 2);   // stored
    put(out, 0, 4);   // time, date
    put(out, crc, 4);
    put(out, static_cast<uint32_t>(text.size()), 4);
    put(out, static_cast<uint32_t>(text.size()), 4);
    put(out, static_cast<uint32_t>(kName.size()), 2);
    put(out, 0, 2);  // extra length
  };
  std::string out;
  put(out, 0x04034b50, 4);
  fields(out);
  out += kName + text;
  const auto cd_offset = static_cast<uint32_t>(out.size());
  std::string central;
  put(central, 0x02014b50, 4);
  put(central, 20, 2);  // version made by
  fields(central);
  put(central, 0, 2);  // comment length
  put(central, 0, 2);  // disk
  put(central, 0, 2);  // internal attributes
  put(central, 0, 4);  // external attributes
  put(central, 0, 4);  // local header offset
  central += kName;
  out += central;
  put(out, 0x06054b50, 4);
  put(out, 0, 4);  // disks
  put(out, 1, 2);
  put(out, 1, 2);
  put(out, static_cast<uint32_t>(central.size()), 4);
  put(out, cd_offset, 4);
  put(out, 0, 2);  // comment length
  return out;
}

// Messages quote the bytes nlohmann read, which may hold any words: compare their start
// ("<op>: <source>: <what>").
bool starts(const char* message, const char* prefix) { return std::string_view(message).starts_with(prefix); }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const std::optional<std::vector<std::string>> want = expected_names(text);

  // keras_config_layer_order: the names, or a FormatError naming it.
  try {
    const std::vector<std::string> got = qkv::nn::keras_config_layer_order(text);
    if (!want) finding("keras_config_layer_order accepted what the tree refuses", text.substr(0, 200));
    if (got != *want) finding("keras_config_layer_order's names differ from the tree's", text.substr(0, 200));
  } catch (const qkv::FormatError& e) {
    if (want) finding("keras_config_layer_order refused what the tree accepts", e.what());
    if (!starts(e.what(), "keras_config_layer_order: config_json: it "))
      finding("a refusal that does not name the op", e.what());
  }

  // io::check_keras_config: nothing, or a FormatError naming it and the source.
  try {
    qkv::io::check_keras_config(text, "fuzz.json");
    if (!want) finding("check_keras_config accepted what the tree refuses", text.substr(0, 200));
  } catch (const qkv::FormatError& e) {
    if (want) finding("check_keras_config refused what the tree accepts", e.what());
    if (!starts(e.what(), "check_keras_config: fuzz.json: config.json "))
      finding("a refusal that does not name the op", e.what());
  }

  // The reader: config.json refused, or accepted and then "no model.weights.h5".
  const std::string zip = zip_with_config(text);
  try {
    (void)qkv::io::parse_keras_archive(std::as_bytes(std::span(zip.data(), zip.size())), "fuzz.keras");
    finding("parse_keras_archive read an archive without weights", text.substr(0, 200));
  } catch (const qkv::FormatError& e) {
    const bool accepted = starts(e.what(), "parse_keras_archive: fuzz.keras: no model.weights.h5");
    if (!accepted && !starts(e.what(), "parse_keras_archive: fuzz.keras: config.json "))
      finding("another error", e.what());
    if (accepted != want.has_value())
      finding("parse_keras_archive's config.json check disagrees with the tree", e.what());
  }

  // The writer: config_json refused, or accepted and then the (invalid) metadata refused,
  // before anything is built or written.
  try {
    qkv::io::save_keras_archive("/nonexistent-qkv-fuzz/out.keras", {}, text, "{");
    finding("save_keras_archive wrote with invalid metadata", text.substr(0, 200));
  } catch (const qkv::ValueError& e) {
    const bool accepted = starts(e.what(), "save_keras_archive: /nonexistent-qkv-fuzz/out.keras: metadata_json ");
    if (!accepted && !starts(e.what(), "save_keras_archive: /nonexistent-qkv-fuzz/out.keras: config_json "))
      finding("another error", e.what());
    if (accepted != want.has_value())
      finding("save_keras_archive's config_json check disagrees with the tree", e.what());
  }
  return 0;
}
