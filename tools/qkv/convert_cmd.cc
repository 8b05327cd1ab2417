// qkv convert IN OUT --to torch|keras|same: MultiHeadAttention (+ Dense) weights between
// Keras' layout and PyTorch's, and between files (same: every tensor by its key). Input: .safetensors, .h5 /
// .weights.h5, .keras, TF checkpoints. Output (--to keras) by OUT, as Keras itself
// chooses: .weights.h5 (Keras 3), other .h5 (tf.keras 2.x save_weights layout),
// .keras (archive), .safetensors, and a TF checkpoint for PREFIX.index or a path
// without extension (tf.keras save_weights(prefix) layout); --format overrides.
#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "qkv/io.h"
#include "qkv/io_keras.h"
#include "qkv/io_tf.h"

namespace qkv::cli {

namespace {

struct ConvertArgs {
  std::string in, out, to, format, config, layer_order;
  int64_t heads = 0;
};

bool has_torch_keys(const std::map<std::string, Tensor>& tensors) {
  for (const auto& [k, t] : tensors) {
    if (k.ends_with("in_proj_weight") || k.ends_with(".weight")) return true;
  }
  return false;
}

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

// safetensors | keras3-h5 | tf-keras-h5 | keras | tf-checkpoint, from --format or OUT.
std::string output_format(const ConvertArgs& a) {
  if (!a.format.empty()) return a.format;
  const std::string out = lower(a.out);
  const std::string ext = lower(std::filesystem::path(a.out).extension().string());
  if (ext == ".safetensors") return "safetensors";
  if (out.ends_with(".weights.h5")) return "keras3-h5";
  if (ext == ".h5" || ext == ".hdf5") return "tf-keras-h5";
  if (ext == ".keras") return "keras";
  if (ext == ".index" || ext.empty()) return "tf-checkpoint";
  fail<ValueError>("convert: cannot tell the output format of ", a.out,
                   " (.safetensors, .weights.h5, .h5, .keras, PREFIX.index or a prefix without extension; or --format)");
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail<IOError>("convert: cannot open for reading: ", path);
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

std::string prefix_of(const std::string& out) {
  return out.ends_with(".index") ? out.substr(0, out.size() - 6) : out;
}

// Writes `layers` in Keras' layout; returns the tensors written, by their key in OUT.
std::map<std::string, Tensor> write_keras(const ConvertArgs& a, const std::string& format, const io::LayerWeights& layers,
                                          const std::vector<std::string>& order, const std::string& in_config) {
  if (format == "tf-keras-h5") {
    io::save_keras_legacy_h5(a.out, layers, order);
    std::map<std::string, Tensor> listing;
    for (const auto& [layer, w] : layers) {
      for (const auto& [name, t] : w) listing[layer + "/" + layer + "/" + name + ":0"] = t;
    }
    return listing;
  }
  if (format == "tf-checkpoint") {
    const io::TfKerasCheckpoint ck = io::tf_keras_checkpoint_keys(layers, order);
    io::save_tf_checkpoint(prefix_of(a.out), ck.tensors, ck.full_names);
    return ck.tensors;
  }
  const std::map<std::string, Tensor> paths = io::keras3_paths(layers);
  if (format == "keras") {
    const std::string config = !a.config.empty() ? read_text(a.config)
                             : !in_config.empty() ? in_config
                                                  : io::keras_model_config(layers, order);
    io::save_keras_archive(a.out, paths, config);
  } else if (format == "keras3-h5") {
    io::save_keras_weights_h5(a.out, paths);
  } else {
    io::save_safetensors(a.out, paths);
  }
  return paths;
}

void run_convert(const ConvertArgs& a) {
  const io::WeightFile in = io::load_weights(a.in);
  const std::string format = output_format(a);
  std::map<std::string, Tensor> out;
  if (a.to == "same") {
    out = in.tensors;  // every tensor under its own key (optimizer state and all)
    if (format == "tf-checkpoint") io::save_tf_checkpoint(prefix_of(a.out), out);
    else if (format == "safetensors") io::save_safetensors(a.out, out);
    else if (format == "keras3-h5") io::save_keras_weights_h5(a.out, out);
    else fail<ValueError>("convert --to same: ", format, " needs layers; write .safetensors, .weights.h5 or a TF checkpoint");
  } else if (a.to == "torch") {
    if (format != "safetensors" && format != "keras3-h5") {
      fail<ValueError>("convert: PyTorch's layout is written to .safetensors (or a plain .weights.h5), not ", format);
    }
    out = io::keras_to_torch(io::keras_layer_weights(in));
    if (out.empty()) fail<ValueError>("convert: ", a.in, ": no layer weights found to convert");
    io::save(a.out, out);
  } else {
    io::LayerWeights layers = io::keras_layer_weights(in);
    if (has_torch_keys(in.tensors)) {
      if (a.heads < 1) fail<ValueError>("convert: ", a.in, " holds PyTorch weights; give --heads N for Keras' [E, N, H] kernels");
      layers = io::torch_to_keras(in.tensors, a.heads);
    }
    if (layers.empty()) fail<ValueError>("convert: ", a.in, ": no layer weights found to convert");
    const std::string in_config = lower(a.in).ends_with(".keras") ? io::load_keras_archive(a.in).config_json : "";
    std::vector<std::string> order = split_commas(a.layer_order);
    if (order.empty()) order = !in_config.empty() ? io::keras_config_layer_order(in_config) : io::keras_layer_order(in);
    out = write_keras(a, format, layers, io::ordered_layers(layers, order), in_config);
  }
  std::cout << a.in << " -> " << a.out << " (" << a.to << " layout, " << format << "): " << out.size() << " tensors\n";
  for (const auto& [k, t] : out) std::cout << "  " << k << "  " << dtype_name(t.dtype()) << "  " << shape_str(t.shape()) << "\n";
}

}  // namespace

void register_convert(CLI::App& app) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand("convert", "Convert MHA/Dense weights between Keras and PyTorch layouts and files");
  cmd->add_option("input", args->in, "weights: .safetensors, .h5/.weights.h5, .keras, TF checkpoint prefix or .index")
      ->required();
  cmd->add_option("output", args->out,
                  "output: .safetensors, .weights.h5 (Keras 3), .h5 (tf.keras 2.x), .keras, "
                  "PREFIX.index or PREFIX without extension (TF checkpoint)")
      ->required();
  cmd->add_option("--to", args->to, "target layout (same: every tensor under its own key, no layout change)")
      ->required()
      ->check(CLI::IsMember({"torch", "keras", "same"}));
  cmd->add_option("--heads", args->heads, "number of heads (PyTorch -> Keras)")->check(integer_in(1, 65536));
  cmd->add_option("--format", args->format, "output format, instead of OUT's extension")
      ->check(CLI::IsMember({"safetensors", "keras3-h5", "tf-keras-h5", "keras", "tf-checkpoint"}));
  cmd->add_option("--layer-order", args->layer_order,
                  "layers in model order, comma-separated (tf.keras .h5 and TF checkpoints match layers by position; "
                  "default: the input's order)");
  cmd->add_option("--config", args->config,
                  "config.json for a .keras output (default: the input's when it is a .keras, else a Functional "
                  "chain of the MHA/Dense layers)");
  cmd->callback([args] { run_convert(*args); });
}

}  // namespace qkv::cli
