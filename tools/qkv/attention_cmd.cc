// qkv attention --q q.npy --k k.npy --v v.npy [--mask m.npy] [--causal] [--scale S]
//               [--matmul-precision medium] [--qk-quantization int8] [--variant window --window W ...] [--weights
//               w.npy] -o out.npy
// qkv attention --q qk.npy --v v.npy --variant lsh [--hashes N --buckets B --chunk C ...] -o out.npy
#include "commands.h"
#include "qkv/attention.h"
#include "qkv/io.h"
#include "qkv/linear_attention.h"
#include "qkv/lsh_attention.h"

namespace qkv::cli {

namespace {
struct AttentionArgs {
  std::string q, k, v, mask, weights, out;
  bool causal = false, gqa = false;
  std::optional<double> scale;
  double dropout = 0.0;
  uint64_t seed = 0;
  std::string precision = "highest";  // AttentionOptions::matmul_precision (float32 inputs)
  std::string qk = "none";            // AttentionOptions::qk_quantization (float32 inputs)
  // --variant and its settings (qkv/attention_mods.h, qkv/linear_attention.h)
  std::string variant = "full", align = "top-left";
  int64_t window = 0, prefix = 0, block = 64, window_blocks = 1, random = 2, features = 0;
  std::vector<int64_t> globals;
  uint64_t random_seed = 0;
  double softcap = 0.0;
  std::string parallel, layout = "contiguous";  // --parallel under mpiexec (attention_parallel.cc)
  LshAttentionOptions lsh;                      // --variant lsh (qkv/lsh_attention.h)
  std::string rotations;
  std::string device = "cpu";  // --device: where the fused attention runs (cpu, cuda:N)
};

// --variant lsh: Reformer's LSH attention with --q as the shared query-key; --mask is its
// padding mask [..., L] and --seed draws the rotations unless --rotations gives them.
void run_lsh(const AttentionArgs& a) {
  if (!a.k.empty() && a.k != a.q) {
    fail<ValueError>("attention --variant lsh: the keys are --q (shared query-key); omit --k");
  }
  if (!a.weights.empty()) fail<ValueError>("attention --variant lsh: takes no --weights");
  LshAttentionOptions o = a.lsh;
  o.is_causal = a.causal;
  o.seed = a.seed;
  if (!a.mask.empty()) o.attention_mask = load_tensor(a.mask);
  if (!a.rotations.empty()) o.rotations = load_tensor(a.rotations);
  io::save(a.out, {{"output", lsh_attention(load_tensor(a.q), load_tensor(a.v), o)}});
}

// The mods of --variant (window, prefix-lm, longformer, bigbird) and --softcap.
AttentionMods variant_mods(const AttentionArgs& a, int64_t lk) {
  const auto align = a.align == "bottom-right" ? AttentionMods::Align::bottom_right : AttentionMods::Align::top_left;
  AttentionMods m;
  if (a.variant == "window" || a.variant == "longformer") {
    m = AttentionMods::sliding_window(a.window, a.causal ? 0 : a.window, align);
    m.global_tokens = a.globals;
  } else if (a.variant == "prefix-lm") {
    m = AttentionMods::prefix_lm(a.prefix);
  } else if (a.variant == "bigbird") {
    m = AttentionMods::bigbird(a.block, a.window_blocks, a.random, a.random_seed, lk);
  }
  m.softcap = a.softcap;
  return m;
}

void run_attention(const AttentionArgs& a) {
  if (a.k.empty() && a.variant != "lsh") {
    fail<ValueError>("attention: --k is required (but for --variant lsh, whose keys are --q)");
  }
  if (a.qk != "none" && (!a.parallel.empty() || a.variant == "linear" || a.variant == "lsh")) {
    fail<ValueError>(
        "attention: --qk-quantization is for the fused softmax attention (not --parallel, "
        "--variant linear or lsh)");
  }
  if (!a.parallel.empty()) {
    if (!a.mask.empty() || !a.weights.empty() || a.variant != "full" || a.dropout > 0) {
      fail<ValueError>("attention --parallel: takes no --mask, --weights, --variant or --dropout");
    }
    run_parallel_attention({a.parallel, a.layout, a.q, a.k, a.v, a.out, a.causal, a.gqa, a.scale, a.precision});
    return;
  }
  const Device device = Device::parse(a.device);
  if (!device.is_cpu() && (a.variant != "full" || !a.weights.empty() || a.dropout > 0)) {
    fail<ValueError>("attention --device ", a.device, ": the GPU runs the full softmax attention only (no --variant, ",
                     "--weights or --dropout; docs/cuda.md)");
  }
  if (a.variant == "lsh") return run_lsh(a);
  // Read on the host, then moved to the device (the output comes back when written).
  const Tensor q = load_tensor(a.q).to(device), k = load_tensor(a.k).to(device), v = load_tensor(a.v).to(device);
  if (a.variant == "linear") {  // phi = elu + 1, or FAVOR+ with --features
    if (!a.mask.empty() || !a.weights.empty()) fail<Error>("attention: --variant linear takes no --mask or --weights");
    LinearAttentionOptions lo;
    lo.is_causal = a.causal;
    if (a.features > 0) lo.feature_map = LinearFeatureMap::favor, lo.num_features = a.features, lo.seed = a.seed;
    io::save(a.out, {{"output", linear_attention(q, k, v, lo)}});
    return;
  }
  AttentionOptions options;
  if (!a.mask.empty()) options.attn_mask = load_tensor(a.mask).to(device);
  const bool mods = a.variant != "full";
  options.is_causal = a.causal && !mods;  // with a variant, --causal is its window's right side 0
  options.scale = a.scale;
  options.enable_gqa = a.gqa;
  options.dropout_p = a.dropout;
  options.seed = a.seed;
  options.matmul_precision = matmul_precision_from_name(a.precision);
  options.qk_quantization = qk_quantization_from_name(a.qk);
  options.return_weights = !a.weights.empty();
  options.mods = variant_mods(a, k.dim() >= 2 ? k.size(-2) : 0);
  const AttentionResult r = scaled_dot_product_attention(q, k, v, options);
  io::save(a.out, {{"output", r.output}});
  if (r.weights) io::save(a.weights, {{"weights", *r.weights}});
}

constexpr const char* kVariantHelp =
    "full (default): every key (or --mask / --causal). "
    "window: query i attends to keys j with |j - i| <= W (2W + 1 keys, --window W), or with --causal to "
    "i - W <= j <= i (W + 1 keys); --align bottom-right measures from j = i + Lk - Lq. "
    "longformer: window plus --globals (those positions attend to, and are attended by, every position). "
    "prefix-lm: causal plus the first --prefix keys for every query. "
    "bigbird: blocks of --block tokens, each query block attends to --window-blocks blocks on each side, "
    "--random random key blocks (--random-seed) and the first and last block (global). "
    "linear: linear attention, phi = elu + 1, or Performer FAVOR+ with --features M (seeded by --seed); "
    "--causal for causal. "
    "lsh: Reformer's LSH attention (Hugging Face LSHSelfAttention semantics) with --q as the shared "
    "query-key (no --k): --hashes rounds into --buckets buckets (even, or factors 4,8), sorted, chunks of "
    "--chunk attending to themselves and --chunks-before/--chunks-after neighbours, no attention to self "
    "unless alone; --causal is Reformer's is_decoder, --mask a padding mask [..., L] (0 = padding), "
    "--rotations R.npy [H or 1, D, hashes, sum(buckets)/2] or drawn from --seed";
}  // namespace

void register_attention(CLI::App& app) {
  auto args = std::make_shared<AttentionArgs>();
  CLI::App* cmd = app.add_subcommand(
      "attention",
      "Scaled dot-product attention of q [..., Lq, Dk], k [..., Lk, Dk], v [..., Lk, Dv] (PyTorch SDPA semantics)");
  cmd->add_option("--q", args->q, "queries (.npy, or FILE.safetensors[:NAME])")->required();
  cmd->add_option("--k", args->k, "keys (required, but for --variant lsh)");
  cmd->add_option("--v", args->v, "values")->required();
  cmd->add_option("--mask", args->mask,
                  "attn_mask: bool (True = attend) or additive float, broadcast to [..., Lq, Lk]");
  cmd->add_flag("--causal", args->causal, "causal mask, top-left aligned (not with --mask)");
  cmd->add_option("--scale", args->scale, "score scale (default 1/sqrt(Dk))")->check(real_in());
  cmd->add_flag("--gqa", args->gqa, "grouped-query attention: k/v heads divide q heads");
  cmd->add_option("--dropout", args->dropout, "dropout probability on the weights")->check(real_in(0.0, 1.0));
  cmd->add_option("--seed", args->seed, "dropout seed (lsh: the rotations' seed)")->check(integer_in(0, UINT64_MAX));
  cmd->add_option("--matmul-precision", args->precision,
                  "float32 inputs: highest (default), high, or medium (bf16 tiles where the CPU has native bf16)")
      ->check(CLI::IsMember({"highest", "high", "medium"}));
  cmd->add_option("--qk-quantization", args->qk,
                  "float32 inputs: none (default), int8 (Q K^T on int8 with SageAttention's smoothing of K, "
                  "about 1e-2 relative error) or int8_unsmoothed")
      ->check(CLI::IsMember({"none", "int8", "int8_unsmoothed"}));
  cmd->add_option("--variant", args->variant, kVariantHelp)
      ->check(CLI::IsMember({"full", "window", "longformer", "prefix-lm", "bigbird", "linear", "lsh"}));
  cmd->add_option("--window", args->window, "window/longformer: W (see --variant)")->check(integer_in(0));
  cmd->add_option("--align", args->align, "window diagonal: top-left (j = i, default) or bottom-right")
      ->check(CLI::IsMember({"top-left", "bottom-right"}));
  cmd->add_option("--globals", args->globals, "longformer: global positions (e.g. --globals 0 5)")
      ->delimiter(',')
      ->check(integer_in(0));
  cmd->add_option("--prefix", args->prefix, "prefix-lm: keys every query sees")->check(integer_in(0));
  cmd->add_option("--block", args->block, "bigbird: block size (default 64)")->check(integer_in(1));
  cmd->add_option("--window-blocks", args->window_blocks, "bigbird: blocks on each side (default 1)")
      ->check(integer_in(0));
  cmd->add_option("--random", args->random, "bigbird: random key blocks per query block (default 2)")
      ->check(integer_in(0));
  cmd->add_option("--random-seed", args->random_seed, "bigbird: seed of the random blocks")
      ->check(integer_in(0, UINT64_MAX));
  cmd->add_option("--softcap", args->softcap, "scores c * tanh(s / c) (Gemma 2's soft-capping)")->check(real_in(0.0));
  cmd->add_option("--features", args->features, "linear: FAVOR+ random features M (0: elu + 1)")->check(integer_in(0));
  cmd->add_option("--hashes", args->lsh.n_hashes, "lsh: hash rounds (default 1)")->check(integer_in(1));
  cmd->add_option("--buckets", args->lsh.n_buckets, "lsh: buckets, or factors 4,8 (default: Reformer's for L)")
      ->delimiter(',')
      ->check(integer_in(2));
  cmd->add_option("--chunk", args->lsh.chunk_length, "lsh: chunk length (default 64)")->check(integer_in(1));
  cmd->add_option("--chunks-before", args->lsh.num_chunks_before, "lsh: chunks before (default 1)")
      ->check(integer_in(0));
  cmd->add_option("--chunks-after", args->lsh.num_chunks_after, "lsh: chunks after (default 0)")->check(integer_in(0));
  cmd->add_option("--rotations", args->rotations, "lsh: rotations [H or 1, D, hashes, sum(buckets)/2]");
  cmd->add_option("--weights", args->weights, "also write the attention weights [..., Lq, Lk] here");
  cmd->add_option("--parallel", args->parallel,
                  "under mpiexec: ring (K/V blocks around the ranks), ulysses (all-to-all to heads) or heads "
                  "(each rank its heads); rank 0 writes the output; \"{rank}\" in file names: pre-sharded files")
      ->check(CLI::IsMember({"ring", "ulysses", "heads"}));
  cmd->add_option("--layout", args->layout,
                  "--parallel ring/ulysses: sequence shards contiguous (default) or "
                  "zigzag (chunks r and 2P-1-r: balanced causal work)")
      ->check(CLI::IsMember({"contiguous", "zigzag"}));
  cmd->add_option("--device", args->device,
                  "where it runs: cpu (default) or cuda:N (a CUDA build with a GPU: bfloat16/float16 inputs, "
                  "Dk = Dv in {64, 128}, full attention with --mask/--causal/--gqa/--scale; docs/cuda.md)");
  cmd->add_option("-o,--output", args->out, "output file (.npy or .safetensors)")->required();
  cmd->callback([args] { run_attention(*args); });
}

}  // namespace qkv::cli
