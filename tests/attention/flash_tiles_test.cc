// The fused kernel's tiles as an explicit option (AttentionOptions::tuning), the
// QKV_FLASH_TILES override, and the one checked Problem each call builds.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>

#include "attention/flash_tiles.h"
#include "attention/problem.h"
#include "common/expect.h"
#include "kernels/cpu/aligned_vector.h"
#include "qkv/attention.h"
#include "qkv/attention_flops.h"

namespace qkv {
namespace {

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<double>(), y = b.to_vector<double>();
  double m = 0;
  for (size_t i = 0; i < x.size(); ++i) m = std::max(m, std::fabs(x[i] - y[i]));
  return m;
}

// attention_flops against a brute-force count of the unmasked (query, key) pairs, top-left causal:
// Lq < Lk, Lq = Lk and Lq > Lk (rows past Lk see every key).
TEST(AttentionFlops, CountsTheUnmaskedPairs) {
  for (int64_t lq : {1, 3, 7, 16}) {
    for (int64_t lk : {1, 4, 7, 20}) {
      for (bool causal : {false, true}) {
        int64_t pairs = 0;
        for (int64_t i = 0; i < lq; ++i) {
          for (int64_t j = 0; j < lk; ++j) pairs += (!causal || j <= i) ? 1 : 0;
        }
        EXPECT_EQ(attention_flops(2, 3, lq, lk, 5, causal), 4.0 * 2 * 3 * 5 * static_cast<double>(pairs))
            << lq << " x " << lk << (causal ? " causal" : "");
      }
    }
  }
  EXPECT_EQ(attention_flops(1, 2, 6, 8, true), attention_flops(1, 2, 6, 6, 8, true));  // the Lq = Lk form
}

// kernels::AlignedVector's one promise: data() on a 64-byte boundary, at sizes std::vector's
// allocator leaves 16 or 48 bytes into a line (glibc), and after a resize.
TEST(AlignedVector, DataIsCacheLineAligned) {
  for (size_t n : {size_t{1}, size_t{1000}, size_t{32768}, size_t{1} << 20}) {
    kernels::AlignedVector<float> v(n);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u) << n;
    v.resize(3 * n + 1);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v.data()) % 64, 0u) << n;
  }
}

TEST(FlashTiles, ParsesBrXBcAndRejectsTheRest) {
  const auto t = attention::parse_flash_tiles("64x256");
  ASSERT_TRUE(t);
  EXPECT_EQ(t->br, 64);
  EXPECT_EQ(t->bc, 256);
  for (const char* bad : {"", "64", "64x", "x256", "0x256", "64x-1", "64x256x", "ax b"}) {
    EXPECT_FALSE(attention::parse_flash_tiles(bad)) << bad;
  }
  EXPECT_FALSE(attention::parse_flash_tiles(nullptr));
}

// QKV_FLASH_TILES is read at the first call only: a later setenv changes nothing.
TEST(FlashTiles, TheEnvironmentIsReadOnce) {
  const std::optional<FlashTiles> first = attention::flash_tiles_from_env();
  const char* before = std::getenv("QKV_FLASH_TILES");
  const std::string saved = before ? before : "";
  ::setenv("QKV_FLASH_TILES", first && first->br == 3 ? "5x7" : "3x9", 1);
  const std::optional<FlashTiles> second = attention::flash_tiles_from_env();
  if (before) {
    ::setenv("QKV_FLASH_TILES", saved.c_str(), 1);
  } else {
    ::unsetenv("QKV_FLASH_TILES");
  }
  ASSERT_EQ(first.has_value(), second.has_value());
  if (first) {
    EXPECT_EQ(first->br, second->br);
    EXPECT_EQ(first->bc, second->bc);
  }
}

// Options win over the environment, the environment over the cache-sized
// choice; every choice is cut to [Lq, Lk].
TEST(FlashTiles, OptionsWinOverTheEnvironmentWhichWinsOverTheAutomaticChoice) {
  const FlashTiles env{64, 256}, asked{5, 7}, automatic = attention::auto_flash_tiles(64, 64, false);
  auto pick = [](const FlashTiles& requested, const std::optional<FlashTiles>& e, int64_t lq, int64_t lk) {
    return attention::choose_flash_tiles(requested, e, lq, lk, 64, 64, false);
  };
  const FlashTiles a = pick(asked, env, 1000, 1000), b = pick({}, env, 1000, 1000), c = pick({}, {}, 1000, 1000);
  EXPECT_EQ(a.br, 5);
  EXPECT_EQ(a.bc, 7);
  EXPECT_EQ(b.br, 64);
  EXPECT_EQ(b.bc, 256);
  EXPECT_EQ(c.br, automatic.br);
  EXPECT_EQ(c.bc, automatic.bc);
  const FlashTiles cut = pick({4096, 4096}, {}, 3, 10), empty = pick({4096, 4096}, {}, 0, 0);
  EXPECT_EQ(cut.br, 3);
  EXPECT_EQ(cut.bc, 10);
  EXPECT_EQ(empty.br, 1);
  EXPECT_EQ(empty.bc, 1);
  const FlashTiles causal = attention::auto_flash_tiles(64, 64, true);
  EXPECT_EQ(causal.bc, 2 * causal.br);  // key tiles backwards from the diagonal (flash_tiles.h)
  // Long causal problems: square tiles of 128 to 256 that fit the L2; shorter ones as above.
  const int64_t budget = attention::l2_cache_bytes() / 4;
  for (const int64_t d : {64, 128}) {
    const FlashTiles lng = attention::choose_flash_tiles({}, {}, 9000, 8192, d, d, true);
    EXPECT_EQ(lng.br, lng.bc);
    EXPECT_TRUE(lng.br == 128 || lng.br == 256) << lng.br;
    EXPECT_TRUE(lng.br == 128 || attention::flash_working_set(lng.br, lng.bc, d, d) <= budget);
    const FlashTiles shorter = attention::choose_flash_tiles({}, {}, 9000, 8191, d, d, true);
    EXPECT_EQ(shorter.bc, 2 * shorter.br);
  }
}

// Causal on 256 x 256 tiles (the automatic choice of long causal problems): the f64 kernel
// against the float64 reference, several diagonal tiles and a ragged last one, GQA.
TEST(FlashTiles, CausalOnLargeSquareTilesMatchesTheReference) {
  const Tensor q = Tensor::randn({1, 4, 600, 40}, 1).to(DType::f64),
               k = Tensor::randn({1, 2, 600, 40}, 2).to(DType::f64);
  const Tensor v = Tensor::randn({1, 2, 600, 24}, 3).to(DType::f64);
  AttentionOptions o;
  o.is_causal = true;
  o.enable_gqa = true;
  o.return_logsumexp = true;
  const AttentionResult ref = attention_reference(q, k, v, o);
  o.tuning.flash_tiles = FlashTiles{256, 256};
  const AttentionResult r = scaled_dot_product_attention(q, k, v, o);
  EXPECT_LE(max_abs_diff(r.output, ref.output), 1e-12);
  EXPECT_LE(max_abs_diff(*r.logsumexp, *ref.logsumexp), 1e-12);
}

// Never below 128 keys or rows (the old L2 rule gave 64 x 64 at D = 512); wide heads take 256
// rows, long non-causal problems 512 (flash_tiles.h: kMinBc, kWideHead, kLongKeys).
TEST(FlashTiles, AutomaticTilesWidenRowsForWideHeadsAndLongProblems) {
  for (const int64_t d : {1, 16, 64, 128, 256, 512, 1024, 4096}) {
    for (const bool causal : {false, true}) {
      const FlashTiles t = attention::auto_flash_tiles(d, d, causal, 1000);
      EXPECT_GE(t.bc, 128) << d;
      EXPECT_LE(t.bc, 512) << d;
      EXPECT_EQ(t.br, causal ? 128 : (d >= 512 ? 256 : 128)) << d;
    }
  }
  EXPECT_EQ(attention::auto_flash_tiles(64, 64, false).bc, 512);  // as before: 128 x 512 at D = 64
  EXPECT_EQ(attention::auto_flash_tiles(64, 64, false, attention::kLongKeys).br, 512);
  EXPECT_EQ(attention::auto_flash_tiles(512, 64, false, attention::kLongKeys).br, 512);
  EXPECT_EQ(attention::auto_flash_tiles(64, 64, false, attention::kLongKeys - 1).br, 128);
  EXPECT_EQ(attention::auto_flash_tiles(64, 64, true, attention::kLongKeys).br, 256);  // causal: square
  // A short side cuts the 512 rows (choose_flash_tiles): Lq = 300 of a long Lk.
  EXPECT_EQ(attention::choose_flash_tiles({}, {}, 300, 20000, 64, 64, false).br, 128);
}

// The kernel on the automatic wide-head tiles (256 x 128 at Dk = Dv = 512, ragged last tiles)
// and on 512-row tiles with a ragged last one: the float64 kernel within 1e-12 of the reference.
TEST(FlashTiles, WideHeadAndLongProblemTilesMatchTheReference) {
  const Tensor q = Tensor::randn({1, 2, 300, 512}, 1).to(DType::f64),
               k = Tensor::randn({1, 2, 270, 512}, 2).to(DType::f64);
  const Tensor v = Tensor::randn({1, 2, 270, 512}, 3).to(DType::f64);
  const Tensor q2 = Tensor::randn({1, 2, 1100, 24}, 4).to(DType::f64),
               k2 = Tensor::randn({1, 2, 700, 24}, 5).to(DType::f64);
  const Tensor v2 = Tensor::randn({1, 2, 700, 16}, 6).to(DType::f64);
  AttentionOptions o;
  o.return_logsumexp = true;
  for (const auto& [qq, kk, vv, tiles] : {std::tuple{q, k, v, FlashTiles{}}, std::tuple{q2, k2, v2, FlashTiles{512, 256}},
                                         std::tuple{q2, k2, v2, FlashTiles{512, 128}}}) {
    o.tuning.flash_tiles = tiles;
    const AttentionResult ref = attention_reference(qq, kk, vv, o);
    const AttentionResult r = scaled_dot_product_attention(qq, kk, vv, o);
    EXPECT_LE(max_abs_diff(r.output, ref.output), 1e-12) << tiles.br << "x" << tiles.bc;
    EXPECT_LE(max_abs_diff(*r.logsumexp, *ref.logsumexp), 1e-12) << tiles.br << "x" << tiles.bc;
  }
}

// Tiles passed in the options reach the kernel: every tile shape gives the
// float64 reference's numbers within FlashAttention's float32 budget, as the
// automatic choice does, on lengths that straddle many tiles.
TEST(FlashTiles, TilesInOptionsGiveTheReferenceNumbersAsTheAutomaticChoice) {
  const Tensor q = Tensor::randn({2, 3, 67, 16}, 1), k = Tensor::randn({2, 3, 91, 16}, 2);
  const Tensor v = Tensor::randn({2, 3, 91, 8}, 3);
  for (const bool causal : {false, true}) {
    AttentionOptions o;
    o.is_causal = causal;
    o.return_logsumexp = true;
    const AttentionResult ref = attention_reference(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64), o);
    const AttentionResult automatic = scaled_dot_product_attention(q, k, v, o);
    const double e_auto = max_abs_diff(automatic.output, ref.output);
    for (const FlashTiles tiles : {FlashTiles{1, 1}, FlashTiles{3, 5}, FlashTiles{16, 8}, FlashTiles{64, 128}}) {
      o.tuning.flash_tiles = tiles;
      const AttentionResult r = scaled_dot_product_attention(q, k, v, o);
      EXPECT_LE(max_abs_diff(r.output, ref.output), 2 * e_auto + 1e-6) << tiles.br << "x" << tiles.bc;
      EXPECT_LE(max_abs_diff(*r.logsumexp, *ref.logsumexp), 1e-5) << tiles.br << "x" << tiles.bc;
    }
  }
}

TEST(FlashTiles, HalfSetOrNegativeTilesAreAValueErrorNamingTheOp) {
  const Tensor q = Tensor::randn({1, 4, 8}, 1);
  for (const FlashTiles tiles : {FlashTiles{5, 0}, FlashTiles{0, 7}, FlashTiles{-1, -1}}) {
    AttentionOptions o;
    o.tuning.flash_tiles = tiles;
    EXPECT_THROW_WITH(scaled_dot_product_attention(q, q, q, o), ValueError,
                      "scaled_dot_product_attention: tuning.flash_tiles must be both positive or both 0");
  }
}

// A kernel takes a checked Problem; only make_problem and with_operands make one.
static_assert(!std::is_default_constructible_v<attention::Problem>);

TEST(AttentionProblem, WithOperandsKeepsTheGeometryAndRefusesOtherShapes) {
  const Tensor q = Tensor::randn({2, 1, 5, 4}, 1), k = Tensor::randn({3, 6, 4}, 2), v = Tensor::randn({3, 6, 2}, 3);
  const attention::Problem p = attention::make_problem(q, k, v, {}, "op");
  EXPECT_EQ(p.batch, (Shape{2, 3}));
  const attention::Problem f = attention::with_operands(p, q.to(DType::f64), k, v, std::nullopt);
  EXPECT_EQ(f.q.shape(), (Shape{2, 3, 5, 4}));
  EXPECT_EQ(f.q.dtype(), DType::f64);
  EXPECT_EQ(f.out_dtype, DType::f32);  // the user's dtype, for the result
  EXPECT_EQ(f.q.stride(1), 0);         // broadcast, not copied
  EXPECT_THROW(attention::with_operands(p, k, k, v, std::nullopt), std::logic_error);
}

// The batch error text, now built only when the check fails, reads as before.
TEST(AttentionProblem, BatchThatDoesNotBroadcastNamesTheCallAndTheShapes) {
  const Tensor q = Tensor::randn({2, 3, 4, 8}, 1), k = Tensor::randn({5, 3, 6, 8}, 2);
  EXPECT_THROW_WITH(scaled_dot_product_attention(q, k, k), ShapeError,
                    "scaled_dot_product_attention (q [2, 3, 4, 8], k [5, 3, 6, 8], v [5, 3, 6, 8]): shapes [2, 3] "
                    "and [5, 3] cannot be broadcast together (dim 0: 2 vs 5)");
}

}  // namespace
}  // namespace qkv
