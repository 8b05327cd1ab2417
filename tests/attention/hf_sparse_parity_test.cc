// Hugging Face transformers' own sparse attention layers (tests/fixtures/hf_sparse, written by
// tests/attention/make_hf_sparse_fixtures.py with transformers 5.24, float32) rebuilt from qkv's
// ops: the projections through nn::Linear, the attention through the fused kernel with
// AttentionMods, and HF's outputs reproduced to 1e-5 relative (max |diff| / max |HF|).
//   LongformerSelfAttention: a local query sees keys within attention_window / 2 on each side
//     (HF's "one-sided" window) plus the global tokens, through the local projections; a global
//     query sees every key through the *_global projections (a second call, one row per global
//     token); padded keys are masked, padded query rows are zeros.
//   BigBirdBlockSparseAttention: blocks of block_size; query blocks 0 and nb-1 see everything,
//     the others their block +-1, key blocks 0 and nb-1 and the random key blocks HF gathered
//     for them (rand_attn, per head: a per-head block_pattern). A key block HF gathers twice
//     (in eval transformers draws no random blocks: every "random" block is block 0, already
//     global) counts twice in its softmax: score + log(count), a score_mod.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/sdpa_fixtures.h"
#include "qkv/attention.h"
#include "qkv/einops.h"
#include "qkv/io_tensor_files.h"
#include "qkv/nn/linear.h"

namespace qkv {
namespace {

struct Layer {
  io::SafetensorsFile file;
  nlohmann::json options;
  int64_t b = 0, l = 0, e = 0, heads = 0;
  const Tensor& at(const std::string& name) const { return file.tensors.at(name); }
};

Layer load(const std::string& name) {
  Layer f;
  f.file = io::load_safetensors(sdpa_fixtures::fixture_dir("hf_sparse") / (name + ".safetensors"));
  f.options = nlohmann::json::parse(f.file.metadata.at("options"));
  const Tensor& x = f.at("hidden");  // [B, L, E]
  f.b = x.size(0), f.l = x.size(1), f.e = x.size(2);
  f.heads = f.options.at("num_heads").get<int64_t>();
  return f;
}

// x [B', L', E] through the nn.Linear `name` -> [B', H, L', D].
Tensor project(const Layer& f, const std::string& name, const Tensor& x) {
  const Tensor y = nn::Linear::torch(f.at(name + ".weight"), f.at(name + ".bias")).forward(x);  // [B', L', E]
  return einops::rearrange(y, "b l (h d) -> b h l d", {{"h", f.heads}}).contiguous();
}

// padding [B, L] (1 = token) -> the bool key mask [B', 1, 1, L] of entries [b0, b0 + n).
Tensor key_mask(const Layer& f, int64_t b0, int64_t n) {
  return f.at("padding").slice(0, b0, b0 + n).to(DType::b8).reshape({n, 1, 1, f.l});
}

// y [B', H, L', D] -> [B', L', H * D] as doubles, the layout of HF's outputs.
std::vector<double> merged(const Tensor& y) { return einops::rearrange(y, "b h l d -> b l (h d)").to_vector<double>(); }

// Zeros for padded query rows (HF: masked_fill / * from_mask), then max |got - HF| / max |HF|.
double relative_error(const Layer& f, std::vector<double> got) {
  const auto pad = f.at("padding").to_vector<int64_t>();
  const auto want = f.at("out").to_vector<double>();
  EXPECT_EQ(got.size(), want.size());
  double diff = 0, scale = 0;
  for (size_t x = 0; x < want.size() && x < got.size(); ++x) {
    if (pad[x / static_cast<size_t>(f.e)] == 0) got[x] = 0.0;
    diff = std::max(diff, std::fabs(got[x] - want[x]));
    scale = std::max(scale, std::fabs(want[x]));
  }
  return diff / scale;
}

// LongformerSelfAttention with `window` as each side of the local window (HF: attention_window / 2).
std::vector<double> longformer(const Layer& f, int64_t window, const FlashTiles& tiles) {
  const auto glob = f.at("global").to_vector<int64_t>();  // [B, L]
  const int64_t d = f.e / f.heads;
  std::vector<double> out;
  for (int64_t b = 0; b < f.b; ++b) {                    // HF's global tokens differ per entry; qkv's are per call
    const Tensor x = f.at("hidden").slice(0, b, b + 1);  // [1, L, E]
    std::vector<int64_t> globals;
    for (int64_t t = 0; t < f.l; ++t) {
      if (glob[static_cast<size_t>(b * f.l + t)]) globals.push_back(t);
    }
    AttentionOptions o;
    o.mods = AttentionMods::longformer(window, window, globals);
    o.attn_mask = key_mask(f, b, 1);
    o.tuning.flash_tiles = tiles;
    auto rows =
        merged(scaled_dot_product_attention(project(f, "query", x), project(f, "key", x), project(f, "value", x), o)
                   .output);  // [L, E]
    if (!globals.empty()) {   // the global rows: every (unpadded) key, through the global projections
      const Tensor qg = project(f, "query_global", x);  // [1, H, L, D]
      std::vector<Tensor> picked;
      for (int64_t g : globals) picked.push_back(qg.slice(2, g, g + 1));
      AttentionOptions og;
      og.attn_mask = o.attn_mask;
      const Tensor q = einops::rearrange(picked, "n b h l d -> b h (n l) d").contiguous();  // [1, H, G, D]
      const auto yg = merged(
          scaled_dot_product_attention(q, project(f, "key_global", x), project(f, "value_global", x), og).output);
      for (size_t n = 0; n < globals.size(); ++n) {
        std::copy_n(yg.begin() + static_cast<ptrdiff_t>(n) * f.e, f.e,
                    rows.begin() + static_cast<ptrdiff_t>(globals[n] * f.e));
      }
    }
    EXPECT_EQ(static_cast<int64_t>(rows.size()), f.l * d * f.heads);
    out.insert(out.end(), rows.begin(), rows.end());
  }
  return out;
}

TEST(HfSparseParity, LongformerSelfAttention) {
  for (const char* name : {"longformer", "longformer_wide", "longformer_no_global"}) {
    SCOPED_TRACE(name);
    const Layer f = load(name);
    const int64_t one_sided = f.options.at("attention_window").get<int64_t>() / 2;
    for (const FlashTiles tiles : {FlashTiles{}, FlashTiles{8, 16}}) {
      const double err = relative_error(f, longformer(f, one_sided, tiles));
      EXPECT_LE(err, 1e-5) << "tiles " << tiles.br << "x" << tiles.bc;
      std::printf("[ hf ] %s tiles %lldx%lld: %.2e\n", name, static_cast<long long>(tiles.br),
                  static_cast<long long>(tiles.bc), err);
    }
    // attention_window itself as the one-sided width is not HF's layer
    EXPECT_GT(relative_error(f, longformer(f, 2 * one_sided, {})), 1e-3);
  }
}

// BigBird's layout as mods: window +-1 block, the first and last blocks global, HF's random blocks
// as a per-head pattern; with `counts`, a score_mod adds log(count) where HF gathered a key block
// more than once.
AttentionMods bigbird_mods(const Layer& f, bool counts) {
  const int64_t u = f.options.at("block_size").get<int64_t>(), nb = f.l / u;
  const Tensor& rand = f.at("rand_attn");  // [H, nb - 2, r]
  const int64_t r = rand.size(2);
  const auto ra = rand.to_vector<int64_t>();
  AttentionMods m = AttentionMods::bigbird(u, 1, 0, 0, f.l);
  std::vector<bool> pattern(static_cast<size_t>(f.heads * nb * nb));
  auto count = std::make_shared<std::vector<double>>(pattern.size(), 0.0);  // [H, nb, nb]
  for (int64_t h = 0; h < f.heads; ++h) {
    for (int64_t qb = 1; qb + 1 < nb; ++qb) {
      const auto at = [&](int64_t kb) { return static_cast<size_t>((h * nb + qb) * nb + kb); };
      for (int64_t kb : {int64_t{0}, qb - 1, qb, qb + 1, nb - 1}) (*count)[at(kb)] = 1;  // a set: q[1] has k[0] once
      for (int64_t x = 0; x < r; ++x) {
        const int64_t kb = ra[static_cast<size_t>(((h * (nb - 2)) + qb - 1) * r + x)];
        pattern[at(kb)] = true;
        (*count)[at(kb)] += 1;
      }
    }
  }
  m.block_pattern = Tensor::from_vector(pattern, {f.heads, nb, nb});
  const bool repeated = std::any_of(count->begin(), count->end(), [](double c) { return c > 1; });
  if (counts && repeated) {
    m.score_mod = [count, u, nb](double s, int64_t, int64_t h, int64_t i, int64_t j) {
      const double c = (*count)[static_cast<size_t>((h * nb + i / u) * nb + j / u)];
      return c > 1 ? s + std::log(c) : s;
    };
  }
  return m;
}

std::vector<double> bigbird(const Layer& f, bool counts, const FlashTiles& tiles, bool reference = false) {
  const Tensor& x = f.at("hidden");
  AttentionOptions o;
  o.mods = bigbird_mods(f, counts);
  o.attn_mask = key_mask(f, 0, f.b);
  o.tuning.flash_tiles = tiles;
  const Tensor q = project(f, "query", x), k = project(f, "key", x), v = project(f, "value", x);
  return merged(reference ? attention_reference(q, k, v, o).output : scaled_dot_product_attention(q, k, v, o).output);
}

TEST(HfSparseParity, BigBirdBlockSparseAttention) {
  for (const char* name : {"bigbird_eval", "bigbird_train", "bigbird_train_r3"}) {
    SCOPED_TRACE(name);
    const Layer f = load(name);
    const int64_t u = f.options.at("block_size").get<int64_t>();
    for (const FlashTiles tiles : {FlashTiles{}, FlashTiles{u, 2 * u}, FlashTiles{16, 16}}) {
      const double err = relative_error(f, bigbird(f, true, tiles));
      EXPECT_LE(err, 1e-5) << "tiles " << tiles.br << "x" << tiles.bc;
      std::printf("[ hf ] %s tiles %lldx%lld: %.2e\n", name, static_cast<long long>(tiles.br),
                  static_cast<long long>(tiles.bc), err);
    }
    EXPECT_LE(relative_error(f, bigbird(f, true, {}, true)), 1e-5);  // the float64 reference too
  }
  // In eval, HF gathers key block 0 1 + num_random_blocks times for the middle rows: without the
  // counts, the same mask is not HF's layer.
  EXPECT_GT(relative_error(load("bigbird_eval"), bigbird(load("bigbird_eval"), false, {})), 1e-3);
}

// HF's random blocks differ per head: one pattern for every head (here head 0's) is not HF's layer.
TEST(HfSparseParity, BigBirdRandomBlocksArePerHead) {
  const Layer f = load("bigbird_train");
  AttentionMods m = bigbird_mods(f, true);
  m.block_pattern = m.block_pattern->select(0, 0).contiguous();  // [nb, nb]
  AttentionOptions o;
  o.mods = m;
  o.attn_mask = key_mask(f, 0, f.b);
  const Tensor& x = f.at("hidden");
  const auto got = merged(
      scaled_dot_product_attention(project(f, "query", x), project(f, "key", x), project(f, "value", x), o).output);
  EXPECT_GT(relative_error(f, got), 1e-3);
}

}  // namespace
}  // namespace qkv
