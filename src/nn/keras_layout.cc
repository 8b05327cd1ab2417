// What the Keras writers need beyond the tensors: the model order of layers (tf.keras
// .h5 files and TF checkpoints match layers by position), the order of a layer's
// weights (Keras' own: query kernel, query bias, key..., value..., output...), the
// keys tf.keras model.save_weights(prefix) gives them, and a Keras 3 config.json
// for a chain of MultiHeadAttention / Dense layers.
#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "io/json_nesting.h"
#include "io/keras_tf/keras_config.h"
#include "qkv/error.h"
#include "qkv/nn/keras_layers.h"

namespace qkv::nn {
namespace {

using ojson = nlohmann::ordered_json;

bool is_mha(const std::map<std::string, Tensor>& weights) { return weights.count("query/kernel") != 0; }

// tf.keras' attribute name of an MHA part: _query_dense, ..., _output_dense.
std::string tf_keras_sublayer(const std::string& part) {
  return part == "attention_output" ? "_output_dense" : "_" + part + "_dense";
}

const Tensor& need(const std::map<std::string, Tensor>& w, const std::string& layer, const std::string& name) {
  const auto it = w.find(name);
  if (it == w.end()) {
    fail<ValueError>("keras_model_config: layer '", layer, "' has no weight '", name,
                     "'; give the model's config.json instead");
  }
  return it->second;
}

ojson dtype_policy() {
  return {{"module", "keras"},
          {"class_name", "DTypePolicy"},
          {"config", {{"name", "float32"}}},
          {"registered_name", nullptr}};
}

ojson initializer(const char* cls, ojson config) {
  return {{"module", "keras.initializers"},
          {"class_name", cls},
          {"config", std::move(config)},
          {"registered_name", nullptr}};
}

ojson keras_tensor(const ojson& shape, const std::string& from) {
  return {{"class_name", "__keras_tensor__"},
          {"config", {{"shape", shape}, {"dtype", "float32"}, {"keras_history", {from, 0, 0}}}}};
}

ojson layer_entry(const char* cls, const std::string& name, ojson config, ojson build, ojson args) {
  return {{"module", "keras.layers"},
          {"class_name", cls},
          {"config", std::move(config)},
          {"registered_name", nullptr},
          {"build_config", std::move(build)},
          {"name", name},
          {"inbound_nodes", {{{"args", std::move(args)}, {"kwargs", ojson::object()}}}}};
}

ojson common_config(const std::string& name) {
  const ojson glorot =
      initializer("GlorotUniform", {{"seed", nullptr}, {"input_axes", nullptr}, {"output_axes", nullptr}});
  return {{"name", name},
          {"trainable", true},
          {"dtype", dtype_policy()},
          {"kernel_initializer", glorot},
          {"bias_initializer", initializer("Zeros", ojson::object())},
          {"kernel_regularizer", nullptr},
          {"bias_regularizer", nullptr},
          {"kernel_constraint", nullptr},
          {"bias_constraint", nullptr}};
}

// One MHA layer applied to itself (query = value = the previous output of `dim`
// features); returns its output's features.
int64_t mha_layer(const std::string& name, const std::map<std::string, Tensor>& w, int64_t dim, const std::string& from,
                  ojson& layers) {
  const Tensor& q = need(w, name, "query/kernel");
  const Tensor& v = need(w, name, "value/kernel");
  const Tensor& o = need(w, name, "attention_output/kernel");
  const Tensor& k = need(w, name, "key/kernel");
  if (q.dim() != 3 || k.dim() != 3 || v.dim() != 3 || o.dim() != 3 || q.size(0) != dim || k.size(0) != dim ||
      v.size(0) != dim) {
    fail<ValueError>("keras_model_config: layer '", name, "': kernels ", shape_str(q.shape()), " ",
                     shape_str(k.shape()), " ", shape_str(v.shape()), " are not those of self-attention over ", dim,
                     " features; the layers are not in model order (pass the model order, or the model's config.json)");
  }
  const int64_t out = o.size(2);
  ojson c = common_config(name);
  c["num_heads"] = q.size(1);
  c["key_dim"] = q.size(2);
  c["value_dim"] = v.size(2);
  c["dropout"] = 0.0;
  c["use_bias"] = w.count("query/bias") != 0;
  c["use_gate"] = w.count(std::string(kKerasMhaGatePart) + "/kernel") != 0;
  c["output_shape"] = out == dim ? ojson(nullptr) : ojson::array({out});
  c["attention_axes"] = nullptr;
  c["sliding_window"] = nullptr;
  c["activity_regularizer"] = nullptr;
  c["seed"] = nullptr;
  const ojson shape = {nullptr, nullptr, dim};
  layers.push_back(layer_entry("MultiHeadAttention", name, std::move(c),
                               {{"shapes_dict", {{"query_shape", shape}, {"value_shape", shape}}}},
                               {keras_tensor(shape, from), keras_tensor(shape, from)}));
  return out;
}

int64_t dense_layer(const std::string& name, const std::map<std::string, Tensor>& w, int64_t dim,
                    const std::string& from, ojson& layers) {
  const Tensor& k = need(w, name, "kernel");
  if (k.dim() != 2 || k.size(0) != dim) {
    fail<ValueError>("keras_model_config: layer '", name, "': kernel ", shape_str(k.shape()), " does not take ", dim,
                     " features; the layers are not in model order (pass the model order, or the model's config.json)");
  }
  ojson c = common_config(name);
  c["units"] = k.size(1);
  c["activation"] = "linear";
  c["use_bias"] = w.count("bias") != 0;
  c["quantization_config"] = nullptr;
  const ojson shape = {nullptr, nullptr, dim};
  layers.push_back(layer_entry("Dense", name, std::move(c), {{"input_shape", shape}}, {keras_tensor(shape, from)}));
  return k.size(1);
}

// The feature count the first layer takes.
int64_t input_features(const std::string& name, const std::map<std::string, Tensor>& w) {
  const Tensor& k = need(w, name, is_mha(w) ? "query/kernel" : "kernel");
  if (k.dim() < 2)
    fail<ValueError>("keras_model_config: layer '", name, "': kernel ", shape_str(k.shape()), " has no input axis");
  return k.size(0);
}

// config.layers[].name of a Keras config.json, by nlohmann's SAX events: only the names are
// kept, so a wide file (a 1 GiB [0,0,...] beside the layers) costs its text, not a tree
// of it (16+ bytes a value). As nlohmann's tree read it: a key given twice keeps its last
// value, a layer without a string name is skipped, anything else off the path gives no
// layers. The nesting limit and the errors are parse_json_nesting_at_most's.
class LayerNames {
 public:
  LayerNames(const io::detail::JsonNesting& limit, const io::detail::Context& ctx) : limit_(limit), ctx_(ctx) {}
  std::vector<std::string> names;

  bool null() { return scalar(nullptr); }
  bool boolean(bool) { return scalar(nullptr); }
  bool number_integer(nlohmann::json::number_integer_t) { return scalar(nullptr); }
  bool number_unsigned(nlohmann::json::number_unsigned_t) { return scalar(nullptr); }
  bool number_float(nlohmann::json::number_float_t, const std::string&) { return scalar(nullptr); }
  bool string(std::string& s) { return scalar(&s); }
  bool binary(nlohmann::json::binary_t&) { return scalar(nullptr); }
  bool start_object(std::size_t) { return open(nlohmann::json::parse_event_t::object_start); }
  bool start_array(std::size_t) { return open(nlohmann::json::parse_event_t::array_start); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& k) {
    Frame& f = stack_.back();
    const bool on_path = (f.role == Role::kRoot && k == "config") || (f.role == Role::kConfig && k == "layers") ||
                         (f.role == Role::kLayer && k == "name");
    f.next = on_path ? child_of(f.role) : Role::kOther;
    return true;
  }
  [[noreturn]] bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& e) {
    io::detail::fail_invalid_json(e, limit_, ctx_);
  }

 private:
  // kName: a layer's "name"; the others: containers on the path config.layers[i].
  enum class Role { kOther, kRoot, kConfig, kLayers, kLayer, kName };
  struct Frame {
    Role role;
    Role next = Role::kOther;         // the role of the object's value after the last key
    std::optional<std::string> name;  // a kLayer's string "name", so far
  };
  static Role child_of(Role r) {
    switch (r) {
      case Role::kRoot: return Role::kConfig;
      case Role::kConfig: return Role::kLayers;
      case Role::kLayers: return Role::kLayer;
      case Role::kLayer: return Role::kName;
      default: return Role::kOther;
    }
  }
  // The role of the value starting now: the top one is the root; an array's elements
  // are layers in "layers", off the path elsewhere. A new "config" or "layers" replaces
  // the one before (nlohmann keeps a key's last value), layers and all.
  Role starting() {
    if (stack_.empty()) return Role::kRoot;
    const Frame& f = stack_.back();
    const Role r = f.role == Role::kLayers ? Role::kLayer : f.next;
    if (r == Role::kConfig || r == Role::kLayers) names.clear();
    return r;
  }
  bool scalar(const std::string* s) {
    if (starting() == Role::kName) stack_.back().name = s ? std::optional<std::string>(*s) : std::nullopt;
    return true;
  }
  bool open(nlohmann::json::parse_event_t event) {
    io::detail::check_json_nesting(static_cast<int>(stack_.size()), event, limit_, ctx_);
    Role r = starting();
    const bool object = event == nlohmann::json::parse_event_t::object_start;
    if (r == Role::kName) stack_.back().name.reset();
    if (object != (r == Role::kRoot || r == Role::kConfig || r == Role::kLayer) || r == Role::kName) r = Role::kOther;
    stack_.push_back({r, Role::kOther, std::nullopt});
    return true;
  }
  bool close() {
    if (stack_.back().role == Role::kLayer && stack_.back().name) names.push_back(std::move(*stack_.back().name));
    stack_.pop_back();
    return true;
  }

  const io::detail::JsonNesting limit_;  // a copy: it is given as a temporary
  const io::detail::Context& ctx_;
  std::vector<Frame> stack_;
};

}  // namespace

std::vector<std::string> ordered_layers(const LayerWeights& layers, const std::vector<std::string>& order) {
  std::vector<std::string> out;
  for (const std::string& name : order) {
    if (layers.count(name) && std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  for (const auto& [name, w] : layers) {
    if (std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

std::vector<std::string> keras_weight_order(const std::map<std::string, Tensor>& weights) {
  std::vector<std::string> out;
  auto take = [&](const std::string& n) {
    if (weights.count(n) && std::find(out.begin(), out.end(), n) == out.end()) out.push_back(n);
  };
  for (const char* part : {"query", "key", kKerasMhaGatePart, "value", "attention_output"}) {
    take(std::string(part) + "/kernel");
    take(std::string(part) + "/bias");
  }
  take("kernel");
  take("bias");
  for (const auto& [n, t] : weights) take(n);
  return out;
}

namespace {

// i of a tf.keras checkpoint key "layer_with_weights-<i>/...", else -1 (keys
// without a number keep their order after the numbered ones).
int64_t layer_with_weights_index(const std::string& key) {
  static constexpr std::string_view kPrefix = "layer_with_weights-";
  if (!key.starts_with(kPrefix)) return -1;
  int64_t i = 0;
  size_t at = kPrefix.size();
  for (; at < key.size() && key[at] >= '0' && key[at] <= '9' && i < (int64_t{1} << 40); ++at)
    i = i * 10 + (key[at] - '0');
  return at > kPrefix.size() && at < key.size() && key[at] == '/' ? i : -1;
}

}  // namespace

std::vector<std::string> keras_layer_order(const io::WeightFile& file) {
  const LayerWeights layers = keras_layer_weights(file);
  // A checkpoint's keys sort layer_with_weights-10 before -2: order by the number.
  std::vector<io::TensorInfo> entries = file.entries;
  std::stable_sort(entries.begin(), entries.end(), [](const io::TensorInfo& a, const io::TensorInfo& b) {
    const auto rank = [](const std::string& key) {
      const int64_t i = layer_with_weights_index(key);
      return i < 0 ? std::numeric_limits<int64_t>::max() : i;
    };
    return rank(a.key) < rank(b.key);
  });
  std::vector<std::string> out;
  for (const io::TensorInfo& e : entries) {
    for (const auto& [layer, w] : layers) {
      (void)w;
      const bool match =
          e.name == layer || e.name.starts_with(layer + "/") || e.key.starts_with("layers/" + layer + "/");
      if (match && std::find(out.begin(), out.end(), layer) == out.end()) out.push_back(layer);
    }
  }
  return ordered_layers(layers, out);
}

void save_keras_legacy_h5(const std::filesystem::path& path, const LayerWeights& layers,
                          const std::vector<std::string>& order) {
  std::vector<io::LegacyH5Layer> ordered;  // every layer: ordered_layers appends those not in `order`
  for (const std::string& name : ordered_layers(layers, order)) {
    io::LegacyH5Layer layer{name, {}};
    const auto& weights = layers.at(name);
    for (const std::string& w : keras_weight_order(weights)) layer.weights.emplace_back(w, weights.at(w));
    ordered.push_back(std::move(layer));
  }
  io::save_keras_legacy_h5(path, ordered);
}

TfKerasCheckpoint tf_keras_checkpoint_keys(const LayerWeights& layers, const std::vector<std::string>& order) {
  TfKerasCheckpoint out;
  int index = 0;
  for (const std::string& layer : ordered_layers(layers, order)) {
    const auto& weights = layers.at(layer);
    if (weights.empty()) continue;
    const std::string base = "layer_with_weights-" + std::to_string(index++) + "/";
    for (const auto& [w, t] : weights) {
      const auto slash = w.rfind('/');
      const std::string part = slash == std::string::npos ? "" : w.substr(0, slash);
      const bool sub = part == kKerasMhaGatePart || std::find(std::begin(kKerasMhaParts), std::end(kKerasMhaParts),
                                                              part) != std::end(kKerasMhaParts);
      const std::string path = sub ? tf_keras_sublayer(part) + "/" + w.substr(slash + 1) : w;
      const std::string key = base + path + "/.ATTRIBUTES/VARIABLE_VALUE";
      out.tensors[key] = t;
      out.full_names[key] = layer + "/" + w;
    }
  }
  return out;
}

std::vector<std::string> keras_config_layer_order(const std::string& config_json) {
  const io::detail::Context ctx{"keras_config_layer_order", "config_json"};
  LayerNames names(io::detail::keras_config_nesting("it"), ctx);
  nlohmann::json::sax_parse(config_json, &names);  // throws on errors (LayerNames::parse_error)
  return std::move(names.names);
}

std::string keras_model_config(const LayerWeights& layers, const std::vector<std::string>& order) {
  const std::vector<std::string> names = ordered_layers(layers, order);
  if (names.empty()) fail<ValueError>("keras_model_config: no layers");
  int64_t dim = input_features(names.front(), layers.at(names.front()));
  ojson list = ojson::array();
  list.push_back({{"module", "keras.layers"},
                  {"class_name", "InputLayer"},
                  {"config",
                   {{"batch_shape", {nullptr, nullptr, dim}},
                    {"dtype", "float32"},
                    {"sparse", false},
                    {"ragged", false},
                    {"name", "input_layer"},
                    {"optional", false}}},
                  {"registered_name", nullptr},
                  {"name", "input_layer"},
                  {"inbound_nodes", ojson::array()}});
  std::string from = "input_layer";
  for (const std::string& name : names) {
    if (name == "input_layer") fail<ValueError>("keras_model_config: a weight layer is named 'input_layer'");
    const auto& w = layers.at(name);
    dim = is_mha(w) ? mha_layer(name, w, dim, from, list) : dense_layer(name, w, dim, from, list);
    from = name;
  }
  const ojson config = {{"module", "keras.src.models.functional"},
                        {"class_name", "Functional"},
                        {"config",
                         {{"name", "functional"},
                          {"trainable", true},
                          {"layers", list},
                          {"input_layers", {"input_layer", 0, 0}},
                          {"output_layers", {from, 0, 0}}}},
                        {"registered_name", "Functional"},
                        {"build_config", {{"input_shape", nullptr}}}};
  return config.dump();
}

}  // namespace qkv::nn
