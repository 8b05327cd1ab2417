// qkv::KVCache + qkv::decode_attention (+ qkv::apply_rotary) against ONNX Runtime's
// GroupQueryAttention (issue 17 item 4). The fixtures (tests/fixtures/gqa/*.safetensors) come
// from tests/attention/make_gqa_fixtures.py: ORT 1.32's CPU kernel, float32, run step by step —
// a prompt or a first step with a given past, then decode steps whose past is the previous
// present — with ragged seqlens_k, GQA (Hq = 8, Hk = 2) and MQA, rotary (NeoX, GPT-J, partial),
// softcap, a custom scale and local_window_size. tests/python/test_decode_ort.py reads the same.
//
// One qkv cache lives through every step, as a generation loop keeps it: a prompt is appended
// with counts = each sequence's length (ORT right-pads it), later steps append their S tokens;
// decode_attention runs the S queries as each sequence's last S positions, so a padded prompt's
// rows are moved to the end of q and back. Two ways: by hand, queries and keys are rotated with
// apply_rotary at ORT's position ids (prompt: t; later: past + t) into a plain cache, and
// DecodeOptions::window = local_window_size (ORT 1.32's W: a query sees the W keys up to its
// own); fused, the cache carries the rotary settings and the window (KVCacheConfig::rotary,
// ::window: a ring of W + S - 1 slots, which the window scenario wraps) and takes the tokens
// unrotated. Output rows that are tokens and the cache's stored keys/values (sequence_keys,
// from first_kept) must equal ORT's output and present_key/present_value to 1e-5 relative
// (max |qkv - ORT| / max |ORT|; seen: <= 4.1e-7 both ways).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "nn/fixtures.h"
#include "qkv/kv_cache.h"
#include "qkv/rotary.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

namespace fs = std::filesystem;
using nn::testing::relative_error;  // max |got - want| / max |want|

constexpr double kTol = 1e-5;

std::vector<fs::path> fixture_files() { return nn::testing::fixture_files("gqa"); }

struct Gqa {
  nn::testing::Fixture f;  // options: the node's attributes, shapes, steps, rotary base / dim
  int64_t b = 0, hq = 0, hk = 0, d = 0, steps = 0;

  const Tensor& get(const std::string& key) const { return f.at(key); }
  const Tensor& step(int64_t i, const std::string& what) const { return f.at("step" + std::to_string(i) + "." + what); }
  int64_t attr(const char* key, int64_t fallback) const { return f.options.value(key, fallback); }
};

Gqa load(const fs::path& path) {
  Gqa g{nn::testing::load_fixture(path)};
  const nlohmann::json& o = g.f.options;
  g.b = o.at("batch"), g.hq = o.at("num_heads"), g.hk = o.at("kv_num_heads"), g.d = o.at("head_dim");
  g.steps = o.at("steps");
  return g;
}

// ORT's [B, S, H*D] as qkv's [B, H, S, D].
Tensor heads(const Tensor& x, int64_t h) {
  const int64_t b = x.shape()[0], s = x.shape()[1];
  return x.reshape({b, s, h, x.shape()[2] / h}).permute({0, 2, 1, 3}).contiguous();
}

int64_t window_of(const Gqa& g) { return std::max<int64_t>(g.attr("local_window_size", -1), 0); }

CacheRotary rotary_of(const Gqa& g) {
  const RotaryLayout layout = g.attr("rotary_interleaved", 0) != 0 ? RotaryLayout::gptj : RotaryLayout::neox;
  return {g.f.options.at("rotary_base").get<double>(), layout, g.f.options.at("rotary_dim").get<int64_t>()};
}

// By hand: x rotated at `positions` ([B, S] flattened); fused: x as it is (the cache rotates).
Tensor rotate(const Gqa& g, const Tensor& x, const std::vector<int64_t>& positions, bool fused) {
  if (fused || g.attr("do_rotary", 0) == 0) return x;
  const CacheRotary c = rotary_of(g);
  RotaryOptions r;
  r.base = c.base, r.layout = c.layout, r.rotary_dim = c.rotary_dim;
  r.positions = Tensor::from_vector(positions, {g.b, x.shape()[2]});
  return apply_rotary(x, r);
}

KVCache make_cache(const Gqa& g, bool fused) {
  KVCacheConfig config;  // fields by name: KVCacheConfig keeps growing
  config.batch = g.b, config.kv_heads = g.hk, config.head_dim = g.d;
  config.capacity = g.step(g.steps - 1, "total_sequence_length").to_vector<int64_t>()[0];
  if (fused) {
    int64_t longest_step = 0;
    for (int64_t i = 0; i < g.steps; ++i) longest_step = std::max(longest_step, g.step(i, "query").shape()[1]);
    config.window = window_of(g);
    if (config.window > 0) config.capacity = config.window + longest_step - 1;  // the ring a step needs
    if (g.attr("do_rotary", 0) != 0) config.rotary = rotary_of(g);
  }
  return KVCache(config);
}

DecodeOptions decode_options(const Gqa& g, bool fused) {
  DecodeOptions o;
  if (g.f.options.contains("scale")) o.scale = g.f.options.at("scale").get<double>();
  o.softcap = g.f.options.value("softcap", 0.0);
  o.window = fused ? 0 : window_of(g);  // fused: the cache's window
  return o;
}

// Step i on `cache` (holding `held` tokens per sequence); compares with ORT and updates `held`.
void run_step(const Gqa& g, int64_t i, KVCache& cache, std::vector<int64_t>& held, bool fused) {
  SCOPED_TRACE("step " + std::to_string(i));
  const Tensor q = heads(g.step(i, "query"), g.hq);  // [B, Hq, S, D]
  const Tensor k = heads(g.step(i, "key"), g.hk), v = heads(g.step(i, "value"), g.hk);
  const int64_t s = q.shape()[2];
  const auto total = g.step(i, "seqlens_k").to_vector<int64_t>();
  const bool prompt = i == 0 && g.get("step0.past_key").shape()[2] == 0 &&
                      g.get("step0.total_sequence_length").to_vector<int64_t>()[0] == s;
  std::vector<int64_t> counts(g.b), positions;
  for (int64_t b = 0; b < g.b; ++b) {
    counts[b] = prompt ? total[b] + 1 : s;
    ASSERT_EQ(held[b] + counts[b], total[b] + 1) << "the fixture's lengths disagree with its steps";
    for (int64_t t = 0; t < s; ++t) positions.push_back(prompt ? t : held[b] + t);
  }
  cache.append(rotate(g, k, positions, fused), v, counts);
  const Tensor rq = rotate(g, q, positions, fused);
  const Tensor shifted = Tensor::zeros(q.shape());  // sequence b's counts[b] queries as its last rows
  for (int64_t b = 0; b < g.b; ++b) {
    shifted.select(0, b).slice(1, s - counts[b], s).copy_from(rq.select(0, b).slice(1, 0, counts[b]));
  }
  const Tensor out = decode_attention(shifted, cache, decode_options(g, fused)).output;  // [B, Hq, S, D]
  const Tensor want = heads(g.step(i, "output"), g.hq);
  for (int64_t b = 0; b < g.b; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    held[b] += counts[b];
    EXPECT_EQ(cache.length(b), held[b]);
    EXPECT_LE(relative_error(out.select(0, b).slice(1, s - counts[b], s), want.select(0, b).slice(1, 0, counts[b])),
              kTol);
    const int64_t first = cache.first_kept(b);  // > 0 once a ring evicted old positions
    const std::pair<Tensor, const char*> stored[] = {{cache.sequence_keys(b), "present_key"},
                                                     {cache.sequence_values(b), "present_value"}};
    for (const auto& [mine, theirs] : stored) {
      const Tensor ort = g.step(i, theirs).select(0, b).slice(1, first, held[b]);  // [Hk, kept, D]
      EXPECT_LE(relative_error(mine, ort), kTol) << theirs;
    }
  }
}

class DecodeOrtTest : public ::testing::TestWithParam<std::tuple<fs::path, bool>> {};

TEST_P(DecodeOrtTest, EqualsGroupQueryAttention) {
  const auto& [path, fused] = GetParam();
  const Gqa g = load(path);
  SCOPED_TRACE(g.f.name + (fused ? " (fused): " : " (by hand): ") + g.f.options.dump());
  KVCache cache = make_cache(g, fused);
  std::vector<int64_t> held(g.b, 0);
  const Tensor& past_k = g.get("step0.past_key");
  if (past_k.shape()[2] > 0) {  // a first step with a given past: the cache starts with ORT's past
    // ORT's past keys are rotated already: a fused-rotary cache would rotate them again
    ASSERT_EQ(g.attr("do_rotary", 0), 0) << "no scenario gives a rotated past";
    const auto total = g.step(0, "seqlens_k").to_vector<int64_t>();
    const int64_t s = g.step(0, "query").shape()[1];
    for (int64_t b = 0; b < g.b; ++b) held[b] = total[b] + 1 - s;
    cache.append(past_k, g.get("step0.past_value"), held);
  }
  for (int64_t i = 0; i < g.steps; ++i) run_step(g, i, cache, held, fused);
}

std::string param_name(const ::testing::TestParamInfo<std::tuple<fs::path, bool>>& info) {
  return std::get<0>(info.param).stem().string() + (std::get<1>(info.param) ? "_fused" : "_by_hand");
}

INSTANTIATE_TEST_SUITE_P(Ort, DecodeOrtTest,
                         ::testing::Combine(::testing::ValuesIn(fixture_files()), ::testing::Bool()), param_name);

// A missing or emptied fixture directory must fail, not pass with no cases.
TEST(DecodeOrtFixtures, AllScenariosPresent) {
  std::vector<std::string> names;
  for (const fs::path& p : fixture_files()) names.push_back(p.stem().string());
  for (const char* want :
       {"prefill_ragged", "decode_ragged", "generate", "mqa_generate", "chunked_prefill", "softcap_scale",
        "rotary_neox", "rotary_gptj", "rotary_partial", "window", "window_rotary_softcap"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), want), names.end()) << want << " (regenerate: make fixtures)";
  }
}

}  // namespace
}  // namespace qkv
