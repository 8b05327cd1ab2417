// Weight files seen as layers: Keras 3 paths, tf.keras names and TF checkpoint
// names all become layer -> {"query/kernel", ..., "kernel", "bias"} (qkv/nn/keras_layers.h).
#include "qkv/nn/keras_layers.h"

#include <algorithm>

#include "qkv/error.h"

namespace qkv::nn {
namespace {

constexpr std::string_view kValueSuffix = "/.ATTRIBUTES/VARIABLE_VALUE";

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out(1);
  for (char c : s) {
    if (c == '/')
      out.emplace_back();
    else
      out.back() += c;
  }
  return out;
}

std::string join(const std::vector<std::string>& parts, size_t n) {
  std::string out;
  for (size_t i = 0; i < n; ++i) out += (i ? "/" : "") + parts[i];
  return out;
}

// "query_dense" / "_query_dense" / "query" -> "query"; "" when not an MHA sublayer. Keras
// 3.15's use_gate adds "_gate_dense" (Keras 3 paths keep its underscore) / "gate".
std::string mha_part(std::string s) {
  if (s.starts_with("_")) s.erase(0, 1);
  if (s == "output_dense") return "attention_output";
  if (s.ends_with("_dense")) s.resize(s.size() - 6);
  for (const char* p : kKerasMhaParts) {
    if (s == p) return s;
  }
  return s == kKerasMhaGatePart ? s : "";
}

// (layer, weight) of one variable name or path; weight "" when it is not a layer weight.
std::pair<std::string, std::string> layer_and_weight(std::string s) {
  if (s.ends_with(kValueSuffix)) s.resize(s.size() - kValueSuffix.size());
  if (s.ends_with(":0")) s.resize(s.size() - 2);
  std::vector<std::string> parts = split(s);
  if (parts.size() >= 3 && parts[parts.size() - 2] == "vars") {  // Keras 3: .../vars/<i>
    const std::string idx = parts.back();
    parts.resize(parts.size() - 2);
    std::erase(parts, std::string("layers"));
    const std::string weight = idx == "0" ? "kernel" : idx == "1" ? "bias" : "vars/" + idx;
    if (parts.size() >= 2 && !mha_part(parts.back()).empty()) {
      const std::string part = mha_part(parts.back());
      return {join(parts, parts.size() - 1), part + "/" + weight};
    }
    return {join(parts, parts.size()), weight};
  }
  if (parts.size() >= 3 && !mha_part(parts[parts.size() - 2]).empty()) {
    std::string last = parts.back();
    if (last.starts_with("_")) last.erase(0, 1);
    return {join(parts, parts.size() - 2), mha_part(parts[parts.size() - 2]) + "/" + last};
  }
  if (parts.size() >= 2) {
    std::string last = parts.back();
    if (last.starts_with("_")) last.erase(0, 1);
    return {join(parts, parts.size() - 1), last};
  }
  return {"", ""};
}

}  // namespace

LayerWeights keras_layer_weights(const io::WeightFile& file) {
  LayerWeights out;
  for (const io::TensorInfo& e : file.entries) {
    const auto t = file.tensors.find(e.key);
    if (e.optimizer || t == file.tensors.end()) continue;
    const auto [layer, weight] = layer_and_weight(e.name);
    if (weight.empty()) continue;
    out[layer][weight] = t->second;
  }
  return out;
}

namespace {

// Optimizer state by key: Keras 3 (optimizer/vars/N), tf.keras .h5 (optimizer_weights/...),
// TF checkpoints (optimizer/..., .../.OPTIMIZER_SLOT/...).
bool optimizer_key(const std::string& key) {
  return key.starts_with("optimizer/") || key.starts_with("optimizer_weights/") ||
         key.find("/.OPTIMIZER_SLOT/") != std::string::npos;
}

// tf.keras .h5 keys repeat the layer: "model_weights/<l>/<l>/..." (model files), "<l>/<l>/..."
// (save_weights files): the layer is <l>.
std::string tf_keras_h5_layer(std::string layer) {
  if (layer.starts_with("model_weights/")) layer.erase(0, 14);
  const auto slash = layer.find('/');
  if (slash != std::string::npos && layer.compare(slash + 1, std::string::npos, layer, 0, slash) == 0) {
    layer.resize(slash);
  }
  return layer;
}

}  // namespace

LayerWeights keras_layer_weights(const std::map<std::string, Tensor>& tensors) {
  LayerWeights out;
  for (const auto& [key, t] : tensors) {
    if (optimizer_key(key)) continue;
    const auto [layer, weight] = layer_and_weight(key);
    if (!weight.empty()) out[tf_keras_h5_layer(layer)][weight] = t;
  }
  return out;
}

const std::map<std::string, Tensor>& layer_weights(const LayerWeights& layers, const std::string& layer,
                                                   const std::string& source) {
  const auto it = layers.find(layer);
  if (it != layers.end()) return it->second;
  std::string found;
  for (const auto& [name, weights] : layers) {
    found += (found.empty() ? "" : ", ") + name + " (";
    std::string ws;
    for (const auto& [w, t] : weights) ws += (ws.empty() ? "" : " ") + w + shape_str(t.shape());
    found += ws + ")";
  }
  fail<FormatError>("load weights: ", source, ": no layer named '", layer,
                    "'; the file has: ", found.empty() ? "no layer weights" : found);
}

std::map<std::string, Tensor> keras3_paths(const LayerWeights& layers) {
  std::map<std::string, Tensor> out;
  for (const auto& [layer, weights] : layers) {
    for (const auto& [w, t] : weights) {
      const auto slash = w.rfind('/');
      const std::string part = slash == std::string::npos ? "" : w.substr(0, slash);
      const std::string var = slash == std::string::npos ? w : w.substr(slash + 1);
      const std::string idx = var == "kernel" ? "0" : var == "bias" ? "1" : var;
      const std::string sub = part.empty() || part == "vars" ? ""
                              : part == "attention_output"   ? "/output_dense"
                              : part == kKerasMhaGatePart    ? "/_gate_dense"  // as Keras 3.15 saves it
                                                             : "/" + part + "_dense";
      out["layers/" + layer + sub + "/vars/" + idx] = t;
    }
  }
  return out;
}

}  // namespace qkv::nn
