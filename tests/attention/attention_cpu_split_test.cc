// The fused forward's key parts (split-KV: attention_cpu_split.h, attention_cpu.cc run_split):
// calls with too few work items for their workers cut each item's key tiles into parts whose
// partials are merged by logsumexp. Against the float64 reference (attention_reference) on 2-4
// threads over the random configurations of the forward's tests cut down to few items (every
// mask kind, causal with Lq != Lk, GQA, Dk != Dv, dropout, scale, x1000 logits), in f64, f32
// and bf16/f16 (the narrow output path), with the logsumexp; NaN, Inf and fully masked rows as
// the reference has them and as the unsplit call does; int8 Q K^T, score modifiers and windows;
// the paths that stay whole (weights, listed tiles); that the split happens where the rule says
// (key_tile_parts, and the count of parts run), bit-for-bit repeatability, and interrupts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "attention/attention_cpu_split.h"
#include "attention/attention_test_configs.h"
#include "attention/naive_f32.h"
#include "common/thread_guard.h"
#include "qkv/attention.h"
#include "qkv/parallel.h"

namespace qkv {
namespace {

using test::Config;
using test::Inputs;
using test::max_abs;
using test::max_abs_diff;

// The call's expected key parts: the rule on its items and key tiles (tiles cut to the lengths
// as choose_flash_tiles cuts them; no weights, no mask modifiers).
int64_t expected_parts(const Config& c, FlashTiles t, int threads) {
  const int64_t br = std::min(t.br, c.lq), bc = std::min(t.bc, c.lk);
  const int64_t longest = c.causal ? std::min(c.lq, c.lk) : c.lk;
  return attention::key_tile_parts(c.b * c.hq * ((c.lq + br - 1) / br), threads, (longest + bc - 1) / bc);
}

// Few items over several key tiles: one batch entry of 1-3 key heads (GQA groups of 1-2), a
// short query block (causal: long enough for its diagonal to span key tiles), keys of several
// tiles; every 8th has Lq = 1 or Lk = 1 (the latter never splits).
Config split_config(std::mt19937_64& rng, int i) {
  Config c = test::random_config(rng, i);
  c.b = 1, c.kv_batch_one = false;
  c.hk = test::pick<int64_t>(rng, {1, 1, 3});
  c.hq = c.gqa ? c.hk * test::pick<int64_t>(rng, {1, 2}) : c.hk;
  if (i % 8 != 0) c.lq = test::pick<int64_t>(rng, {2, 7, 13, 16, 31, 33, 50});
  if (i % 8 != 1) c.lk = test::pick<int64_t>(rng, {95, 160, 300, 513});
  if (c.causal && i % 8 != 0) c.lq = test::pick<int64_t>(rng, {40, 65, 100});  // keys up to the diagonal
  return c;
}

Inputs in_dtype(Inputs in, DType dt) {
  in.q = in.q.to(dt), in.k = in.k.to(dt), in.v = in.v.to(dt);
  const DType mask_dt = dt == DType::f64 ? DType::f64 : DType::f32;
  if (in.options.attn_mask && in.options.attn_mask->dtype() != DType::b8) {
    in.options.attn_mask = in.options.attn_mask->to(mask_dt);
  }
  return in;
}

// NaN exactly where `want` has NaN, the same infinities, elsewhere |got - want| <= tol.
::testing::AssertionResult close_like(const char* what, const Tensor& got, const Tensor& want, double tol) {
  if (got.shape() != want.shape()) return ::testing::AssertionFailure() << what << ": shapes differ";
  const std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < w.size(); ++i) {
    const bool ok = std::isnan(w[i])   ? std::isnan(g[i])
                    : std::isinf(w[i]) ? g[i] == w[i]
                                       : std::isfinite(g[i]) && std::fabs(g[i] - w[i]) <= tol;
    if (!ok) return ::testing::AssertionFailure() << what << "[" << i << "]: " << g[i] << ", want " << w[i];
  }
  return ::testing::AssertionSuccess();
}

// The same values, NaN where NaN (run-to-run repeatability).
::testing::AssertionResult same_bits(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_vector<double>(), y = b.to_vector<double>();
  for (size_t i = 0; i < x.size(); ++i) {
    if (!(x[i] == y[i] || (std::isnan(x[i]) && std::isnan(y[i])))) {
      return ::testing::AssertionFailure() << "[" << i << "]: " << x[i] << " vs " << y[i];
    }
  }
  return ::testing::AssertionSuccess();
}

double finite_max(const Tensor& t) {
  double m = 0.0;
  for (double x : t.to_vector<double>()) m = std::isfinite(x) ? std::max(m, std::fabs(x)) : m;
  return m;
}

int64_t parts_run() { return attention::forward_key_parts_run().load(); }

TEST(ForwardKeyParts, RuleSplitsOnlyWhereItemsLeaveWorkersIdle) {
  using attention::key_tile_parts;
  EXPECT_EQ(key_tile_parts(1, 2, 32), 2);    // one item on 2 workers
  EXPECT_EQ(key_tile_parts(3, 2, 32), 2);    // 3 on 2: 6 parts, 3 each
  EXPECT_EQ(key_tile_parts(8, 16, 64), 2);   // chunked prefill: H = 8, one row tile, 16 cores
  EXPECT_EQ(key_tile_parts(5, 16, 64), 16);  // 80 parts, 5 each
  EXPECT_EQ(key_tile_parts(6, 4, 64), 2);    // 12 parts, 3 each
  EXPECT_EQ(key_tile_parts(1, 16, 4), 4);    // at most the key tiles
  EXPECT_EQ(key_tile_parts(1, 2, 1), 1);     // one key tile: nothing to cut
  EXPECT_EQ(key_tile_parts(4, 2, 32), 1);    // a multiple of the workers
  EXPECT_EQ(key_tile_parts(9, 2, 32), 1);    // 4 or more items a worker
  EXPECT_EQ(key_tile_parts(1, 1, 32), 1);    // one worker
  EXPECT_EQ(key_tile_parts(0, 2, 32), 1);    // no items
}

// Random configurations on 2-4 threads and three tile shapes, each dtype against the float64
// reference: f64 to 1e-11 of max |v| (1e-6 with x1000 logits), f32 within FlashAttention's
// criterion (twice the naive float32 error, attention_cpu_test.cc), bf16/f16 within their
// rounding of the output and of P (2^-7 / 2^-10 of max |v|); the logsumexp likewise. Parts run
// exactly where the rule says, and a second call gives the same bits.
TEST(ForwardKeyParts, SplitCallsMatchTheFloat64Reference) {
  const test::ThreadCountGuard guard;
  std::mt19937_64 rng(3404);
  int split = 0, total = 0;
  double worst = 0.0;
  for (int i = 0; i < 48; ++i) {
    Config c = split_config(rng, i);
    const DType dt = std::vector<DType>{DType::f64, DType::f32, DType::bf16, DType::f16}[static_cast<size_t>(i % 4)];
    if (dt == DType::bf16 || dt == DType::f16) c.big = false;  // x1000 scores in 16-bit: the rounding of q.k alone
    const FlashTiles tiles = std::vector<FlashTiles>{{32, 16}, {16, 64}, {64, 32}}[static_cast<size_t>(i % 3)];
    const int threads = 2 + i % 3;
    Inputs in = in_dtype(test::make_inputs(c), dt);
    in.options.tuning.flash_tiles = tiles;
    in.options.return_logsumexp = i % 2 == 0;
    const AttentionResult ref = attention_reference(in.q, in.k, in.v, in.options);
    set_num_threads(threads);
    const int64_t before = parts_run();
    const AttentionResult got = scaled_dot_product_attention(in.q, in.k, in.v, in.options);
    const bool ran_parts = parts_run() > before;
    const AttentionResult again = scaled_dot_product_attention(in.q, in.k, in.v, in.options);
    set_num_threads(1);
    const std::string where = c.str() + " " + std::string(dtype_name(dt)) + " threads " + std::to_string(threads);
    EXPECT_EQ(ran_parts, expected_parts(c, tiles, threads) > 1) << where;
    split += ran_parts ? 1 : 0, ++total;
    const double v_max = max_abs(in.v.to(DType::f64));
    double tol = 0.0;
    if (dt == DType::f64) {
      tol = (c.big ? 1e-6 : 1e-11) * std::max(1.0, v_max);
    } else if (dt == DType::f32) {
      const Tensor naive = attention::attention_naive_f32(in.q, in.k, in.v, in.options).output;
      tol = 2.0 * max_abs_diff(naive, ref.output) + 0x1.0p-23 * v_max;
    } else {
      tol = (dt == DType::bf16 ? 0x1.0p-6 : 0x1.0p-9) * std::max(1.0, v_max);
    }
    EXPECT_TRUE(close_like("output", got.output, ref.output, tol)) << where;
    if (v_max > 0) worst = std::max(worst, max_abs_diff(got.output, ref.output) / v_max);
    EXPECT_TRUE(same_bits(got.output, again.output)) << where;
    if (in.options.return_logsumexp) {
      ASSERT_TRUE(got.logsumexp && ref.logsumexp) << where;
      const double lse_max = finite_max(*ref.logsumexp);
      const double lse_tol = (dt == DType::f64 ? 1e-11 : c.big ? 1e-5 : 2e-5) * std::max(1.0, lse_max);
      EXPECT_TRUE(close_like("logsumexp", *got.logsumexp, *ref.logsumexp, lse_tol)) << where;
      EXPECT_TRUE(same_bits(*got.logsumexp, *again.logsumexp)) << where;
    }
  }
  EXPECT_GE(split, total / 2);  // the configurations are meant to split
  std::printf("key parts: %d of %d calls split, worst error / max|v| %.2e\n", split, total, worst);
}

// One f32 problem of 3 heads of 40 query rows over 700 keys in 64 x 32 tiles: 3 items, split
// on 2 workers (2 parts each) and 4 (4 each); the edits of each test.
struct Split {
  Tensor q = Tensor::randn({1, 3, 40, 16}, 1), k = Tensor::randn({1, 3, 700, 16}, 2);
  Tensor v = Tensor::randn({1, 3, 700, 8}, 3);
  AttentionOptions o;
  Split() {
    o.return_logsumexp = true;
    o.tuning.flash_tiles = FlashTiles{64, 32};
  }
};

Tensor with_value(const Tensor& t, const std::vector<int64_t>& index, double value) {
  Tensor c = t.clone();
  c.set_item(index, value);
  return c;
}

// On 2 and 4 workers (split) the output and logsumexp as the reference has them (NaN, infinities,
// exact zeros of masked rows, finite values to 1e-5 of the largest) and as one worker (whole
// items) has them: NaN in the same elements, the same infinities and zeros.
void expect_split_like_reference_and_whole(const Split& in) {
  const test::ThreadCountGuard guard;
  const AttentionResult ref = attention_reference(in.q, in.k, in.v, in.o);
  set_num_threads(1);
  const AttentionResult whole = scaled_dot_product_attention(in.q, in.k, in.v, in.o);
  for (int threads : {2, 4}) {
    set_num_threads(threads);
    const int64_t before = parts_run();
    const AttentionResult got = scaled_dot_product_attention(in.q, in.k, in.v, in.o);
    EXPECT_GT(parts_run(), before) << threads;
    for (const auto& [name, g, w, u] : {std::tuple{"output", got.output, ref.output, whole.output},
                                        std::tuple{"logsumexp", *got.logsumexp, *ref.logsumexp, *whole.logsumexp}}) {
      const double scale = std::max(1.0, finite_max(w));
      EXPECT_TRUE(close_like(name, g, w, 1e-5 * scale)) << threads << " workers";
      EXPECT_TRUE(close_like(name, g, u, 1e-5 * scale)) << threads << " workers, against one";
      const std::vector<double> x = g.to_vector<double>(), y = u.to_vector<double>();
      for (size_t e = 0; e < x.size(); ++e) {
        if (x[e] == 0.0 || y[e] == 0.0 || std::isinf(x[e]) || std::isinf(y[e])) {
          EXPECT_EQ(x[e], y[e]) << name << "[" << e << "], " << threads << " workers";
        }
      }
    }
  }
}

TEST(ForwardKeyPartsNonFinite, NaNInQKOrMaskAndMaskedRows) {
  Split in;
  in.q = with_value(in.q, {0, 0, 13, 5}, NAN);   // row 13 of head 0
  in.k = with_value(in.k, {0, 1, 650, 0}, NAN);  // every row of head 1 (a late part)
  std::vector<float> mask(40 * 700, 0.0f);       // [40, 700] float
  for (int64_t j = 0; j < 700; ++j) mask[static_cast<size_t>(7 * 700 + j)] = -INFINITY;  // row 7: none
  for (int64_t j = 0; j < 350; ++j) mask[static_cast<size_t>(9 * 700 + j)] = -INFINITY;  // row 9: a part's keys none
  mask[20 * 700 + 333] = NAN;                                                            // row 20 of every head
  in.o.attn_mask = Tensor::from_vector(mask, {40, 700});
  expect_split_like_reference_and_whole(in);
  set_num_threads(2);
  const AttentionResult r = scaled_dot_product_attention(in.q, in.k, in.v, in.o);
  EXPECT_TRUE(std::isnan(r.output.item({0, 0, 13, 0})));
  EXPECT_TRUE(std::isnan(r.output.item({0, 1, 5, 0})));
  EXPECT_TRUE(std::isnan(r.output.item({0, 2, 20, 3})));
  EXPECT_EQ(r.output.item({0, 2, 7, 0}), 0.0);
  EXPECT_EQ(r.logsumexp->item({0, 2, 7}), -INFINITY);
  EXPECT_FALSE(std::isnan(r.output.item({0, 2, 9, 0})));
}

TEST(ForwardKeyPartsNonFinite, NonFiniteVReachesEveryRowOfItsKeyMaskedRowsIncluded) {
  Split in;
  in.v = with_value(in.v, {0, 0, 500, 2}, NAN);
  in.v = with_value(in.v, {0, 1, 10, 6}, INFINITY);
  Tensor mask = Tensor::ones({40, 700}, DType::b8);
  for (int64_t j = 0; j < 700; ++j) mask.set_item({12, j}, 0);  // row 12: every key masked
  in.o.attn_mask = mask;
  expect_split_like_reference_and_whole(in);
  set_num_threads(2);
  const AttentionResult r = scaled_dot_product_attention(in.q, in.k, in.v, in.o);
  EXPECT_TRUE(std::isnan(r.output.item({0, 0, 12, 2})));  // 0 v of a masked row: NaN where v is
  EXPECT_TRUE(std::isnan(r.output.item({0, 1, 12, 6})));  // 0 inf
  EXPECT_EQ(r.output.item({0, 1, 3, 6}), INFINITY);
  EXPECT_EQ(r.output.item({0, 0, 12, 1}), 0.0);
}

TEST(ForwardKeyPartsNonFinite, CausalNaNKey) {
  Split in;
  in.q = Tensor::randn({1, 3, 40, 16}, 4);
  in.o.is_causal = true;
  in.o.tuning.flash_tiles = FlashTiles{64, 8};  // 5 key tiles for the one row tile
  in.k = with_value(in.k, {0, 0, 25, 3}, NAN);  // rows >= 25 NaN
  expect_split_like_reference_and_whole(in);
}

// int8 Q K^T (each part quantizes its item's Q rows as the item would) and the score modifiers
// (softcap, ALiBi: per score, whatever the tiles) split too: against the float64 reference
// (int8: its documented error, 5e-2 of max |v|) and against one worker (whole items: 1e-5).
TEST(ForwardKeyParts, Int8AndScoreModifiersSplit) {
  const test::ThreadCountGuard guard;
  Split in;
  AttentionOptions int8 = in.o, mods = in.o;
  int8.qk_quantization = QKQuantization::int8;
  mods.mods.softcap = 2.0;
  mods.mods.alibi_slopes = Tensor::from_vector(std::vector<float>{0.5f, 0.25f, 0.125f}, {3});
  for (const auto& [o, tol] : {std::pair{int8, 5e-2}, std::pair{mods, 1e-5}}) {
    const AttentionResult ref = attention_reference(in.q, in.k, in.v, o);
    set_num_threads(1);
    const AttentionResult whole = scaled_dot_product_attention(in.q, in.k, in.v, o);
    set_num_threads(2);
    const int64_t before = parts_run();
    const AttentionResult got = scaled_dot_product_attention(in.q, in.k, in.v, o);
    EXPECT_GT(parts_run(), before) << tol;
    const double v_max = max_abs(in.v);
    EXPECT_LE(max_abs_diff(got.output, ref.output), tol * v_max);
    EXPECT_LE(max_abs_diff(got.output, whole.output), 1e-5 * v_max);
  }
}

// A window alone (one run of keys per row tile: bottom-right causal, a sliding window, both
// sides; one with masked_fill) splits its run; against the float64 reference and against one
// worker (whole items).
TEST(ForwardKeyParts, WindowsSplitTheirRun) {
  const test::ThreadCountGuard guard;
  Split in;
  std::vector<AttentionOptions> cases(4, in.o);
  cases[0].mods = AttentionMods::causal(AttentionMods::Align::bottom_right);  // a prefill chunk's causal mask
  cases[1].mods = AttentionMods::sliding_window(300, 0, AttentionMods::Align::bottom_right);
  cases[2].mods = AttentionMods::sliding_window(200, 150);
  cases[3].mods = AttentionMods::sliding_window(500, 0, AttentionMods::Align::bottom_right);
  cases[3].mods.masked_fill = -1e9;
  for (const AttentionOptions& o : cases) {
    const AttentionResult ref = attention_reference(in.q, in.k, in.v, o);
    set_num_threads(1);
    const AttentionResult whole = scaled_dot_product_attention(in.q, in.k, in.v, o);
    for (int threads : {2, 4}) {
      set_num_threads(threads);
      const int64_t before = parts_run();
      const AttentionResult got = scaled_dot_product_attention(in.q, in.k, in.v, o);
      EXPECT_GT(parts_run(), before) << threads;
      const double v_max = max_abs(in.v);
      EXPECT_TRUE(close_like("output", got.output, ref.output, 1e-5 * v_max)) << threads;
      EXPECT_TRUE(close_like("output", got.output, whole.output, 1e-5 * v_max)) << threads;
      EXPECT_TRUE(close_like("logsumexp", *got.logsumexp, *ref.logsumexp, 1e-5 * finite_max(*ref.logsumexp)));
    }
  }
}

// The weights' second pass and mask modifiers that list tiles (a prefix LM's, block masks')
// keep items whole (attention_cpu.cc key_parts): no parts run, and the call matches the reference.
TEST(ForwardKeyParts, WeightsAndListedTilesKeepItemsWhole) {
  const test::ThreadCountGuard guard;
  Split in;
  AttentionOptions weights = in.o, prefix = in.o;
  weights.return_weights = true;
  prefix.mods = AttentionMods::prefix_lm(100);
  set_num_threads(2);
  for (const AttentionOptions& o : {weights, prefix}) {
    const int64_t before = parts_run();
    const AttentionResult got = scaled_dot_product_attention(in.q, in.k, in.v, o);
    EXPECT_EQ(parts_run(), before);
    EXPECT_LE(max_abs_diff(got.output, attention_reference(in.q, in.k, in.v, o).output), 1e-5 * max_abs(in.v));
  }
}

// An interrupt while key parts run (one item, 2 workers, many small tiles: the stopper waits
// until the call has started its parts) ends the call with Interrupted.
TEST(ForwardKeyParts, InterruptWhilePartsRunEnds) {
  const test::ThreadCountGuard guard;
  const Tensor q = Tensor::randn({1, 1, 16, 64}, 1), k = Tensor::randn({1, 1, 1 << 18, 64}, 2);
  AttentionOptions o;
  o.tuning.flash_tiles = FlashTiles{16, 16};  // 16384 key tiles
  set_num_threads(2);
  const int64_t before = parts_run();
  std::thread stopper([before] {
    while (parts_run() == before) std::this_thread::yield();
    request_interrupt();
  });
  EXPECT_THROW((void)scaled_dot_product_attention(q, k, k, o), Interrupted);
  stopper.join();
  clear_interrupt();
}

}  // namespace
}  // namespace qkv
