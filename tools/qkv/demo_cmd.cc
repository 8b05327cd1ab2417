// qkv demo: seed 001's toy batch through a two-head attention layer, printed step by step.
#include <cstdio>
#include <iostream>
#include <vector>

#include "commands.h"
#include "qkv/attention.h"
#include "qkv/attention_flops.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "timing.h"

namespace qkv::cli {

namespace {

constexpr int64_t kBatch = 2, kTokens = 2, kEmbed = 3, kHeads = 2, kKeyDim = 4;

// y [rows, out] = x [rows, in] @ w [in, out] + bias [out], through the one GEMM wrapper.
Tensor dense(const Tensor& x, const Tensor& w, const Tensor& bias) {
  const int64_t rows = x.size(0), in = x.size(1), out = w.size(1);
  Tensor y = bias.expand({rows, out}).clone();
  GemmShape s;
  s.m = rows;
  s.n = out;
  s.k = in;
  s.lda = in;
  s.ldb = out;
  s.ldc = out;
  gemm(s, 1.0f, x.contiguous().data<float>(), w.contiguous().data<float>(), 1.0f, y.data<float>());
  return y;
}

// One line: fused attention GFLOP/s at (B, H, L, D) = (1, 8, 1024, 64) and its
// share of a 1024^3 qkv::gemm's, both measured now (well under a second).
void speed_line() {
  constexpr int64_t kB = 1, kH = 8, kL = 1024, kD = 64;
  const Tensor q = Tensor::randn({kB, kH, kL, kD}, 1), k = Tensor::randn({kB, kH, kL, kD}, 2);  // [B, H, L, D]
  const Tensor v = Tensor::randn({kB, kH, kL, kD}, 3);
  const double attn_s = best_seconds(0.0, 5, [&] { (void)scaled_dot_product_attention(q, k, v); });
  const double attn = attention_flops(kB, kH, kL, kD, false) / attn_s * 1e-9;
  std::vector<float> a(kL * kL, 0.5f), b(a), c(a);  // [1024, 1024] each
  GemmShape s;
  s.m = s.n = s.k = s.lda = s.ldb = s.ldc = kL;
  const double gemm_s = best_seconds(0.0, 5, [&] { gemm(s, 1.0f, a.data(), b.data(), 0.0f, c.data()); });
  const double peak = 2.0 * kL * kL * kL / gemm_s * 1e-9;
  std::printf(
      "\nspeed: fused attention f32 (B,H,L,D)=(1,8,1024,64), %d thread(s): %.1f GFLOP/s = %.0f%% of qkv::gemm's "
      "%.1f GFLOP/s (qkv bench attention for more)\n",
      get_num_threads(), attn, 100.0 * attn / peak, peak);
}

void section(const std::string& title, const Tensor& t) {
  std::cout << "\n" << title << " " << shape_str(t.shape()) << ":\n" << t << "\n";
}

void run_demo() {
  std::cout << "qkv demo: seed 001's toy batch through MultiHeadAttention(num_heads=2, key_dim=4)\n"
            << "(weights are seeded, not trained; scores use the fused attention kernel)\n";
  // [batch, tokens, embedding]
  const Tensor x = Tensor::from_vector<float>({1, 2, 3, 4, 5, 6, 1, 1, 1, 2, 2, 6}, {kBatch, kTokens, kEmbed});
  section("inputs x", x);

  // Keras layout: kernels [embed, heads, key_dim], biases [heads, key_dim].
  const int64_t proj = kHeads * kKeyDim;
  auto kernel = [&](uint64_t seed) { return Tensor::uniform({kEmbed, proj}, seed, -0.6, 0.6); };
  const Tensor wq = kernel(1), wk = kernel(2), wv = kernel(3);
  const Tensor bq = Tensor::uniform({proj}, 4, -0.1, 0.1), bk = Tensor::zeros({proj}), bv = Tensor::zeros({proj});
  const Tensor wo = Tensor::uniform({proj, kEmbed}, 5, -0.6, 0.6), bo = Tensor::zeros({kEmbed});
  section("query kernel (abc,cde->abde as a GEMM, shown [embed, heads*key_dim])", wq);

  // einsum('abc,cde->abde') = one GEMM on [batch*tokens, embed]; then heads forward:
  // [batch, tokens, heads, key_dim] -> [batch, heads, tokens, key_dim].
  const Tensor x2 = x.view({kBatch * kTokens, kEmbed});
  auto heads = [&](const Tensor& y) { return y.view({kBatch, kTokens, kHeads, kKeyDim}).permute({0, 2, 1, 3}); };
  const Tensor q = heads(dense(x2, wq, bq)), k = heads(dense(x2, wk, bk)), v = heads(dense(x2, wv, bv));
  section("q [batch, heads, tokens, key_dim]", q);

  AttentionOptions options;
  options.return_weights = true;  // Keras scales q by 1/sqrt(key_dim): the default scale
  const AttentionResult r = scaled_dot_product_attention(q, k, v, options);
  section("attention weights softmax(q k^T / sqrt(4)) [batch, heads, query, key]", *r.weights);

  // [batch, heads, tokens, key_dim] -> [batch*tokens, heads*key_dim] -> output projection.
  const Tensor merged = r.output.permute({0, 2, 1, 3}).reshape({kBatch * kTokens, proj});
  const Tensor y = dense(merged, wo, bo).view({kBatch, kTokens, kEmbed});
  section("output (abcd,cde->abe) [batch, tokens, embedding]", y);

  options.is_causal = true;
  const AttentionResult causal = scaled_dot_product_attention(q, k, v, options);
  section("causal attention weights (token 0 sees only itself)", *causal.weights);
  demo_seed001();
  (void)train_seed001_table();
  std::cout << std::flush;
  speed_line();
}

}  // namespace

void register_demo(CLI::App& app) {
  CLI::App* cmd = app.add_subcommand("demo", "Run the seed-001 toy example and print every step");
  cmd->callback([] { run_demo(); });
}

}  // namespace qkv::cli
