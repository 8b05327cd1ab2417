// qkv convert IN OUT --to torch|keras|same: MultiHeadAttention (+ Dense) weights between
// Keras' layout and PyTorch's, and between files (same: every tensor by its key). Input: .safetensors, .h5 /
// .weights.h5, .keras, TF checkpoints. Output (--to keras) by OUT, as Keras itself
// chooses: .weights.h5 (Keras 3), other .h5 (tf.keras 2.x save_weights layout),
// .keras (archive), .safetensors, and a TF checkpoint for PREFIX.index or a path
// without extension (tf.keras save_weights(prefix) layout); --format overrides.
// OUT is never the input (same path, or the same file through a link: compared by
// st_dev/st_ino); another existing OUT needs --force. --config / --layer-order that OUT
// would ignore are usage errors (check_options_apply).
#include <sys/stat.h>

#include <algorithm>
#include <fstream>
#include <iostream>
#include <sstream>

#include "commands.h"
#include "qkv/ascii.h"
#include "qkv/io.h"
#include "qkv/io_keras.h"
#include "qkv/io_tf.h"
#include "qkv/nn/keras_layers.h"

namespace qkv::cli {

namespace {

struct ConvertArgs {
  std::string in, out, to, format, config, layer_order;
  int64_t heads = 0;
  bool force = false;
};

bool has_torch_keys(const std::map<std::string, Tensor>& tensors) {
  for (const auto& [k, t] : tensors) {
    if (k.ends_with("in_proj_weight") || k.ends_with(".weight")) return true;
  }
  return false;
}

// safetensors | keras3-h5 | tf-keras-h5 | keras | tf-checkpoint, from --format or OUT.
std::string output_format(const ConvertArgs& a) {
  // A directory has no extension: it read as a TF checkpoint prefix (DIR.index beside it).
  if (std::error_code ec; std::filesystem::is_directory(a.out, ec)) {
    fail<IOError>("convert: ", a.out, " is a directory, not a file (give a file in it, e.g. ",
                  (std::filesystem::path(a.out) / "model.safetensors").string(), ")");
  }
  if (!a.format.empty()) return a.format;
  const std::string out = ascii_lower(a.out);
  const std::string ext = lower_extension(a.out);
  if (ext == ".safetensors") return "safetensors";
  if (out.ends_with(".weights.h5")) return "keras3-h5";
  if (ext == ".h5" || ext == ".hdf5") return "tf-keras-h5";
  if (ext == ".keras") return "keras";
  if (ext == ".index" || ext.empty()) return "tf-checkpoint";
  fail<ValueError>(
      "convert: cannot tell the output format of ", a.out,
      " (.safetensors, .weights.h5, .h5, .keras, PREFIX.index or a prefix without extension; or --format)");
}

std::string read_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail<IOError>("convert: --config ", path, ": cannot open for reading");
  std::ostringstream s;
  s << f.rdbuf();
  return s.str();
}

// --config's text, checked as the .keras reader checks config.json (io::check_keras_config:
// valid JSON nested at most io::kMaxKerasConfigLevels, nothing built) before anything is
// read or written, so that a bad file is named as itself: it was refused by the archive
// writer as "save_keras_archive: OUT.keras: config_json is not valid JSON", naming the output.
std::string read_config(const std::string& path) {
  std::string text = read_text(path);
  io::check_keras_config(text, path);
  return text;
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Every --layer-order name must be a layer of the input: tf.keras .h5 files and TF
// checkpoints are loaded by position, so a mistyped name (ignored before) put the
// layers in the wrong places without a word.
void check_layer_order(const ConvertArgs& a, const std::vector<std::string>& order, const nn::LayerWeights& layers) {
  for (const std::string& name : order) {
    if (layers.count(name)) continue;
    std::string known;
    for (const auto& [layer, w] : layers) known += (known.empty() ? "" : ", ") + terminal_safe(layer);
    fail<ValueError>("convert: --layer-order names '", name, "', which is not a layer of ", a.in,
                     " (its layers: ", known, ")");
  }
}

std::string prefix_of(const std::string& out) { return out.ends_with(".index") ? out.substr(0, out.size() - 6) : out; }

// The library's error for layers that do not chain, with the flags that fix it.
std::string keras_config(const nn::LayerWeights& layers, const std::vector<std::string>& order) {
  try {
    return nn::keras_model_config(layers, order);
  } catch (const ValueError& e) {
    const std::string what = e.what();
    if (what.find("not in model order") == std::string::npos) throw;
    fail<ValueError>(what, "; give --layer-order or --config");
  }
}

// Writes `layers` in Keras' layout; returns the tensors written, by their key in OUT.
std::map<std::string, Tensor> write_keras(const ConvertArgs& a, const std::string& format,
                                          const nn::LayerWeights& layers, const std::vector<std::string>& order,
                                          const std::string& config_json) {
  if (format == "tf-keras-h5") {
    nn::save_keras_legacy_h5(a.out, layers, order);
    std::map<std::string, Tensor> listing;
    for (const auto& [layer, w] : layers) {
      for (const auto& [name, t] : w) listing[layer + "/" + layer + "/" + name + ":0"] = t;
    }
    return listing;
  }
  if (format == "tf-checkpoint") {
    const nn::TfKerasCheckpoint ck = nn::tf_keras_checkpoint_keys(layers, order);
    io::save_tf_checkpoint(prefix_of(a.out), ck.tensors, ck.full_names);
    return ck.tensors;
  }
  const std::map<std::string, Tensor> paths = nn::keras3_paths(layers);
  if (format == "keras") {
    // --config's text, else the input's config.json, else a chain of the layers.
    const std::string config = !config_json.empty() ? config_json : keras_config(layers, order);
    io::save_keras_archive(a.out, paths, config);
  } else if (format == "keras3-h5") {
    io::save_keras_weights_h5(a.out, paths);
  } else {
    io::save_safetensors(a.out, paths);
  }
  return paths;
}

// The files a weight path stands for: itself, or a TF checkpoint's PREFIX.index and data shards.
std::vector<std::filesystem::path> files_of(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path prefix = prefix_of(path);
  std::vector<fs::path> out{path, prefix.string() + ".index"};
  std::error_code ec;
  const fs::path dir = prefix.has_parent_path() ? prefix.parent_path() : fs::path(".");
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (it->path().filename().string().starts_with(prefix.filename().string() + ".data-")) out.push_back(it->path());
  }
  return out;
}

// Refuses to write over the input (even with --force) and, without --force, over any file.
void check_output(const ConvertArgs& a, const std::string& format) {
  std::vector<std::string> outs{a.out};
  if (format == "tf-checkpoint") outs = {prefix_of(a.out) + ".index", prefix_of(a.out) + ".data-00000-of-00001"};
  for (const std::string& o : outs) {
    struct stat so {};
    if (::stat(o.c_str(), &so) != 0) continue;
    for (const auto& f : files_of(a.in)) {
      struct stat si {};
      if (::stat(f.c_str(), &si) == 0 && si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
        fail<ValueError>("convert: ", o, " is the input ", a.in, " (", f.string(),
                         "); write the output elsewhere (not even --force overwrites the input)");
      }
    }
    if (!a.force) fail<ValueError>("convert: ", o, " exists; --force overwrites it");
  }
}

// --to same: every tensor under its own key, optimizer state and all, and the variable
// names kept. A model variable that a TF checkpoint keys through the optimizer (Keras 3
// writes optimizer/_trainable_variables/N for layer weights) is written under its name
// instead ("multi_head_attention/query/kernel"), so the copy's layers are still found.
std::map<std::string, Tensor> write_same(const ConvertArgs& a, const std::string& format, const io::WeightFile& in) {
  std::map<std::string, Tensor> out;
  std::map<std::string, std::string> names;
  for (const io::TensorInfo& e : in.entries) {
    const auto t = in.tensors.find(e.key);
    if (t == in.tensors.end()) continue;
    const bool aliased = !e.optimizer && e.key.starts_with("optimizer/") && !e.name.empty() && e.name != e.key;
    const std::string key = aliased ? e.name : e.key;
    if (!out.emplace(key, t->second).second)
      fail<ValueError>("convert --to same: ", a.in, ": two variables named ", terminal_safe(key));
    names[key] = e.name;
  }
  // A model_weights group makes any .h5 a tf.keras model file to Keras and to qkv's reader.
  const bool tf_keras_model =
      std::any_of(out.begin(), out.end(), [](const auto& kv) { return kv.first.starts_with("model_weights/"); });
  if (format == "keras3-h5" && tf_keras_model) {
    fail<ValueError>("convert --to same: ", a.in,
                     " is a tf.keras model .h5 (model_weights/...); a .weights.h5 under "
                     "its keys would read as a tf.keras file without its attributes; write .safetensors or a TF "
                     "checkpoint, or --to keras");
  }
  if (format == "tf-checkpoint")
    io::save_tf_checkpoint(prefix_of(a.out), out, names);
  else if (format == "safetensors")
    io::save_safetensors(a.out, out);
  else if (format == "keras3-h5")
    io::save_keras_weights_h5(a.out, out);
  else
    fail<ValueError>("convert --to same: ", format,
                     " needs layers; write .safetensors, .weights.h5 or a TF checkpoint");
  return out;
}

// --config and --layer-order where they would be ignored (they were, without a word) are
// usage errors, before anything is read or written. --config is the .keras output's
// config.json; --layer-order orders the layers of a tf.keras .h5, a TF checkpoint or the
// .keras config built from the layers (not --config's, nor a .keras input's, which is kept).
void check_options_apply(const ConvertArgs& a, const std::string& format) {
  const auto usage = [](const auto&... parts) {
    std::ostringstream s;
    (s << ... << parts);
    throw CLI::ValidationError(s.str());
  };
  if (!a.config.empty() && format != "keras")
    usage("convert: --config applies to a .keras output only; ", a.out, " is ", format);
  if (!a.config.empty() && a.to != "keras") usage("convert: --config applies to --to keras only, not --to ", a.to);
  if (a.heads > 0 && a.to != "keras")
    usage("convert: --heads applies to --to keras only (PyTorch weights to Keras' [E, N, H] kernels), not --to ", a.to);
  if (a.layer_order.empty()) return;
  if (a.to != "keras") usage("convert: --layer-order applies to --to keras only, not --to ", a.to);
  if (format == "safetensors" || format == "keras3-h5") {
    usage("convert: --layer-order applies to a tf.keras .h5, a TF checkpoint or a .keras output only; ", a.out, " is ",
          format, ", whose keys name the layers in no order");
  }
  if (format == "keras" && !a.config.empty()) {
    usage("convert: --layer-order and --config: ", a.out, " takes the layers and their order of --config ", a.config,
          "; give one of them");
  }
  if (format == "keras" && io::is_keras_archive(a.in)) {  // the reader's own answer
    usage("convert: --layer-order does not apply: ", a.out, " takes the config.json of ", a.in,
          ", with its layers in its order (--config FILE replaces it)");
  }
}

void run_convert(const ConvertArgs& a) {
  const std::string format = output_format(a);
  check_options_apply(a, format);
  const std::string config = a.config.empty() ? "" : read_config(a.config);
  check_output(a, format);
  // The weights, and a .keras input's config.json (from the same read; it was read twice).
  const io::KerasArchive input = io::load_weights_and_config(a.in);
  const io::WeightFile& in = input.weights;
  std::map<std::string, Tensor> out;
  if (a.to == "same") {
    out = write_same(a, format, in);
  } else if (a.to == "torch") {
    if (format != "safetensors" && format != "keras3-h5") {
      fail<ValueError>("convert: PyTorch's layout is written to .safetensors (or a plain .weights.h5), not ", format);
    }
    out = nn::keras_to_torch(nn::keras_layer_weights(in));
    if (out.empty()) fail<ValueError>("convert: ", a.in, ": no layer weights found to convert");
    io::save(a.out, out);
  } else {
    nn::LayerWeights layers = nn::keras_layer_weights(in);
    if (!has_torch_keys(in.tensors) && a.heads > 0) {  // Keras kernels carry their heads: --heads would go unread
      fail<ValueError>("convert: --heads applies to PyTorch weights; ", a.in,
                       " holds Keras weights, whose [E, N, H] kernels give the heads");
    }
    if (has_torch_keys(in.tensors)) {
      if (a.heads < 1)
        fail<ValueError>("convert: ", a.in, " holds PyTorch weights; give --heads N for Keras' [E, N, H] kernels");
      try {
        layers = nn::torch_to_keras(in.tensors, a.heads);
      } catch (const ValueError& e) {
        const std::string what = e.what();
        if (what.find("num_heads") == std::string::npos) throw;
        fail<ValueError>(what, " (--heads)");
      }
    }
    if (layers.empty()) fail<ValueError>("convert: ", a.in, ": no layer weights found to convert");
    const std::string& in_config = input.config_json;  // "" unless a.in is a .keras
    std::vector<std::string> order = split_commas(a.layer_order);
    check_layer_order(a, order, layers);
    if (order.empty()) order = !in_config.empty() ? nn::keras_config_layer_order(in_config) : nn::keras_layer_order(in);
    out = write_keras(a, format, layers, nn::ordered_layers(layers, order), config.empty() ? in_config : config);
  }
  std::cout << a.in << " -> " << a.out << " (" << a.to << " layout, " << format << "): " << out.size() << " tensors\n";
  for (const auto& [k, t] : out)
    std::cout << "  " << terminal_safe(k) << "  " << dtype_name(t.dtype()) << "  " << shape_str(t.shape()) << "\n";
}

}  // namespace

void register_convert(CLI::App& app) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd =
      app.add_subcommand("convert", "Convert MHA/Dense weights between Keras and PyTorch layouts and files");
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
  cmd->add_flag("--force", args->force, "overwrite an existing output (never the input)");
  cmd->add_option("--format", args->format, "output format, instead of OUT's extension")
      ->check(CLI::IsMember({"safetensors", "keras3-h5", "tf-keras-h5", "keras", "tf-checkpoint"}));
  cmd->add_option("--layer-order", args->layer_order,
                  "--to keras: layers in model order, comma-separated, for a tf.keras .h5 or TF checkpoint (which "
                  "match layers by position) or the config of a .keras built from the layers (default: the input's "
                  "order)");
  cmd->add_option("--config", args->config,
                  "config.json for a .keras output, only (default: the input's when it is a .keras, else a "
                  "Functional chain of the MHA/Dense layers)");
  cmd->callback([args] { run_convert(*args); });
}

}  // namespace qkv::cli
