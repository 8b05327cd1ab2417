// qkv attention --q q.npy --k k.npy --v v.npy [--mask m.npy] [--causal] [--scale S]
//               [--matmul-precision medium] [--weights w.npy] -o out.npy
#include "commands.h"
#include "qkv/attention.h"
#include "qkv/io.h"

namespace qkv::cli {

namespace {
struct AttentionArgs {
  std::string q, k, v, mask, weights, out;
  bool causal = false, gqa = false;
  std::optional<double> scale;
  double dropout = 0.0;
  uint64_t seed = 0;
  std::string precision = "highest";  // AttentionOptions::matmul_precision (float32 inputs)
};

void run_attention(const AttentionArgs& a) {
  AttentionOptions options;
  if (!a.mask.empty()) options.attn_mask = load_tensor(a.mask);
  options.is_causal = a.causal;
  options.scale = a.scale;
  options.enable_gqa = a.gqa;
  options.dropout_p = a.dropout;
  options.seed = a.seed;
  options.matmul_precision = matmul_precision_from_name(a.precision);
  options.return_weights = !a.weights.empty();
  const AttentionResult r = scaled_dot_product_attention(load_tensor(a.q), load_tensor(a.k), load_tensor(a.v), options);
  io::save(a.out, {{"output", r.output}});
  if (r.weights) io::save(a.weights, {{"weights", *r.weights}});
}
}  // namespace

void register_attention(CLI::App& app) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* cmd = app.add_subcommand(
      "attention",
      "Scaled dot-product attention of q [..., Lq, Dk], k [..., Lk, Dk], v [..., Lk, Dv] (PyTorch SDPA semantics)");
  cmd->add_option("--q", args->q, "queries (.npy, or FILE.safetensors[:NAME])")->required();
  cmd->add_option("--k", args->k, "keys")->required();
  cmd->add_option("--v", args->v, "values")->required();
  cmd->add_option("--mask", args->mask,
                  "attn_mask: bool (True = attend) or additive float, broadcast to [..., Lq, Lk]");
  cmd->add_flag("--causal", args->causal, "causal mask, top-left aligned (not with --mask)");
  cmd->add_option("--scale", args->scale, "score scale (default 1/sqrt(Dk))")->check(real_in());
  cmd->add_flag("--gqa", args->gqa, "grouped-query attention: k/v heads divide q heads");
  cmd->add_option("--dropout", args->dropout, "dropout probability on the weights")->check(real_in(0.0, 1.0));
  cmd->add_option("--seed", args->seed, "dropout seed")->check(integer_in(0, UINT64_MAX));
  cmd->add_option("--matmul-precision", args->precision,
                  "float32 inputs: highest (default), high, or medium (bf16 tiles where the CPU has native bf16)")
      ->check(CLI::IsMember({"highest", "high", "medium"}));
  cmd->add_option("--weights", args->weights, "also write the attention weights [..., Lq, Lk] here");
  cmd->add_option("-o,--output", args->out, "output file (.npy or .safetensors)")->required();
  cmd->callback([args] { run_attention(*args); });
}

}  // namespace qkv::cli
