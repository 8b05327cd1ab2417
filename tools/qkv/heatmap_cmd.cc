// qkv heatmap WEIGHTS -o OUT.png [--index N] [--cell PX] [--tokens a,b,..] [--key-tokens ..]
//             [--vmax V] [--no-labels]: attention weights (or a mask pattern) as a PNG.
#include "commands.h"
#include "qkv/heatmap.h"

namespace qkv::cli {

namespace {
struct HeatmapArgs {
  std::string weights, out;
  std::optional<int64_t> index;
  int64_t cell = 0;
  std::vector<std::string> tokens, key_tokens;
  std::optional<double> vmax;
  bool no_labels = false;
};
}  // namespace

void register_heatmap(CLI::App& app) {
  auto a = std::make_shared<HeatmapArgs>();
  CLI::App* cmd = app.add_subcommand(
      "heatmap",
      "Attention weights [..., Lq, Lk] (.npy or FILE.safetensors[:NAME]; bool masks too) as a PNG heatmap: "
      "query i down, key j across, viridis from 0 to the largest value, token labels on the axes");
  cmd->add_option("weights", a->weights, "the weights (e.g. qkv attention --weights w.npy)")->required();
  cmd->add_option("-o,--output", a->out, "the PNG file")->required();
  cmd->add_option("--index", a->index, "which [Lq, Lk] slice of the leading dims, flattened (default: their mean)")
      ->check(integer_in(0));
  cmd->add_option("--cell", a->cell, "pixels per cell (default: about 512 px in all, 1 to 32)")
      ->check(integer_in(1, 256));
  cmd->add_option("--tokens", a->tokens, "query labels, comma separated (default: indices); also the keys'")
      ->delimiter(',');
  cmd->add_option("--key-tokens", a->key_tokens, "key labels when they differ from the queries'")->delimiter(',');
  cmd->add_option("--vmax", a->vmax, "value of the brightest color (default: the largest)")->check(real_in(0.0));
  cmd->add_flag("--no-labels", a->no_labels, "cells only");
  cmd->callback([a] {
    io::HeatmapOptions o;
    o.index = a->index;
    o.cell = a->cell;
    o.labels = !a->no_labels;
    o.query_labels = a->tokens;
    o.key_labels = a->key_tokens.empty() ? a->tokens : a->key_tokens;
    o.vmax = a->vmax;
    io::write_heatmap_png(a->out, load_tensor(a->weights), o);
  });
}

}  // namespace qkv::cli
