// qkv convert IN OUT --to torch|keras: MultiHeadAttention (+ Dense) weights between
// Keras' layout and PyTorch's, and between files (.safetensors, .weights.h5; input
// also TF checkpoints, .h5, .keras).
#include <iostream>

#include "commands.h"
#include "qkv/io.h"
#include "qkv/io_keras.h"

namespace qkv::cli {

namespace {

struct ConvertArgs {
  std::string in, out, to;
  int64_t heads = 0;
};

bool has_torch_keys(const std::map<std::string, Tensor>& tensors) {
  for (const auto& [k, t] : tensors) {
    if (k.ends_with("in_proj_weight") || k.ends_with(".weight")) return true;
  }
  return false;
}

void run_convert(const ConvertArgs& a) {
  const io::WeightFile in = io::load_weights(a.in);
  std::map<std::string, Tensor> out;
  if (a.to == "torch") {
    out = io::keras_to_torch(io::keras_layer_weights(in));
  } else {
    io::LayerWeights layers = io::keras_layer_weights(in);
    if (has_torch_keys(in.tensors)) {
      if (a.heads < 1) fail<ValueError>("convert: ", a.in, " holds PyTorch weights; give --heads N for Keras' [E, N, H] kernels");
      layers = io::torch_to_keras(in.tensors, a.heads);
    }
    out = io::keras3_paths(layers);
  }
  if (out.empty()) fail<ValueError>("convert: ", a.in, ": no layer weights found to convert");
  io::save(a.out, out);
  std::cout << a.in << " -> " << a.out << " (" << a.to << " layout): " << out.size() << " tensors\n";
  for (const auto& [k, t] : out) std::cout << "  " << k << "  " << dtype_name(t.dtype()) << "  " << shape_str(t.shape()) << "\n";
}

}  // namespace

void register_convert(CLI::App& app) {
  auto args = std::make_shared<ConvertArgs>();
  CLI::App* cmd = app.add_subcommand("convert", "Convert MHA/Dense weights between Keras and PyTorch layouts and files");
  cmd->add_option("input", args->in, "weights: .safetensors, .h5/.weights.h5, .keras, TF checkpoint prefix or .index")
      ->required();
  cmd->add_option("output", args->out, "output file: .safetensors or .weights.h5")->required();
  cmd->add_option("--to", args->to, "target layout")->required()->check(CLI::IsMember({"torch", "keras"}));
  cmd->add_option("--heads", args->heads, "number of heads (PyTorch -> Keras)");
  cmd->callback([args] { run_convert(*args); });
}

}  // namespace qkv::cli
