// AttentionMods (qkv/attention_mods.h): the fused kernel (forward and backward) against the
// float64 reference with the same modifiers, and both against an independent oracle: the
// mask and biases written out densely here from the header's definitions and passed to the
// reference as a plain attn_mask.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attention/attention_test_configs.h"
#include "common/expect.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"

namespace qkv {
namespace {

using Align = AttentionMods::Align;

using test::max_abs_diff;  // NaN-aware, shapes checked (attention_test_configs.h)

void expect_gradients_near(const AttentionGradients& got, const AttentionGradients& want, double tol) {
  EXPECT_LE(max_abs_diff(got.dq, want.dq), tol);
  EXPECT_LE(max_abs_diff(got.dk, want.dk), tol);
  EXPECT_LE(max_abs_diff(got.dv, want.dv), tol);
}

struct Case {
  std::string name;
  int64_t heads, lq, lk;
  std::function<void(AttentionMods&)> set;
};

// The definition of allowed(i, j), written out for the dense oracle (header: qkv/attention_mods.h).
bool dense_allowed(const AttentionMods& m, int64_t lq, int64_t lk, int64_t i, int64_t j,
                   const std::vector<int64_t>& doc_q, const std::vector<int64_t>& doc_k) {
  if (!doc_q.empty() && doc_q[i] != doc_k[j]) return false;
  std::vector<bool> terms;
  if (m.window_left || m.window_right || m.dilation > 1) {
    const int64_t u = m.block_size;
    const int64_t d = m.align == Align::bottom_right ? i + lk - lq : i;
    const int64_t delta = static_cast<int64_t>(std::floor(double(j) / double(u)) - std::floor(double(d) / double(u)));
    terms.push_back((!m.window_left || delta >= -*m.window_left) && (!m.window_right || delta <= *m.window_right) &&
                    delta % m.dilation == 0);
  }
  if (m.prefix > 0) terms.push_back(j < m.prefix);
  if (!m.global_tokens.empty()) {
    const auto& g = m.global_tokens;
    terms.push_back(std::count(g.begin(), g.end(), i) > 0 || std::count(g.begin(), g.end(), j) > 0);
  }
  if (m.random_blocks > 0) {
    const int64_t u = m.block_size, kb = (lk + u - 1) / u;
    const auto r = random_key_blocks(m.random_seed, i / u, kb, m.random_blocks);
    terms.push_back(std::count(r.begin(), r.end(), j / u) > 0);
  }
  return terms.empty() || std::count(terms.begin(), terms.end(), true) > 0;
}

// [H, Lq, Lk] float mask: 0 / -inf from dense_allowed plus the ALiBi and relative biases.
Tensor dense_mask(const AttentionMods& m, int64_t heads, int64_t lq, int64_t lk) {
  std::vector<int64_t> dq, dk;
  if (m.document_ids) {
    dq = m.document_ids->to_vector<int64_t>();
    dk = m.key_document_ids ? m.key_document_ids->to_vector<int64_t>() : dq;
  }
  const auto slopes = m.alibi_slopes ? m.alibi_slopes->to_vector<double>() : std::vector<double>{};
  const auto rel = m.relative_bias ? m.relative_bias->to_vector<double>() : std::vector<double>{};
  std::vector<double> out(static_cast<size_t>(heads * lq * lk));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < lq; ++i) {
      for (int64_t j = 0; j < lk; ++j) {
        double bias = dense_allowed(m, lq, lk, i, j, dq, dk) ? 0.0 : -INFINITY;
        const int64_t d = m.align == Align::bottom_right ? i + lk - lq : i;
        if (!slopes.empty()) bias += slopes[h] * double(j - d);
        if (!rel.empty()) bias += rel[(m.relative_bias->size(0) == 1 ? 0 : h) * (lq + lk - 1) + j - i + lq - 1];
        out[(h * lq + i) * lk + j] = bias;
      }
    }
  }
  return Tensor::from_vector(out, {heads, lq, lk});
}

std::vector<Case> cases() {
  auto ids = [](std::vector<int64_t> v) { return Tensor::from_vector(v, {int64_t(v.size())}); };
  return {
      {"causal", 2, 70, 70, [](AttentionMods& m) { m = AttentionMods::causal(); }},
      {"causal_bottom_right", 2, 40, 90, [](AttentionMods& m) { m = AttentionMods::causal(Align::bottom_right); }},
      {"window_16_0", 2, 100, 100, [](AttentionMods& m) { m = AttentionMods::sliding_window(15, 0); }},
      {"window_8_8", 1, 64, 100, [](AttentionMods& m) { m = AttentionMods::sliding_window(8, 8); }},
      // rows [16, 32) reach key 32, the first of the next 32-key tile: the tile walk must include it
      {"window_tile_edge", 1, 64, 64, [](AttentionMods& m) { m = AttentionMods::sliding_window(3, 1); }},
      {"window_br", 2, 50, 120,
       [](AttentionMods& m) { m = AttentionMods::sliding_window(20, 3, Align::bottom_right); }},
      {"dilated", 2, 64, 64, [](AttentionMods& m) { m.window_left = 24, m.window_right = 0, m.dilation = 4; }},
      {"strided_only", 1, 48, 48, [](AttentionMods& m) { m.dilation = 5; }},
      {"prefix_lm", 2, 80, 80, [](AttentionMods& m) { m = AttentionMods::prefix_lm(17); }},
      {"longformer", 2, 96, 96,
       [](AttentionMods& m) {
         m = AttentionMods::longformer(6, 6, {0, 1, 50});
       }},
      {"globals_only", 1, 40, 40,
       [](AttentionMods& m) {
         m.global_tokens = {3, 39};
       }},
      {"bigbird", 2, 128, 128, [](AttentionMods& m) { m = AttentionMods::bigbird(16, 1, 2, 7, 128); }},
      {"bigbird_ragged", 1, 100, 100, [](AttentionMods& m) { m = AttentionMods::bigbird(16, 1, 1, 3, 100); }},
      {"documents", 2, 90, 90,
       [ids](AttentionMods& m) {
         std::vector<int64_t> d(90);
         for (int64_t i = 0; i < 90; ++i) d[i] = i < 20 ? 0 : (i < 61 ? 1 : 2);
         m.document_ids = ids(d);
       }},
      {"documents_causal", 2, 90, 90,
       [ids](AttentionMods& m) {
         std::vector<int64_t> d(90);
         for (int64_t i = 0; i < 90; ++i) d[i] = i / 33;
         m = AttentionMods::causal();
         m.document_ids = ids(d);
       }},
      {"alibi_causal", 4, 60, 60,
       [](AttentionMods& m) {
         m = AttentionMods::causal();
         m.alibi_slopes = Tensor::from_vector(std::vector<double>{0.5, 0.25, 0.125, 0.0625}, {4});
       }},
      {"relative_bias", 2, 30, 45,
       [](AttentionMods& m) {
         m.relative_bias = Tensor::randn({2, 30 + 45 - 1}, 5, DType::f64);
       }},
      {"relative_bias_shared_window", 3, 50, 50,
       [](AttentionMods& m) {
         m = AttentionMods::sliding_window(10, 10);
         m.relative_bias = Tensor::randn({1, 99}, 6, DType::f64);
       }},
  };
}

// Every mask configuration: kernel (16 x 32 tiles: empty, full and partial ones) vs reference
// vs the dense oracle, f32 and f64, output, weights and logsumexp.
TEST(AttentionMods, KernelMatchesReferenceAndTheDenseOracle) {
  for (const Case& c : cases()) {
    for (DType dt : {DType::f64, DType::f32}) {
      SCOPED_TRACE(c.name + (dt == DType::f64 ? " f64" : " f32"));
      const Tensor q = Tensor::randn({2, c.heads, c.lq, 16}, 1, dt), k = Tensor::randn({2, c.heads, c.lk, 16}, 2, dt),
                   v = Tensor::randn({2, c.heads, c.lk, 8}, 3, dt);
      AttentionOptions o;
      c.set(o.mods);
      o.return_weights = o.return_logsumexp = true;
      o.tuning.flash_tiles = {16, 32};
      const AttentionResult got = scaled_dot_product_attention(q, k, v, o);
      const AttentionResult ref = attention_reference(q, k, v, o);
      AttentionOptions dense;
      dense.attn_mask = dense_mask(o.mods, c.heads, c.lq, c.lk);
      dense.return_weights = dense.return_logsumexp = true;
      const AttentionResult oracle = attention_reference(q, k, v, dense);
      const double tol = dt == DType::f64 ? 1e-12 : 3e-6;
      EXPECT_LE(max_abs_diff(ref.output, oracle.output), 1e-12);
      EXPECT_LE(max_abs_diff(*ref.weights, *oracle.weights), 1e-12);
      EXPECT_LE(max_abs_diff(got.output, ref.output), tol);
      EXPECT_LE(max_abs_diff(*got.weights, *ref.weights), tol);
      EXPECT_LE(max_abs_diff(*got.logsumexp, *ref.logsumexp), tol * 10);
    }
  }
}

// The window alone with the kernel's own tiles: one run of keys per row tile
// (ModPlan::interval), split into several key tiles where the run outgrows the L2 (causal:
// no left edge), the rows' ends masked in partial tiles; rows with no key under masked_fill.
TEST(AttentionMods, WindowRunsWithAutomaticTilesMatchTheReference) {
  struct Run {
    const char* name;
    int64_t lq, lk;
    AttentionMods mods;
  };
  AttentionMods blocks = AttentionMods::sliding_window(3, 1);
  blocks.block_size = 4;
  AttentionMods empty_rows = AttentionMods::sliding_window(5, 0, Align::bottom_right);
  empty_rows.masked_fill = -1e9;
  const std::vector<Run> runs = {
      {"causal_window", 700, 700, AttentionMods::sliding_window(99, 0)},
      {"two_sided_bottom_right", 300, 520, AttentionMods::sliding_window(40, 25, Align::bottom_right)},
      {"causal_split_run", 2100, 2100, AttentionMods::causal()},
      {"blocks_of_4", 333, 333, blocks},
      {"rows_without_keys", 300, 200, empty_rows},
  };
  for (const Run& c : runs) {
    for (DType dt : {DType::f64, DType::f32}) {
      SCOPED_TRACE(std::string(c.name) + (dt == DType::f64 ? " f64" : " f32"));
      const Tensor q = Tensor::randn({1, 2, c.lq, 16}, 21, dt), k = Tensor::randn({1, 2, c.lk, 16}, 22, dt),
                   v = Tensor::randn({1, 2, c.lk, 8}, 23, dt);
      AttentionOptions o;
      o.mods = c.mods;
      o.return_logsumexp = true;
      o.return_weights = c.lq * c.lk < 500000;
      const AttentionResult got = scaled_dot_product_attention(q, k, v, o);
      const AttentionResult ref = attention_reference(q, k, v, o);
      const double tol = dt == DType::f64 ? 1e-12 : 3e-6;
      EXPECT_LE(max_abs_diff(got.output, ref.output), tol);
      EXPECT_LE(max_abs_diff(*got.logsumexp, *ref.logsumexp), tol * 10);
      if (o.return_weights) {
        EXPECT_LE(max_abs_diff(*got.weights, *ref.weights), tol);
      }
    }
  }
}

// BigBird with the kernel's own tiles (one block of 64 a tile): each step's window run read in
// place and its lone global and random blocks copied into slots that later row tiles of the
// head reuse (run_group, place_gathered); row tiles with global queries first. A ragged last
// block and causal masking give tiles narrower than a block among the lone ones.
TEST(AttentionMods, BigBirdWithAutomaticTilesMatchesTheReference) {
  struct Run {
    const char* name;
    int64_t l;
    bool causal;
  };
  for (const Run& c : {Run{"L1024", 1024, false}, Run{"ragged_L1000", 1000, false}, Run{"causal_L900", 900, true}}) {
    for (DType dt : {DType::f64, DType::f32}) {
      SCOPED_TRACE(std::string(c.name) + (dt == DType::f64 ? " f64" : " f32"));
      const Tensor q = Tensor::randn({1, 2, c.l, 16}, 41, dt), k = Tensor::randn({1, 2, c.l, 16}, 42, dt),
                   v = Tensor::randn({1, 2, c.l, 8}, 43, dt);
      AttentionOptions o;
      o.mods = AttentionMods::bigbird(64, 1, 2, 9, c.l);
      o.is_causal = c.causal;
      o.return_logsumexp = true;
      const AttentionResult got = scaled_dot_product_attention(q, k, v, o);
      const AttentionResult ref = attention_reference(q, k, v, o);
      const double tol = dt == DType::f64 ? 1e-12 : 3e-6;
      EXPECT_LE(max_abs_diff(got.output, ref.output), tol);
      EXPECT_LE(max_abs_diff(*got.logsumexp, *ref.logsumexp), tol * 10);
    }
  }
}

// The gathered tiles' Q K^T on K packed once per call (attention_cpu_panels.h): one packed
// copy per distinct k/v head (GQA, a k/v batch broadcast by a zero stride), K rows apart by
// more than Dk, Dk not a multiple of 16 (padded panel rows), tiles of one panel (blocks of
// 16 and 64) and of two (blocks of 128), a ragged last tile; against the float64 reference.
TEST(AttentionMods, BigBirdOnPackedKeysMatchesTheReference) {
  struct Run {
    const char* name;
    int64_t block, l, dk;
    bool causal;
  };
  for (const Run& c : {Run{"block64_dk40", 64, 700, 40, false}, Run{"block128", 128, 900, 64, false},
                       Run{"block16_causal", 16, 400, 32, true}}) {
    SCOPED_TRACE(c.name);
    const Tensor q = Tensor::randn({2, 2, c.l, c.dk}, 51);
    const Tensor k = Tensor::randn({1, 1, c.l, c.dk + 24}, 52).slice(-1, 0, c.dk).expand({2, 1, c.l, c.dk});
    const Tensor v = Tensor::randn({2, 1, c.l, 24}, 53);
    AttentionOptions o;
    o.mods = AttentionMods::bigbird(c.block, 1, 2, 7, c.l);
    o.enable_gqa = true;
    o.is_causal = c.causal;
    o.return_logsumexp = true;
    const AttentionResult got = scaled_dot_product_attention(q, k, v, o);
    const AttentionResult ref = attention_reference(q, k, v, o);
    EXPECT_LE(max_abs_diff(got.output, ref.output), 3e-6);
    EXPECT_LE(max_abs_diff(*got.logsumexp, *ref.logsumexp), 3e-5);
  }
}

// 16-bit inputs through the run path (the window) and the gathered block tiles (BigBird,
// Longformer's globals): against the float64 reference on the same rounded inputs, within
// the rounding of P to the input type for P V (native bf16 tiles; f16 and widened bf16
// tiles run the per-tile path) and of the output.
TEST(AttentionMods, SixteenBitInputsMatchTheReference) {
  const std::vector<std::pair<const char*, AttentionMods>> masks = {
      {"window", AttentionMods::sliding_window(70, 0)},
      {"bigbird", AttentionMods::bigbird(16, 1, 2, 5, 256)},
      {"longformer", AttentionMods::longformer(20, 20, {0, 3, 200})},
  };
  for (const auto& [name, mods] : masks) {
    for (DType dt : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(std::string(name) + (dt == DType::bf16 ? " bf16" : " f16"));
      const Tensor q = Tensor::randn({1, 2, 256, 32}, 31).to(dt), k = Tensor::randn({1, 2, 256, 32}, 32).to(dt),
                   v = Tensor::randn({1, 2, 256, 16}, 33).to(dt);
      AttentionOptions o;
      o.mods = mods;
      const Tensor got = scaled_dot_product_attention(q, k, v, o).output;
      const Tensor want = attention_reference(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64), o).output;
      EXPECT_EQ(got.dtype(), dt);
      // The output's rounding and P's (bf16 tiles): measured 0.0022-0.0040 (bf16), 0.0002-0.0004 (f16).
      EXPECT_LE(max_abs_diff(got.to(DType::f64), want), (dt == DType::bf16 ? 0x1.0p-8 : 0x1.0p-11) * 2.0);
    }
  }
}

// Gradients through every mask configuration: the fused backward against the float64
// backward reference with the same mods, and against the dense-mask backward.
TEST(AttentionMods, BackwardMatchesReferenceAndTheDenseOracle) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    const Tensor q = Tensor::randn({1, c.heads, c.lq, 8}, 4, DType::f64),
                 k = Tensor::randn({1, c.heads, c.lk, 8}, 5, DType::f64),
                 v = Tensor::randn({1, c.heads, c.lk, 4}, 6, DType::f64);
    AttentionOptions o;
    c.set(o.mods);
    o.return_logsumexp = true;
    o.tuning.flash_tiles = {16, 16};
    const AttentionResult fwd = scaled_dot_product_attention(q, k, v, o);
    const Tensor g = Tensor::randn(fwd.output.shape(), 7, DType::f64);
    const AttentionGradients got = scaled_dot_product_attention_backward(q, k, v, fwd.output, g, *fwd.logsumexp, o);
    const AttentionGradients ref = attention_backward_reference(q, k, v, g, o);
    AttentionOptions dense;
    dense.attn_mask = dense_mask(o.mods, c.heads, c.lq, c.lk);
    const AttentionGradients oracle = attention_backward_reference(q, k, v, g, dense);
    for (int t = 0; t < 3; ++t) {
      const Tensor* a[] = {&got.dq, &got.dk, &got.dv};
      const Tensor* b[] = {&ref.dq, &ref.dk, &ref.dv};
      const Tensor* d[] = {&oracle.dq, &oracle.dk, &oracle.dv};
      EXPECT_LE(max_abs_diff(*a[t], *b[t]), 1e-11) << "dqkv"[t];
      EXPECT_LE(max_abs_diff(*b[t], *d[t]), 1e-12) << "dqkv"[t];
    }
  }
}

TEST(AttentionMods, SoftcapForwardAndBackward) {
  const Tensor q = Tensor::uniform({2, 2, 37, 8}, 8, -4.0, 4.0, DType::f64),  // large scores: the cap bites
      k = Tensor::randn({2, 2, 53, 8}, 9, DType::f64), v = Tensor::randn({2, 2, 53, 8}, 10, DType::f64);
  AttentionOptions o;
  o.mods = AttentionMods::sliding_window(12, 4);
  o.mods.softcap = 2.5;
  o.return_logsumexp = true;
  o.tuning.flash_tiles = {8, 16};
  const AttentionResult got = scaled_dot_product_attention(q, k, v, o);
  const AttentionResult ref = attention_reference(q, k, v, o);
  EXPECT_LE(max_abs_diff(got.output, ref.output), 1e-12);
  // one score by hand: cap the product, then softmax over the row's keys
  const Tensor g = Tensor::randn(got.output.shape(), 11, DType::f64);
  const AttentionGradients gk = scaled_dot_product_attention_backward(q, k, v, got.output, g, *got.logsumexp, o);
  expect_gradients_near(gk, attention_backward_reference(q, k, v, g, o), 1e-11);
  // central differences of sum(g * out) in q[0,0,5,3] (float64)
  const double h = 1e-6;
  auto loss = [&](double delta) {
    Tensor qq = q.clone();
    qq.set_item({0, 0, 5, 3}, q.item({0, 0, 5, 3}) + delta);
    const auto out = attention_reference(qq, k, v, o).output.to_vector<double>();
    const auto gv = g.to_vector<double>();
    double s = 0.0;
    for (size_t i = 0; i < out.size(); ++i) s += out[i] * gv[i];
    return s;
  };
  EXPECT_NEAR((loss(h) - loss(-h)) / (2 * h), gk.dq.item({0, 0, 5, 3}), 1e-6);
}

TEST(AttentionMods, MaskedFillGivesUniformRowsAsSeed002) {
  // Keys 0..9 belong to document 0, queries 0..4 to document 1: those rows see no key.
  std::vector<int64_t> qd(12, 0), kd(10, 0);
  for (int i = 0; i < 5; ++i) qd[i] = 1;
  const Tensor q = Tensor::randn({1, 2, 12, 8}, 12), k = Tensor::randn({1, 2, 10, 8}, 13),
               v = Tensor::randn({1, 2, 10, 4}, 14);
  AttentionOptions o;
  o.mods.document_ids = Tensor::from_vector(qd, {12});
  o.mods.key_document_ids = Tensor::from_vector(kd, {10});
  o.mods.masked_fill = -1e9;
  o.return_weights = o.return_logsumexp = true;
  const AttentionResult got = scaled_dot_product_attention(q, k, v, o);
  const AttentionResult ref = attention_reference(q, k, v, o);
  EXPECT_LE(max_abs_diff(got.output, ref.output), 2e-6);
  EXPECT_LE(max_abs_diff(*got.weights, *ref.weights), 1e-6);
  EXPECT_LE(max_abs_diff(*got.logsumexp, *ref.logsumexp), 1e-6 * 1e9);
  for (int64_t c = 0; c < 4; ++c) {  // row 0 of head 1: the mean of v
    double mean = 0.0;
    for (int64_t j = 0; j < 10; ++j) mean += v.item({0, 1, j, c}) / 10.0;
    EXPECT_NEAR(got.output.item({0, 1, 0, c}), mean, 1e-6);
    EXPECT_NEAR(got.weights->item({0, 1, 0, c}), 0.1, 1e-7);
  }
  // without masked_fill the same rows are zeros (safe softmax)
  o.mods.masked_fill.reset();
  EXPECT_EQ(scaled_dot_product_attention(q, k, v, o).output.item({0, 1, 0, 0}), 0.0);
}

// Lk = 0 under a window: interval_tiles split the empty run of keys into 0 pieces and divided
// by them (SIGFPE: the process died). No keys is the empty softmax, as PyTorch's: output 0, lse
// -inf, dq 0, and empty dk and dv.
TEST(AttentionMods, AWindowOverNoKeysIsTheEmptySoftmaxNotADivisionByZero) {
  for (DType dt : {DType::f32, DType::f64}) {
    const Tensor q = Tensor::randn({2, 1, 3, 8}, 1, dt), k = Tensor::zeros({2, 1, 0, 8}, dt),
                 v = Tensor::zeros({2, 1, 0, 4}, dt);
    AttentionOptions o;
    o.mods = AttentionMods::sliding_window(3, 0);
    o.return_logsumexp = true;
    const AttentionResult r = scaled_dot_product_attention(q, k, v, o);
    ASSERT_EQ(r.output.shape(), (Shape{2, 1, 3, 4}));
    for (double x : r.output.to_vector<double>()) EXPECT_EQ(x, 0.0);
    for (double x : r.logsumexp->to_vector<double>()) EXPECT_EQ(x, -INFINITY);
    const AttentionGradients g =
        scaled_dot_product_attention_backward(q, k, v, r.output, Tensor::ones({2, 1, 3, 4}, dt), *r.logsumexp, o);
    for (double x : g.dq.to_vector<double>()) EXPECT_EQ(x, 0.0);
    EXPECT_EQ(g.dk.numel(), 0);
    EXPECT_EQ(g.dv.numel(), 0);
  }
}

// masked_fill's rows without an allowed key average v over every key, and dropout applies to
// those uniform weights as to any: with v_j the unit vector e_j, output[i, j] is m_ij / Lk with
// m_ij in {0, 1 / (1 - p)}. The kernel gave the undropped 1 / Lk everywhere (O(1) off the
// reference and its own returned weights).
TEST(AttentionMods, DropoutReachesTheUniformRowsOfMaskedFill) {
  constexpr int64_t kLq = 40, kLk = 6;
  constexpr double kP = 0.5;
  std::vector<double> eye(kLk * kLk, 0.0);
  for (int64_t j = 0; j < kLk; ++j) eye[static_cast<size_t>(j * kLk + j)] = 1.0;
  const Tensor q = Tensor::randn({1, 2, kLq, 4}, 3, DType::f64), k = Tensor::randn({1, 2, kLk, 4}, 4, DType::f64);
  const Tensor v = Tensor::from_vector(eye, {kLk, kLk}).expand({1, 2, kLk, kLk});  // v_j = e_j
  AttentionOptions o;
  o.mods = AttentionMods::sliding_window(1, 0);  // rows i >= Lk + 1 have no key
  o.mods.masked_fill = -1e9;
  o.dropout_p = kP;
  o.seed = 5;
  const Tensor out = scaled_dot_product_attention(q, k, v, o).output;  // [1, 2, Lq, Lk]
  int dropped = 0, kept = 0;
  for (int64_t h = 0; h < 2; ++h) {
    for (int64_t i = kLk + 1; i < kLq; ++i) {
      for (int64_t j = 0; j < kLk; ++j) {
        const double x = out.item({0, h, i, j});
        if (x == 0.0) {
          ++dropped;
        } else {
          ++kept;
          EXPECT_NEAR(x, 1.0 / (1.0 - kP) / kLk, 1e-15) << h << " " << i << " " << j;
        }
      }
    }
  }
  EXPECT_GT(dropped, 100);  // of 396: p = 0.5
  EXPECT_GT(kept, 100);
  // and each key dropped where the float64 reference (the same seed's draws, softmax of the
  // filled scores) drops it: an off-by-one dropout index would pass the counts above
  EXPECT_LE(max_abs_diff(out, attention_reference(q, k, v, o).output), 1e-12);
}

TEST(AttentionMods, FunctorsComposeWithTheBuiltIns) {
  const Tensor q = Tensor::randn({2, 3, 33, 8}, 15, DType::f64), k = Tensor::randn({2, 3, 41, 8}, 16, DType::f64),
               v = Tensor::randn({2, 3, 41, 8}, 17, DType::f64);
  AttentionOptions o;
  o.mods = AttentionMods::sliding_window(9, 9);
  o.mods.mask_mod = [](int64_t b, int64_t h, int64_t i, int64_t j) { return (i + j + b + h) % 3 != 0 || i == j; };
  o.mods.score_mod = [](double s, int64_t b, int64_t h, int64_t i, int64_t j) {
    return s + 0.1 * double(h) - 0.01 * double(std::abs(i - j)) + double(b);
  };
  o.tuning.flash_tiles = {8, 8};
  const AttentionResult got = scaled_dot_product_attention(q, k, v, o);
  EXPECT_LE(max_abs_diff(got.output, attention_reference(q, k, v, o).output), 1e-12);
  o.return_logsumexp = true;
  const AttentionResult f = scaled_dot_product_attention(q, k, v, o);
  EXPECT_THROW_WITH(scaled_dot_product_attention_backward(q, k, v, f.output, f.output, *f.logsumexp, o), ValueError,
                    "scaled_dot_product_attention_backward: mods.score_mod and mods.masked_fill have no backward");
}

TEST(AttentionMods, ErrorsNameTheModifierAndTheShapes) {
  const Tensor q = Tensor::randn({1, 2, 6, 4}, 1), k = Tensor::randn({1, 2, 7, 4}, 2),
               v = Tensor::randn({1, 2, 7, 4}, 3);
  AttentionOptions o;
  o.mods.alibi_slopes = Tensor::zeros({3});
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, v, o), ShapeError,
                    "scaled_dot_product_attention: mods.alibi_slopes must have shape [2], got [3]");
  o = {};
  o.mods.document_ids = Tensor::zeros({6}, DType::i64);
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, v, o), ValueError,
                    "mods.document_ids with Lq 6 != Lk 7 needs key_document_ids");
  o.mods.key_document_ids = Tensor::zeros({7});
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, v, o), DTypeError,
                    "mods.key_document_ids must be int32 or int64, got float32");
  o = {};
  o.mods.relative_bias = Tensor::zeros({2, 10});
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, v, o), ShapeError,
                    "mods.relative_bias must be floating [2 or 1, 12] (Lq + Lk - 1), got float32 [2, 10]");
  o = {};
  o.mods.window_left = -1;
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, v, o), ValueError, "window sides, prefix and random_blocks");
  o = {};
  o.mods.masked_fill = -1e9;
  o.is_causal = true;
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, v, o), ValueError,
                    "mods.masked_fill must be finite and cannot be combined with attn_mask or is_causal");
  o = {};
  o.mods.global_tokens = {7};
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, v, o), ValueError,
                    "mods.global_tokens: position 7 is outside [0, 7)");
  o = {};
  o.mods.block_size = 4;
  o.mods.block_pattern = Tensor::zeros({2, 3}, DType::b8);
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, v, o), ShapeError,
                    "mods.block_pattern must be bool [2, 2] or [2, 2, 2] (per head; blocks of 4), got bool [2, 3]");
  o.mods.block_pattern = Tensor::zeros({3, 2, 2}, DType::b8);  // 3 heads for 2
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, v, o), ShapeError, "got bool [3, 2, 2]");
}

// A block pattern per head (bool [Hq, Lq / u, Lk / u], as BigBird's per-head random blocks and
// FlexAttention's per-head block masks): forward and backward against the reference and a dense
// [H, Lq, Lk] mask written from the definition, with tiles that mix heads' blocks.
TEST(AttentionMods, PerHeadBlockPatternMatchesTheDenseOracle) {
  const int64_t heads = 3, lq = 40, lk = 57, u = 8, qb = 5, kb = 8;
  std::mt19937_64 rng(21);
  std::vector<bool> pattern(static_cast<size_t>(heads * qb * kb));
  for (size_t x = 0; x < pattern.size(); ++x) pattern[x] = rng() % 3 == 0;
  std::vector<double> mask(static_cast<size_t>(heads * lq * lk));
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < lq; ++i) {
      for (int64_t j = 0; j < lk; ++j) {
        const bool ok = pattern[static_cast<size_t>((h * qb + i / u) * kb + j / u)] || i / u == j / u;
        mask[static_cast<size_t>((h * lq + i) * lk + j)] = ok ? 0.0 : -INFINITY;
      }
    }
  }
  AttentionOptions o;
  o.mods.block_size = u;
  o.mods.window_left = o.mods.window_right = 0;  // each query block's own keys, OR the pattern
  o.mods.block_pattern = Tensor::from_vector(pattern, {heads, qb, kb});
  o.return_weights = o.return_logsumexp = true;
  const Tensor q = Tensor::randn({2, heads, lq, 8}, 22, DType::f64),
               k = Tensor::randn({2, heads, lk, 8}, 23, DType::f64),
               v = Tensor::randn({2, heads, lk, 4}, 24, DType::f64);
  AttentionOptions dense;
  dense.attn_mask = Tensor::from_vector(mask, {heads, lq, lk});
  dense.return_weights = true;
  const AttentionResult oracle = attention_reference(q, k, v, dense);
  const AttentionResult ref = attention_reference(q, k, v, o);
  EXPECT_LE(max_abs_diff(ref.output, oracle.output), 1e-12);
  EXPECT_LE(max_abs_diff(*ref.weights, *oracle.weights), 1e-12);
  for (const FlashTiles tiles : {FlashTiles{8, 8}, FlashTiles{16, 32}}) {
    o.tuning.flash_tiles = tiles;
    const AttentionResult got = scaled_dot_product_attention(q, k, v, o);
    EXPECT_LE(max_abs_diff(got.output, oracle.output), 1e-12);
    EXPECT_LE(max_abs_diff(*got.weights, *oracle.weights), 1e-12);
    const Tensor g = Tensor::randn(got.output.shape(), 25, DType::f64);
    const AttentionGradients gk = scaled_dot_product_attention_backward(q, k, v, got.output, g, *got.logsumexp, o);
    expect_gradients_near(gk, attention_backward_reference(q, k, v, g, dense), 1e-11);
  }
}

TEST(AttentionMods, RandomKeyBlocksAreSeededDistinctAndSorted) {
  const auto a = random_key_blocks(5, 3, 20, 4), b = random_key_blocks(5, 3, 20, 4);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 4u);
  EXPECT_TRUE(std::is_sorted(a.begin(), a.end()));
  EXPECT_EQ(std::adjacent_find(a.begin(), a.end()), a.end());
  EXPECT_NE(a, random_key_blocks(6, 3, 20, 4));
  EXPECT_EQ(random_key_blocks(1, 0, 3, 10), (std::vector<int64_t>{0, 1, 2}));
}

// Windows as wide as int64 allows (the C++ API takes any size; Python caps them at 2^61) are every key:
// qb + right + 1 overflowed, and rows saw no keys at all.
TEST(AttentionMods, WindowsOfInt64MaxAllowEveryKey) {
  const Tensor q = Tensor::randn({1, 2, 5, 8}, 1), k = Tensor::randn({1, 2, 7, 8}, 2),
               v = Tensor::randn({1, 2, 7, 8}, 3);
  const AttentionResult want = scaled_dot_product_attention(q, k, v);
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  for (Align align : {Align::top_left, Align::bottom_right}) {
    for (int64_t block : {1, 2}) {
      AttentionOptions o;
      o.mods = AttentionMods::sliding_window(kMax, kMax, block == 1 ? align : Align::top_left);
      o.mods.block_size = block;
      EXPECT_LE(max_abs_diff(scaled_dot_product_attention(q, k, v, o).output, want.output), 1e-6);
      o.mods.dilation = 1000;  // past every distance: the query's own (diagonal) block only
      const Tensor own = scaled_dot_product_attention(q, k, v, o).output;
      o.mods.dilation = kMax;
      EXPECT_LE(max_abs_diff(scaled_dot_product_attention(q, k, v, o).output, own), 0.0);
    }
  }
}

// A block as long as int64 allows is one block over every position (as any block_size >= L): Lq + u - 1
// overflowed in the block counts.
TEST(AttentionMods, BlocksOfInt64MaxAreOneBlock) {
  const Tensor q = Tensor::randn({1, 2, 5, 8}, 1), k = Tensor::randn({1, 2, 7, 8}, 2),
               v = Tensor::randn({1, 2, 7, 8}, 3);
  AttentionOptions o;
  o.mods = AttentionMods::sliding_window(0, 0);
  o.mods.block_size = 7;
  o.mods.random_blocks = 1;
  const AttentionResult want = attention_reference(q, k, v, o);
  EXPECT_LE(max_abs_diff(want.output, scaled_dot_product_attention(q, k, v).output), 1e-6);
  o.mods.block_size = std::numeric_limits<int64_t>::max();
  EXPECT_LE(max_abs_diff(scaled_dot_product_attention(q, k, v, o).output, want.output), 1e-6);
  EXPECT_LE(max_abs_diff(attention_reference(q, k, v, o).output, want.output), 1e-12);
  o.mods.block_pattern = Tensor::ones({1, 1}, DType::b8);
  EXPECT_LE(max_abs_diff(scaled_dot_product_attention(q, k, v, o).output, want.output), 1e-6);
}

}  // namespace
}  // namespace qkv
