// qkv's tile classification under AttentionMods (attention/mods.h: ModPlan::classify, which the
// fused kernel uses to skip empty tiles and to skip element masking in full ones) against
// PyTorch FlexAttention's create_block_mask on the same masks (tests/fixtures/flex, written by
// tests/attention/make_flex_fixtures.py with torch 2.15, blocks of 16 x 16): kv_indices lists
// each query block's partial key blocks, full_kv_indices its full ones, the rest are empty.
// The C++ kernel's outputs on those fixtures are checked here too (Python:
// tests/python/test_py_attention_mods.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "attention/attention_test_configs.h"
#include "attention/mods.h"
#include "attention/mods_reference.h"
#include "common/sdpa_fixtures.h"
#include "qkv/attention.h"
#include "qkv/io_tensor_files.h"

namespace qkv {
namespace {

constexpr int64_t kBlock = 16;  // make_flex_fixtures.py's BLOCK_SIZE

// The fixture's "qkv_mods" JSON as AttentionMods (tensor fields name the file's tensors).
AttentionMods mods_of(const io::SafetensorsFile& f) {
  const auto j = nlohmann::json::parse(f.metadata.at("qkv_mods"));
  AttentionMods m;
  auto tensor = [&](const char* key) { return f.tensors.at(j.at(key).get<std::string>()); };
  if (j.contains("align") && j.at("align") == "bottom_right") m.align = AttentionMods::Align::bottom_right;
  if (j.contains("window_left")) m.window_left = j.at("window_left").get<int64_t>();
  if (j.contains("window_right")) m.window_right = j.at("window_right").get<int64_t>();
  m.dilation = j.value("dilation", int64_t{1});
  m.block_size = j.value("block_size", int64_t{1});
  m.prefix = j.value("prefix", int64_t{0});
  m.global_tokens = j.value("global_tokens", std::vector<int64_t>{});
  m.softcap = j.value("softcap", 0.0);
  if (j.contains("block_pattern")) m.block_pattern = tensor("block_pattern");
  if (j.contains("document_ids")) m.document_ids = tensor("document_ids");
  if (j.contains("alibi_slopes")) m.alibi_slopes = tensor("alibi_slopes");
  if (j.contains("relative_bias")) m.relative_bias = tensor("relative_bias");
  return m;
}

// FlexAttention's class of key block kb for query block qb.
attention::TileClass flex_class(const io::SafetensorsFile& f, int64_t qb, int64_t kb) {
  auto listed = [&](const char* count, const char* indices) {
    const Tensor& idx = f.tensors.at(indices);  // [QB, KB]
    const auto n = f.tensors.at(count).to_vector<int64_t>()[static_cast<size_t>(qb)];
    const auto row = idx.select(0, qb).to_vector<int64_t>();
    return std::find(row.begin(), row.begin() + n, kb) != row.begin() + n;
  };
  if (listed("full_kv_num_blocks", "full_kv_indices")) return attention::TileClass::full;
  return listed("kv_num_blocks", "kv_indices") ? attention::TileClass::partial : attention::TileClass::empty;
}

const char* name_of(attention::TileClass c) {
  return c == attention::TileClass::empty ? "empty" : (c == attention::TileClass::full ? "full" : "partial");
}

TEST(FlexBlockMask, TileClassesMatchCreateBlockMask) {
  const auto files = sdpa_fixtures::fixture_files(sdpa_fixtures::fixture_dir("flex"));
  ASSERT_EQ(files.size(), 11u);
  int compared = 0;
  for (const auto& path : files) {
    SCOPED_TRACE(path.stem().string());
    const io::SafetensorsFile f = io::load_safetensors(path);
    const Tensor &q = f.tensors.at("q"), &k = f.tensors.at("k"), &v = f.tensors.at("v");  // [1, H, L, D]
    AttentionOptions o;
    o.mods = mods_of(f);
    EXPECT_LE(test::max_abs_diff(scaled_dot_product_attention(q, k, v, o).output, f.tensors.at("out")), 1e-12);
    if (!f.tensors.count("kv_indices")) continue;  // no mask_mod (relative_bias): no block mask
    const int64_t lq = q.size(2), lk = k.size(2);
    const attention::ModPlan plan = attention::make_mod_plan(o.mods, lq, lk, q.size(1));
    int differ = 0;
    for (int64_t qb = 0; qb * kBlock < lq; ++qb) {
      for (int64_t kb = 0; kb * kBlock < lk; ++kb) {
        const int64_t i1 = std::min(lq, (qb + 1) * kBlock), j1 = std::min(lk, (kb + 1) * kBlock);
        const auto ours = plan.classify(qb * kBlock, i1, kb * kBlock, j1), theirs = flex_class(f, qb, kb);
        // FlexAttention pads a ragged last block with masked positions: it is never full there.
        const bool ragged = i1 - qb * kBlock < kBlock || j1 - kb * kBlock < kBlock;
        const bool same =
            ours == theirs || (ragged && ours == attention::TileClass::full && theirs == attention::TileClass::partial);
        EXPECT_TRUE(same) << "block (" << qb << ", " << kb << "): qkv " << name_of(ours) << ", FlexAttention "
                          << name_of(theirs);
        differ += ours != theirs;
        ++compared;
      }
    }
    std::printf("[ flex ] %s: %lld x %lld blocks, %d classed otherwise (ragged edges)\n", path.stem().c_str(),
                static_cast<long long>((lq + kBlock - 1) / kBlock), static_cast<long long>((lk + kBlock - 1) / kBlock),
                differ);
  }
  EXPECT_GT(compared, 0);
}

// Every tile classification against the element-wise definition (the float64 reference's
// ReferenceMods::allowed, every head): `empty` only when no head allows a key of the tile,
// `full` only when every head allows all of them (the kernel then skips the element mask).
TEST(FlexBlockMask, TileClassesAreSound) {
  std::mt19937_64 rng(31);
  int full = 0, empty = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int64_t heads = 1 + static_cast<int64_t>(rng() % 3), lq = 1 + static_cast<int64_t>(rng() % 50);
    const int64_t lk = 1 + static_cast<int64_t>(rng() % 50), u = std::vector<int64_t>{1, 3, 8}[rng() % 3];
    const int64_t qb = (lq + u - 1) / u, kb = (lk + u - 1) / u;
    AttentionMods m;
    m.block_size = u;
    if (rng() % 2) m.window_left = static_cast<int64_t>(rng() % 3), m.window_right = static_cast<int64_t>(rng() % 3);
    if (rng() % 3 == 0) m.dilation = 2;
    for (int64_t t = 0; t < std::min(lq, lk); ++t) {
      if (rng() % 7 == 0) m.global_tokens.push_back(t);
    }
    if (rng() % 2) {  // a pattern for every head or one per head, some blocks set in all heads
      const int64_t ph = rng() % 2 ? heads : 1;
      std::vector<bool> pattern(static_cast<size_t>(ph * qb * kb));
      for (size_t x = 0; x < pattern.size(); ++x) pattern[x] = x % static_cast<size_t>(qb * kb) % 4 == 0 || rng() % 2;
      m.block_pattern = ph == 1 ? Tensor::from_vector(pattern, {qb, kb}) : Tensor::from_vector(pattern, {ph, qb, kb});
    }
    if (rng() % 3 == 0) m.random_blocks = 1, m.random_seed = rng();
    const attention::ModPlan plan = attention::make_mod_plan(m, lq, lk, heads);
    const attention::ReferenceMods ref(m, lq, lk, heads);
    for (const auto& [br, bc] : {std::pair<int64_t, int64_t>{5, 7}, {8, 16}, {16, 16}}) {
      for (int64_t i0 = 0; i0 < lq; i0 += br) {
        for (int64_t j0 = 0; j0 < lk; j0 += bc) {
          const int64_t i1 = std::min(lq, i0 + br), j1 = std::min(lk, j0 + bc);
          bool some = false, all = true;
          for (int64_t h = 0; h < heads; ++h) {
            for (int64_t i = i0; i < i1; ++i) {
              for (int64_t j = j0; j < j1; ++j) {
                const bool ok = ref.allowed(h, i, j);
                some = some || ok, all = all && ok;
              }
            }
          }
          const attention::TileClass c = plan.classify(i0, i1, j0, j1);
          ASSERT_TRUE(c != attention::TileClass::empty || !some) << "trial " << trial << " tile " << i0 << ", " << j0;
          ASSERT_TRUE(c != attention::TileClass::full || all) << "trial " << trial << " tile " << i0 << ", " << j0;
          full += c == attention::TileClass::full, empty += c == attention::TileClass::empty;
        }
      }
    }
  }
  EXPECT_GT(full, 0);  // the trials reach both shortcuts
  EXPECT_GT(empty, 0);
}

// ModPlan::interval (the window alone): each query's allowed keys are exactly the run
// [key_lo(i), key_hi(i)) with both ends non-decreasing in i, against the element-wise
// definition; any other mask term turns the run path off.
TEST(FlexBlockMask, WindowRunsMatchTheDefinition) {
  std::mt19937_64 rng(47);
  int runs = 0;
  for (int trial = 0; trial < 80; ++trial) {
    const int64_t lq = 1 + static_cast<int64_t>(rng() % 60), lk = 1 + static_cast<int64_t>(rng() % 60);
    AttentionMods m;
    m.block_size = std::vector<int64_t>{1, 1, 3, 8}[rng() % 4];
    if (m.block_size == 1 && rng() % 2) m.align = AttentionMods::Align::bottom_right;
    if (rng() % 4) m.window_left = static_cast<int64_t>(rng() % 20) / m.block_size;
    if (!m.window_left || rng() % 4) m.window_right = static_cast<int64_t>(rng() % 20) / m.block_size;
    const attention::ModPlan plan = attention::make_mod_plan(m, lq, lk, 1);
    const attention::ReferenceMods ref(m, lq, lk, 1);
    ASSERT_TRUE(plan.interval) << "trial " << trial;
    for (int64_t i = 0; i < lq; ++i) {
      if (i > 0) {
        ASSERT_LE(plan.key_lo(i - 1), plan.key_lo(i)) << "trial " << trial << " row " << i;
        ASSERT_LE(plan.key_hi(i - 1), plan.key_hi(i)) << "trial " << trial << " row " << i;
      }
      for (int64_t j = 0; j < lk; ++j) {
        const bool in_run = plan.key_lo(i) <= j && j < plan.key_hi(i);
        ASSERT_EQ(in_run, ref.allowed(0, i, j)) << "trial " << trial << " query " << i << " key " << j;
        runs += in_run;
      }
    }
  }
  EXPECT_GT(runs, 0);
  const std::vector<std::function<void(AttentionMods&)>> others = {
      [](AttentionMods& m) { m.dilation = 2; },
      [](AttentionMods& m) { m.prefix = 3; },
      [](AttentionMods& m) { m.global_tokens = {1}; },
      [](AttentionMods& m) { m.random_blocks = 1; },
      [](AttentionMods& m) { m.document_ids = Tensor::from_vector(std::vector<int64_t>(10, 0), {10}); },
      [](AttentionMods& m) { m.mask_mod = [](int64_t, int64_t, int64_t, int64_t) { return true; }; },
  };
  for (size_t x = 0; x < others.size(); ++x) {
    AttentionMods m = AttentionMods::sliding_window(4, 0);
    others[x](m);
    EXPECT_FALSE(attention::make_mod_plan(m, 10, 10, 1).interval) << "term " << x;
  }
}

}  // namespace
}  // namespace qkv
