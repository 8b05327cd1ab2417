// lsh_attention against Hugging Face transformers' Reformer LSHSelfAttention (tests/fixtures/lsh,
// from tests/attention/make_lsh_fixtures.py: the layer's own rotations, buckets and output,
// 1-4 hash rounds, bucket factors, causal, padding masks, chunks after, the unhashed L <=
// chunk_length case), the kernel against lsh_attention_reference (float64 loops, written
// apart) on random configurations, properties of the definition, and the errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/expect.h"
#include "common/relative_error.h"
#include "common/sdpa_fixtures.h"
#include "common/thread_guard.h"
#include "qkv/einsum.h"
#include "qkv/io_tensor_files.h"
#include "qkv/lsh_attention.h"

namespace qkv {
namespace {

using qkv::testing::max_relative_error;

// [B, H, L, D] -> Reformer's merged heads [B, L, H * D].
Tensor merge_heads(const Tensor& x) {
  return x.permute({0, 2, 1, 3}).contiguous().reshape({x.size(0), x.size(2), x.size(1) * x.size(3)});
}

LshAttentionOptions options_of(const nlohmann::json& j, const io::SafetensorsFile& f) {
  LshAttentionOptions o;
  o.n_hashes = j.at("n_hashes").get<int64_t>();
  o.n_buckets = j.at("n_buckets").get<std::vector<int64_t>>();
  o.chunk_length = j.at("chunk_length").get<int64_t>();
  o.num_chunks_before = j.at("num_chunks_before").get<int64_t>();
  o.num_chunks_after = j.at("num_chunks_after").get<int64_t>();
  o.is_causal = j.at("is_decoder").get<bool>();
  o.rotations = f.tensors.at("rotations");
  if (f.tensors.count("attention_mask")) o.attention_mask = f.tensors.at("attention_mask").unsqueeze(1);  // [B, 1, L]
  return o;
}

TEST(LshAttention, MatchesReformerLSHSelfAttention) {
  const auto files = sdpa_fixtures::fixture_files(sdpa_fixtures::fixture_dir("lsh"));
  ASSERT_EQ(files.size(), 9u);
  for (const auto& path : files) {
    SCOPED_TRACE(path.stem().string());
    const io::SafetensorsFile f = io::load_safetensors(path);
    const nlohmann::json j = nlohmann::json::parse(f.metadata.at("options"));
    const LshAttentionOptions o = options_of(j, f);
    const Tensor &qk = f.tensors.at("qk"), &v = f.tensors.at("v"), &want = f.tensors.at("out");
    const bool f64 = qk.dtype() == DType::f64;
    // float32: Reformer's and qkv's sums round differently (scores up to ~30 feed exp).
    const double tol = f64 ? 1e-11 : 2e-5;
    // Reformer's float32 is inexact where qkv is not: a token left with only itself in every
    // round has logsumexp -1e5 in each, and Reformer's float32 logsumexp over the rounds, -1e5 +
    // log(2) rounded to a spacing of 2^-7, weighs each round exp(-0.6953) = 0.4989, not 1/2 (the
    // token's output is 0.998 of its value). qkv weighs by exp(lse_r - max) / sum instead.
    const double hf_tol = f64 || !o.is_causal ? tol : 3e-3;
    EXPECT_LE(max_relative_error(merge_heads(lsh_attention(qk, v, o)), want), hf_tol);
    EXPECT_LE(max_relative_error(merge_heads(lsh_attention_reference(qk, v, o)), want), hf_tol);
    // The layer end to end: its projections by einsum, then the attention.
    const Tensor& hidden = f.tensors.at("hidden");
    const int64_t b = hidden.size(0), l = hidden.size(1), h = qk.size(1), d = qk.size(3);
    auto project = [&](const Tensor& w) {
      return einsum("bli,oi->blo", {hidden, w}).reshape({b, l, h, d}).permute({0, 2, 1, 3}).contiguous();
    };
    EXPECT_LE(max_relative_error(
                  merge_heads(lsh_attention(project(f.tensors.at("w_qk")), project(f.tensors.at("w_v")), o)), want),
              hf_tol);
    // The buckets, with Reformer's offsets: round r adds r * (n + 1 if any token is padding).
    const auto hf = f.tensors.find("buckets");
    ASSERT_EQ(hf != f.tensors.end(), l > o.chunk_length);
    if (hf == f.tensors.end()) continue;
    int64_t n = 1;
    for (const int64_t x : o.n_buckets) n *= x;
    const bool padded = o.attention_mask.numel() > 0 &&
                        o.attention_mask.to_vector<double>() != std::vector<double>(static_cast<size_t>(b * l), 1.0);
    std::vector<int64_t> got = lsh_buckets(qk, o).to_vector<int64_t>();  // [B, H, n_hashes, L]
    for (size_t i = 0; i < got.size(); ++i) got[i] += static_cast<int64_t>(i / l % o.n_hashes) * (n + (padded ? 1 : 0));
    EXPECT_EQ(got, hf->second.to_vector<int64_t>());
  }
}

struct RandomCase {
  Tensor qk, v;
  LshAttentionOptions o;
};

RandomCase random_case(std::mt19937_64& rng, int i, DType dtype) {
  RandomCase c;
  const int64_t b = 1 + static_cast<int64_t>(rng() % 2), h = 1 + static_cast<int64_t>(rng() % 3);
  const int64_t d = 1 + static_cast<int64_t>(rng() % 20), dv = 1 + static_cast<int64_t>(rng() % 12);
  c.o.chunk_length = std::vector<int64_t>{1, 3, 4, 8, 16}[static_cast<size_t>(i % 5)];
  const int64_t l = i % 7 == 6 ? 1 + static_cast<int64_t>(rng() % c.o.chunk_length)  // the unhashed case
                               : c.o.chunk_length * (1 + static_cast<int64_t>(rng() % 6));
  c.o.n_hashes = 1 + static_cast<int64_t>(rng() % 4);
  c.o.n_buckets =
      i % 3 == 2 ? std::vector<int64_t>{2, 4} : std::vector<int64_t>{2 * (1 + static_cast<int64_t>(rng() % 4))};
  if (i % 4 == 3) c.o.n_buckets.clear();  // Reformer's default for L
  c.o.num_chunks_before = static_cast<int64_t>(rng() % 3), c.o.num_chunks_after = static_cast<int64_t>(rng() % 2);
  c.o.is_causal = i % 2 == 1;
  c.o.seed = rng();
  if (i % 5 == 4) {  // padding at the end of batch entry 0: [B, 1, L]
    std::vector<double> m(static_cast<size_t>(b * l), 1.0);
    for (int64_t t = l / 2; t < l; ++t) m[static_cast<size_t>(t)] = 0.0;
    c.o.attention_mask = Tensor::from_vector(m, {b, 1, l});
  }
  c.qk = (Tensor::randn({b, h, l, d}, rng()).to(dtype));
  c.v = Tensor::randn({b, h, l, dv}, rng()).to(dtype);
  return c;
}

TEST(LshAttention, KernelMatchesTheReference) {
  std::mt19937_64 rng(4);
  double worst64 = 0, worst32 = 0;
  for (int i = 0; i < 60; ++i) {
    SCOPED_TRACE(i);
    const RandomCase c = random_case(rng, i, i % 2 == 0 ? DType::f64 : DType::f32);
    const Tensor got = lsh_attention(c.qk, c.v, c.o), want = lsh_attention_reference(c.qk, c.v, c.o);
    EXPECT_EQ(got.dtype(), c.qk.dtype());
    const double e = max_relative_error(got, want);
    (c.qk.dtype() == DType::f64 ? worst64 : worst32) = std::max(e, c.qk.dtype() == DType::f64 ? worst64 : worst32);
  }
  std::printf("lsh kernel vs reference: worst f64 %.2e, f32 %.2e\n", worst64, worst32);
  EXPECT_LE(worst64, 1e-12);
  EXPECT_LE(worst32, 2e-5);
}

TEST(LshAttention, LongerSequencesMatchTheReference) {
  std::mt19937_64 rng(5);
  for (const int64_t l : {256, 512}) {
    LshAttentionOptions o;
    o.chunk_length = 32, o.n_hashes = 2, o.is_causal = l == 512;
    const Tensor qk = Tensor::randn({1, 2, l, 32}, rng()).to(DType::f64), v = Tensor::randn({1, 2, l, 16}, rng());
    EXPECT_LE(max_relative_error(lsh_attention(qk, v.to(DType::f64), o), lsh_attention_reference(qk, v, o)), 1e-11);
  }
}

TEST(LshAttention, SameResultAtEveryThreadCount) {
  // Entries run threads-many at a time: 1, 3 and 4 threads group 10 entries differently.
  test::ThreadCountGuard guard;
  LshAttentionOptions o;
  o.chunk_length = 8, o.n_hashes = 3, o.is_causal = true;
  const Tensor qk = Tensor::randn({2, 5, 64, 8}, 11), v = Tensor::randn({2, 5, 64, 4}, 12);
  set_num_threads(1);
  const std::vector<float> one = lsh_attention(qk, v, o).to_vector<float>();
  for (const int threads : {3, 4}) {
    set_num_threads(threads);
    EXPECT_EQ(lsh_attention(qk, v, o).to_vector<float>(), one) << threads;
  }
}

TEST(LshAttention, DefinitionOnSmallCases) {
  // One token: its only key is itself (score -1e5), so the output is its value.
  const Tensor v1 = Tensor::from_vector(std::vector<double>{2.0, -3.0}, {1, 2});
  EXPECT_EQ(lsh_attention(Tensor::ones({1, 4}, DType::f64), v1).to_vector<double>(), v1.to_vector<double>());
  // Two tokens unhashed (L <= chunk): each sees only the other (self at -1e5), so they swap
  // values; causal, token 0 has only itself left and token 1 sees token 0.
  const Tensor qk = Tensor::randn({2, 4}, 1, DType::f64);
  const Tensor v = Tensor::from_vector(std::vector<double>{1.0, 10.0}, {2, 1});
  const auto swapped = lsh_attention(qk, v).to_vector<double>();
  EXPECT_NEAR(swapped[0], 10.0, 1e-12);
  EXPECT_NEAR(swapped[1], 1.0, 1e-12);
  LshAttentionOptions causal;
  causal.is_causal = true;
  const auto c = lsh_attention(qk, v, causal).to_vector<double>();
  EXPECT_NEAR(c[0], 1.0, 1e-12);
  EXPECT_NEAR(c[1], 1.0, 1e-12);
  // A padding key takes no weight from the others (exp(-1e9) underflows).
  LshAttentionOptions padded;
  padded.attention_mask = Tensor::from_vector(std::vector<double>{1, 1, 0}, {3});
  const Tensor v3 = Tensor::from_vector(std::vector<double>{1.0, 10.0, 100.0}, {3, 1});
  const auto p = lsh_attention(Tensor::randn({3, 4}, 2, DType::f64), v3, padded).to_vector<double>();
  EXPECT_NEAR(p[0], 10.0, 1e-12);
  EXPECT_NEAR(p[1], 1.0, 1e-12);
}

TEST(LshAttention, SeedDrawsTheRotations) {
  LshAttentionOptions o;
  o.chunk_length = 8, o.n_hashes = 2, o.n_buckets = {8}, o.seed = 7;
  const Tensor qk = Tensor::randn({2, 3, 32, 16}, 3), v = Tensor::randn({2, 3, 32, 16}, 4);
  LshAttentionOptions given = o;
  given.rotations = lsh_random_rotations(3, 16, 2, 4, 7);
  EXPECT_EQ(lsh_buckets(qk, o).to_vector<int64_t>(), lsh_buckets(qk, given).to_vector<int64_t>());
  EXPECT_EQ(lsh_attention(qk, v, o).to_vector<float>(), lsh_attention(qk, v, given).to_vector<float>());
  LshAttentionOptions other = o;
  other.seed = 8;
  EXPECT_NE(lsh_buckets(qk, o).to_vector<int64_t>(), lsh_buckets(qk, other).to_vector<int64_t>());
  const auto buckets = lsh_buckets(qk, o).to_vector<int64_t>();
  EXPECT_EQ(*std::max_element(buckets.begin(), buckets.end()), 7);
  EXPECT_EQ(*std::min_element(buckets.begin(), buckets.end()), 0);
}

TEST(LshAttention, OneRotationForEveryHeadAndHalfInputs) {
  // rotations [1, D, n_hashes, half] serve every head as the same rotations repeated per head.
  LshAttentionOptions shared, repeated;
  shared.chunk_length = repeated.chunk_length = 8;
  shared.n_hashes = repeated.n_hashes = 2;
  shared.n_buckets = repeated.n_buckets = {4};
  shared.rotations = Tensor::randn({1, 8, 2, 2}, 21, DType::f64);
  repeated.rotations = shared.rotations.expand({3, 8, 2, 2}).contiguous();
  const Tensor qk = Tensor::randn({2, 3, 32, 8}, 22), v = Tensor::randn({2, 3, 32, 8}, 23);
  EXPECT_EQ(lsh_attention(qk, v, shared).to_vector<float>(), lsh_attention(qk, v, repeated).to_vector<float>());
  // bf16 inputs compute in float32 and come back in bf16.
  const Tensor half = lsh_attention(qk.to(DType::bf16), v.to(DType::bf16), shared);
  EXPECT_EQ(half.dtype(), DType::bf16);
  EXPECT_LE(max_relative_error(half, lsh_attention_reference(qk.to(DType::bf16), v.to(DType::bf16), shared)), 1e-2);
}

TEST(LshAttention, DefaultBucketsAreReformers) {
  // Reformer's _set_num_buckets with max_position_embeddings = L: L = 4096, chunk 4 gives
  // 2^11 buckets, past 2 max(sqrt(1024), 4) = 64, so factors [2^5, 2^6]; L = 64, chunk 8 gives 16.
  const Tensor qk = Tensor::randn({1, 4096, 4}, 5);
  LshAttentionOptions o, factored;
  o.chunk_length = factored.chunk_length = 4;
  factored.n_buckets = {32, 64};
  EXPECT_EQ(lsh_buckets(qk, o).to_vector<int64_t>(), lsh_buckets(qk, factored).to_vector<int64_t>());
  LshAttentionOptions small, sixteen;
  small.chunk_length = sixteen.chunk_length = 8;
  sixteen.n_buckets = {16};
  const Tensor qk64 = qk.slice(1, 0, 64);
  EXPECT_EQ(lsh_buckets(qk64, small).to_vector<int64_t>(), lsh_buckets(qk64, sixteen).to_vector<int64_t>());
}

// A chunk_length past 2^62 (meaning "never chunk") overflowed Reformer's bucket limit
// 2 max(sqrt(L / chunk), chunk) and drew the factors [1, 2]: a ValueError about odd buckets
// for an unhashed call. It is the L <= chunk case, every query against every key.
TEST(LshAttention, HugeChunkLengthsAndWindows) {
  const Tensor qk = Tensor::randn({2, 16, 4}, 31, DType::f64), v = Tensor::randn({2, 16, 3}, 32, DType::f64);
  LshAttentionOptions huge, whole;
  huge.chunk_length = int64_t{1} << 62;
  whole.chunk_length = 16;
  EXPECT_LE(max_relative_error(lsh_attention(qk, v, huge), lsh_attention_reference(qk, v, whole)), 1e-12);
  huge.chunk_length = std::numeric_limits<int64_t>::max();
  EXPECT_LE(max_relative_error(lsh_attention(qk, v, huge), lsh_attention_reference(qk, v, whole)), 1e-12);
  EXPECT_EQ(lsh_buckets(qk, huge).shape(), (Shape{2, 1, 16}));
  // D = 0 names the op and the shapes (was lsh_random_rotations' message); no heads is empty.
  EXPECT_THROW_WITH(lsh_attention(Tensor::randn({2, 16, 0}, 1), Tensor::randn({2, 16, 3}, 2)), ShapeError,
                    "lsh_attention: qk's last dim D must be >= 1");
  EXPECT_EQ(lsh_attention(Tensor::randn({2, 0, 16, 4}, 1), Tensor::randn({2, 0, 16, 3}, 2)).shape(),
            (Shape{2, 0, 16, 3}));
  // A window of chunks whose key count overflows (segfault / heap corruption before) is refused.
  LshAttentionOptions wide;
  wide.chunk_length = 4;
  wide.num_chunks_before = int64_t{1} << 62;
  EXPECT_THROW_WITH(lsh_attention(qk, v, wide), ValueError, "num_chunks_before = 4611686018427387904");
  wide.num_chunks_before = 1, wide.num_chunks_after = std::numeric_limits<int64_t>::max();
  EXPECT_THROW_WITH(lsh_attention_reference(qk, v, wide), ValueError, "lsh_attention");
}

TEST(LshAttention, ErrorsNameTheOpAndShapes) {
  const Tensor qk = Tensor::randn({1, 2, 32, 8}, 1), v = Tensor::randn({1, 2, 32, 8}, 2);
  LshAttentionOptions o;
  o.chunk_length = 8;
  LshAttentionOptions odd = o;
  odd.n_buckets = {3};
  EXPECT_THROW_WITH(lsh_attention(qk, v, odd), ValueError,
                    "lsh_attention: every bucket count (or factor) must be even");
  odd.n_buckets = {4, 0};
  EXPECT_THROW_WITH(lsh_attention(qk, v, odd), ValueError, "[4, 0]");
  LshAttentionOptions chunk = o;
  chunk.chunk_length = 12;
  EXPECT_THROW_WITH(lsh_attention(qk, v, chunk), ValueError, "L = 32 must be a multiple of chunk_length = 12");
  LshAttentionOptions bad = o;
  bad.n_hashes = 0;
  EXPECT_THROW_WITH(lsh_attention(qk, v, bad), ValueError, "n_hashes must be >= 1");
  bad = o, bad.chunk_length = 0;
  EXPECT_THROW_WITH(lsh_attention(qk, v, bad), ValueError, "chunk_length must be >= 1");
  bad = o, bad.num_chunks_before = -1;
  EXPECT_THROW_WITH(lsh_attention(qk, v, bad), ValueError, "num_chunks_before");
  bad = o, bad.rotations = Tensor::randn({2, 8, 1, 3}, 1);
  EXPECT_THROW_WITH(lsh_attention(qk, v, bad), ShapeError, "rotations must be floating [2 or 1, D = 8, n_hashes = 1");
  bad = o, bad.attention_mask = Tensor::ones({1, 31});
  EXPECT_THROW_WITH(lsh_attention(qk, v, bad), ShapeError, "attention_mask [1, 31] does not broadcast");
  // In qk's and v's terms (the message spoke of a k and a "q's D" the call never had).
  EXPECT_THROW_WITH(lsh_attention(qk, Tensor::randn({1, 2, 16, 8}, 2), o), ShapeError,
                    "lsh_attention: qk [..., L, D] and v [..., L, Dv] must have the same leading dims and L (qk [1, 2, "
                    "32, 8], v [1, 2, 16, 8])");
  EXPECT_THROW_WITH(lsh_attention(qk, Tensor::randn({3, 2, 32, 8}, 2), o), ShapeError, "same leading dims and L");
  EXPECT_THROW_WITH(lsh_attention(qk, Tensor::randn({2, 32, 8}, 2), o), ShapeError, "same rank");
  EXPECT_THROW_WITH(lsh_attention(Tensor::ones({4, 4}, DType::i32), Tensor::ones({4, 4}), o), DTypeError,
                    "lsh_attention");
  EXPECT_THROW_WITH(lsh_random_rotations(1, 0, 1, 1, 0), ValueError, "lsh_random_rotations");
}

}  // namespace
}  // namespace qkv
