// Tensor-parallel attention on every rank of the job: torch.nn.MultiheadAttention's own
// outputs (tests/fixtures/mha_torch, PyTorch float64 on the stored float32 parameters) from
// the full state_dict split by heads, and GQA layers equal to the unsplit computation.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <tuple>
#include <utility>

#include "common/expect.h"
#include "dist/dist_test_util.h"
#include "qkv/attention.h"
#include "qkv/dist/tensor_parallel_mha.h"
#include "qkv/error.h"
#include "qkv/io.h"

namespace qkv::dist {
namespace {

using testing::relative_error;
using testing::world;
namespace fx = qkv::nn::testing;

constexpr double kTolerance = 1e-5;

TEST(TensorParallelAttention, MatchesPyTorchMultiheadAttentionFixtures) {
  const Communicator comm = world();
  int checked = 0;
  for (const auto& path : fx::fixture_files("mha_torch")) {
    const fx::Fixture f = fx::load_fixture(path);
    const nlohmann::json& o = f.options;
    // The unmasked configurations (masks in torch's convention are the layer's business).
    if (o.at("add_bias_kv") || o.at("add_zero_attn") || o.at("is_causal") || f.has("input.attn_mask") ||
        f.has("input.key_padding_mask")) {
      continue;
    }
    SCOPED_TRACE(f.name);
    nn::MultiheadAttentionConfig c;
    c.embed_dim = o.at("embed_dim");
    c.num_heads = o.at("num_heads");
    c.bias = o.at("bias");
    if (!o.at("kdim").is_null()) c.kdim = o.at("kdim").get<int64_t>();
    if (!o.at("vdim").is_null()) c.vdim = o.at("vdim").get<int64_t>();
    c.batch_first = o.at("batch_first");
    std::map<std::string, Tensor> sd;
    for (const auto& [k, v] : f.tensors) {
      if (k.rfind("input.", 0) != 0 && k.rfind("expected.", 0) != 0) sd[k] = v;
    }
    const TensorParallelAttention layer = TensorParallelAttention::from_torch_mha(c, sd, comm);
    const Tensor q = f.at("input.query");
    const Tensor k = o.at("self_attention") ? q : f.at("input.key");
    const Tensor v = o.at("self_attention") ? q : (o.at("kv_shared") ? k : f.at("input.value"));
    EXPECT_LE(relative_error(layer.forward(q, k, v), f.at("expected.output")), kTolerance);
    ++checked;
  }
  EXPECT_GE(checked, 8);
}

// A GQA layer (Llama-style projections) computed in one process: the oracle of the split one.
Tensor unsplit(const std::map<std::string, Tensor>& sd, const Tensor& x, int64_t hq, int64_t hk, int64_t d,
               bool causal) {
  const int64_t l = x.size(0), n = x.size(1);
  auto heads = [&](const std::string& name, int64_t h) {
    return nn::Linear::torch(sd.at(name + ".weight"), sd.at(name + ".bias"))
        .forward(x)
        .reshape({l, n, h, d})
        .permute({1, 2, 0, 3});
  };
  AttentionOptions o;
  o.is_causal = causal;
  o.enable_gqa = true;
  const Tensor a =
      scaled_dot_product_attention(heads("q_proj", hq), heads("k_proj", hk), heads("v_proj", hk), o).output;
  const Tensor merged = a.permute({2, 0, 1, 3}).contiguous().reshape({l, n, hq * d});
  return nn::Linear::torch(sd.at("o_proj.weight"), sd.at("o_proj.bias")).forward(merged);
}

TEST(TensorParallelAttention, GqaWithKeyValueHeadsSplitOrReplicated) {
  const Communicator comm = world();
  const int64_t e = 24, d = 4;
  // (Hq, Hk): Hk >= ranks splits the key/value heads, Hk < ranks (MQA among them) replicates them.
  for (const auto& [hq, hk] : {std::pair<int64_t, int64_t>{6, 2}, {6, 3}, {8, 4}, {6, 1}, {5, 5}}) {
    SCOPED_TRACE("Hq " + std::to_string(hq) + " Hk " + std::to_string(hk));
    std::map<std::string, Tensor> sd{
        {"q_proj.weight", Tensor::randn({hq * d, e}, 1)}, {"q_proj.bias", Tensor::randn({hq * d}, 2)},
        {"k_proj.weight", Tensor::randn({hk * d, e}, 3)}, {"k_proj.bias", Tensor::randn({hk * d}, 4)},
        {"v_proj.weight", Tensor::randn({hk * d, e}, 5)}, {"v_proj.bias", Tensor::randn({hk * d}, 6)},
        {"o_proj.weight", Tensor::randn({e, hq * d}, 7)}, {"o_proj.bias", Tensor::randn({e}, 8)}};
    const Tensor x = Tensor::randn({9, 2, e}, 10);  // [L, N, E]
    const TensorParallelAttention layer = TensorParallelAttention::from_projections({e, hq, hk, d, false}, sd, comm);
    TensorParallelOptions o;
    o.is_causal = true;
    EXPECT_LE(relative_error(layer.forward(x, x, x, o), unsplit(sd, x, hq, hk, d, true)), kTolerance);
  }
}

TEST(TensorParallelAttention, BackwardEqualsTheUnsplitLayersBackward) {
  const Communicator comm = world();
  nn::MultiheadAttentionConfig c;
  c.embed_dim = 20;
  c.num_heads = 5;  // uneven over 2, 3 and 4 ranks
  const nn::MultiheadAttention whole(c, 3);
  const std::map<std::string, Tensor> sd = whole.state_dict();
  const TensorParallelAttention layer = TensorParallelAttention::from_torch_mha(c, sd, comm);
  const Tensor q = Tensor::randn({6, 2, 20}, 1), k = Tensor::randn({9, 2, 20}, 2), v = Tensor::randn({9, 2, 20}, 3);
  const Tensor dy = Tensor::randn({6, 2, 20}, 4);
  nn::MultiheadAttentionOptions mo;
  mo.need_weights = false;
  const nn::MultiheadAttentionGradients want = whole.backward(q, k, v, dy, mo);
  const TensorParallelGradients got = layer.backward(q, k, v, dy);
  EXPECT_LE(relative_error(got.query, want.query), kTolerance);
  EXPECT_LE(relative_error(got.key, want.key), kTolerance);
  EXPECT_LE(relative_error(got.value, want.value), kTolerance);
  // This rank's shards are rows (q, k, v) and columns (o) of the whole layer's gradients.
  const int64_t d = 4, r0 = layer.first_head() * d, r1 = r0 + layer.local_heads() * d;
  const Tensor& w = want.params.at("in_proj_weight");
  const Tensor& b = want.params.at("in_proj_bias");
  const char* names[] = {"q_proj", "k_proj", "v_proj"};
  for (int64_t i = 0; i < 3; ++i) {
    SCOPED_TRACE(names[i]);
    EXPECT_LE(relative_error(got.params.at(std::string(names[i]) + ".weight"), w.slice(0, i * 20 + r0, i * 20 + r1)),
              kTolerance);
    EXPECT_LE(relative_error(got.params.at(std::string(names[i]) + ".bias"), b.slice(0, i * 20 + r0, i * 20 + r1)),
              kTolerance);
  }
  EXPECT_LE(relative_error(got.params.at("o_proj.weight"), want.params.at("out_proj.weight").slice(1, r0, r1)),
            kTolerance);
  EXPECT_LE(relative_error(got.params.at("o_proj.bias"), want.params.at("out_proj.bias")), kTolerance);
}

// GQA heads split or replicated (the replicated copies' gradients fold back into their key
// head) against the same layer on a one-rank communicator: the whole computation in one
// process, whose pieces (Linear::backward, the fused GQA backward) have their own oracles.
TEST(TensorParallelAttention, GqaBackwardEqualsTheOneRankLayer) {
  const Communicator comm = world();
  const Communicator self = comm.split(comm.rank(), 0);
  const int64_t e = 12, d = 3;
  for (const auto& [hq, hk] : {std::pair<int64_t, int64_t>{6, 2}, {6, 3}, {6, 1}}) {
    SCOPED_TRACE("Hq " + std::to_string(hq) + " Hk " + std::to_string(hk));
    const std::map<std::string, Tensor> sd{
        {"q_proj.weight", Tensor::randn({hq * d, e}, 1)}, {"q_proj.bias", Tensor::randn({hq * d}, 2)},
        {"k_proj.weight", Tensor::randn({hk * d, e}, 3)}, {"k_proj.bias", Tensor::randn({hk * d}, 4)},
        {"v_proj.weight", Tensor::randn({hk * d, e}, 5)}, {"v_proj.bias", Tensor::randn({hk * d}, 6)},
        {"o_proj.weight", Tensor::randn({e, hq * d}, 7)}, {"o_proj.bias", Tensor::randn({e}, 8)}};
    const Tensor x = Tensor::randn({2, 7, e}, 9), dy = Tensor::randn({2, 7, e}, 10);  // batch_first
    const TensorParallelAttentionConfig c{e, hq, hk, d, true};
    TensorParallelOptions o;
    o.is_causal = true;
    const TensorParallelAttention split = TensorParallelAttention::from_projections(c, sd, comm);
    const TensorParallelGradients got = split.backward(x, x, x, dy, o);
    const TensorParallelGradients want =
        TensorParallelAttention::from_projections(c, sd, self).backward(x, x, x, dy, o);
    EXPECT_LE(relative_error(got.query, want.query), kTolerance);
    EXPECT_LE(relative_error(got.key, want.key), kTolerance);
    EXPECT_LE(relative_error(got.value, want.value), kTolerance);
    const int64_t q0 = split.first_head() * d, q1 = q0 + split.local_heads() * d;
    EXPECT_LE(relative_error(got.params.at("q_proj.weight"), want.params.at("q_proj.weight").slice(0, q0, q1)),
              kTolerance);
    EXPECT_LE(relative_error(got.params.at("o_proj.weight"), want.params.at("o_proj.weight").slice(1, q0, q1)),
              kTolerance);
    // k/v: the sum over ranks of each rank's share (replicated heads count once per rank holding them).
    for (const char* name : {"k_proj.weight", "v_proj.weight"}) {
      const int64_t k0 = (split.first_head() / (hq / hk)) * d;
      const Tensor mine = got.params.at(name);
      Tensor whole = Tensor::zeros(want.params.at(name).shape());
      whole.slice(0, k0, k0 + mine.size(0)).copy_from(mine);
      comm.all_reduce_sum(whole);
      EXPECT_LE(relative_error(whole, want.params.at(name)), kTolerance) << name;
    }
  }
}

TEST(TensorParallelAttention, PreShardedSafetensorsLoadBackPerRank) {
  const Communicator comm = world();
  nn::MultiheadAttentionConfig c;
  c.embed_dim = 12;
  c.num_heads = 3;
  const nn::MultiheadAttention whole(c, 5);
  const TensorParallelAttention split = TensorParallelAttention::from_torch_mha(c, whole.state_dict(), comm);
  const std::string path = ::testing::TempDir() + "tp_shard_" + std::to_string(comm.size()) + "_" +
                           std::to_string(comm.rank()) + ".safetensors";
  io::save(path, split.shard_state_dict());
  const TensorParallelAttention back = TensorParallelAttention::from_shard({12, 3, 3, 4, false}, io::load(path), comm);
  const Tensor x = Tensor::randn({5, 2, 12}, 6);
  EXPECT_LE(relative_error(back.forward(x, x, x), split.forward(x, x, x)), 1e-6);  // contiguous vs strided rows
  nn::MultiheadAttentionOptions mo;
  mo.need_weights = false;
  EXPECT_LE(relative_error(back.forward(x, x, x), whole.forward(x, x, x, mo).output), kTolerance);
  if (comm.size() > 1) {  // another rank count's shard is refused (from_shard is collective: on every rank)
    const TensorParallelAttentionConfig other{12, 3, 3, 4, false};
    std::map<std::string, Tensor> bad = split.shard_state_dict();
    if (split.local_heads() > 0) bad["q_proj.weight"] = Tensor::zeros({12, 12});
    EXPECT_THROW((void)TensorParallelAttention::from_shard(other, bad, comm), ShapeError);
    // o_proj.bias is added once after the all-reduce: another one on one rank gave that rank
    // another output, silently; now the ranks are told they differ.
    std::map<std::string, Tensor> odd = split.shard_state_dict();
    if (comm.rank() == comm.size() - 1) odd["o_proj.bias"] = Tensor::randn({12}, 99);
    EXPECT_THROW_WITH(TensorParallelAttention::from_shard(other, odd, comm), ValueError,
                      "o_proj.bias [12] float32 (sampled values #");
  }
}

TEST(TensorParallelAttention, WrongWeightShapesAreAShapeError) {
  const Communicator comm = world();
  std::map<std::string, Tensor> sd{{"q_proj.weight", Tensor::zeros({8, 8})},
                                   {"k_proj.weight", Tensor::zeros({8, 8})},
                                   {"v_proj.weight", Tensor::zeros({8, 8})},
                                   {"o_proj.weight", Tensor::zeros({8, 4})}};
  EXPECT_THROW((void)TensorParallelAttention::from_projections({8, 2, 2, 4, false}, sd, comm), ShapeError);
  // A negative key/value head count (4 % -2 == 0 passed) was reported as weights of the wrong shape.
  EXPECT_THROW_WITH(TensorParallelAttention::from_projections({8, 4, -2, 2, false}, sd, comm), ValueError,
                    "TensorParallelAttention: embed_dim 8, num_heads 4, num_kv_heads -2, head_dim 2 (positive;");
}

// Ranks called differently used to sum mismatched partial outputs silently (is_causal on one
// rank: every rank got the same, wrong, output), and an input refused on one rank, or on every
// rank when one holds no heads (H < P), left the others waiting for QKV_DIST_TIMEOUT in the
// all-reduce: now every rank fails at once, and the next same call on every rank still works.
TEST(TensorParallelAttention, RanksCalledDifferentlyOrARefusalFailOnEveryRank) {
  const Communicator comm = world();
  const int64_t e = 6, h = 1, d = 6;  // one head: every rank past 0 holds none
  const std::map<std::string, Tensor> sd{{"q_proj.weight", Tensor::randn({h * d, e}, 1)},
                                         {"k_proj.weight", Tensor::randn({h * d, e}, 2)},
                                         {"v_proj.weight", Tensor::randn({h * d, e}, 3)},
                                         {"o_proj.weight", Tensor::randn({e, h * d}, 4)}};
  const TensorParallelAttentionConfig c{e, h, h, d, false};
  const TensorParallelAttention layer = TensorParallelAttention::from_projections(c, sd, comm);
  const Tensor x = Tensor::randn({5, 2, e}, 5), wide = Tensor::randn({5, 2, e + 1}, 6);
  EXPECT_THROW((void)layer.forward(wide, wide, wide), ShapeError);  // on every rank, headless ones too
  const bool first = comm.rank() == 0;
  if (comm.size() > 1) {
    TensorParallelOptions o;
    o.is_causal = first;
    EXPECT_THROW((void)layer.forward(x, x, x, o), ValueError);
    const Tensor mine = first ? x : wide;  // refused on every rank but 0
    EXPECT_THROW((void)layer.forward(mine, mine, mine), Error);
    EXPECT_THROW((void)layer.backward(x, x, x, first ? x : wide), Error);
  }
  const Communicator self = comm.split(comm.rank(), 0);
  const TensorParallelAttention one = TensorParallelAttention::from_projections(c, sd, self);
  EXPECT_LE(relative_error(layer.forward(x, x, x), one.forward(x, x, x)), kTolerance);
  // Masks: [L, S] or [N, Hq, L, S]; a 3-D one (torch's [N * H, L, S]) is refused on every rank.
  TensorParallelOptions masked;
  masked.attn_mask = Tensor::randn({2, 1, 5, 5}, 7);  // additive, per batch entry
  EXPECT_LE(relative_error(layer.forward(x, x, x, masked), one.forward(x, x, x, masked)), kTolerance);
  masked.attn_mask = Tensor::randn({2, 5, 5}, 7);
  EXPECT_THROW_WITH(layer.forward(x, x, x, masked), ShapeError, "attn_mask must be [L, S] or [N, Hq, L, S]");
}

// The factories are collective: a rank whose weights do not fit used to throw alone, while the
// others built their layer and then waited QKV_DIST_TIMEOUT in forward's first collective; a
// rank holding other weights (another seed or checkpoint) gave every rank a silently mixed layer.
TEST(TensorParallelAttention, AFactoryRefusedOnOneRankFailsOnEveryRank) {
  const Communicator comm = world();
  const int64_t e = 8, h = 2, d = 4;
  auto weights = [&](uint64_t seed) {
    return std::map<std::string, Tensor>{{"q_proj.weight", Tensor::randn({h * d, e}, seed)},
                                         {"k_proj.weight", Tensor::randn({h * d, e}, seed + 1)},
                                         {"v_proj.weight", Tensor::randn({h * d, e}, seed + 2)},
                                         {"o_proj.weight", Tensor::randn({e, h * d}, seed + 3)}};
  };
  const TensorParallelAttentionConfig c{e, h, h, d, false};
  const int last = comm.size() - 1;
  const bool odd_one = comm.rank() == last;
  std::map<std::string, Tensor> sd = weights(1);
  if (odd_one) sd["q_proj.weight"] = Tensor::randn({h * d, e + 1}, 1);
  const std::string reason = "TensorParallelAttention: weights q [8, 9]";
  EXPECT_THROW_WITH(TensorParallelAttention::from_projections(c, sd, comm), ShapeError,
                    odd_one ? reason
                            : "rank " + std::to_string(last) + " of " + std::to_string(comm.size()) +
                                  " refused the call, so rank " + std::to_string(comm.rank()) + " stops too; rank " +
                                  std::to_string(last) + " said: " + reason);
  if (comm.size() > 1) {
    EXPECT_THROW_WITH(TensorParallelAttention::from_projections(c, weights(odd_one ? 5 : 1), comm), ValueError,
                      "were called differently");
    EXPECT_THROW_WITH(TensorParallelAttention::from_projections(c, weights(odd_one ? 5 : 1), comm), ValueError,
                      "q_proj.weight [8, 8] float32 (sampled values #");
  }
  const TensorParallelAttention layer = TensorParallelAttention::from_projections(c, weights(1), comm);
  const Communicator self = comm.split(comm.rank(), 0);
  const Tensor x = Tensor::randn({3, 2, e}, 9);
  EXPECT_LE(relative_error(layer.forward(x, x, x),
                           TensorParallelAttention::from_projections(c, weights(1), self).forward(x, x, x)),
            kTolerance);
}

// What only the attention kernel refused (a mask of an integer dtype, key and value of
// different lengths or batch sizes) reached only the ranks with heads: with one head, the
// ranks past 0 waited QKV_DIST_TIMEOUT in the all-reduce. Now refused on every rank.
TEST(TensorParallelAttention, WhatTheKernelRefusesFailsOnRanksWithoutHeadsToo) {
  const Communicator comm = world();
  const int64_t e = 4, h = 1;
  const std::map<std::string, Tensor> sd{{"q_proj.weight", Tensor::randn({e, e}, 1)},
                                         {"k_proj.weight", Tensor::randn({e, e}, 2)},
                                         {"v_proj.weight", Tensor::randn({e, e}, 3)},
                                         {"o_proj.weight", Tensor::randn({e, e}, 4)}};
  const TensorParallelAttention layer = TensorParallelAttention::from_projections({e, h, h, e, false}, sd, comm);
  const Tensor x = Tensor::randn({5, 2, e}, 5);
  TensorParallelOptions o;
  o.attn_mask = Tensor::zeros({5, 5}, DType::i32);
  EXPECT_THROW_WITH(layer.forward(x, x, x, o), DTypeError, "attn_mask must be bool or floating point, got int32");
  EXPECT_THROW_WITH(layer.forward(x, x, x.slice(0, 0, 4), {}), ShapeError, "key and value of one length");
  EXPECT_THROW_WITH(layer.forward(x, x, x.slice(1, 0, 1), {}), ShapeError, "one batch size");
  EXPECT_THROW_WITH(layer.forward(x, x.slice(1, 0, 1), x.slice(1, 0, 1), {}), ShapeError, "one batch size");
  EXPECT_THROW_WITH(layer.backward(x, x, x, x.to(DType::i32)), DTypeError,
                    "grad_output is int32 [5, 2, 4]; it must be floating point");
  EXPECT_THROW_WITH(layer.backward(x, x, x, x.slice(0, 0, 4)), ShapeError,
                    "grad_output is [4, 2, 4], the output [5, 2, 4]");
  const TensorParallelAttention one =
      TensorParallelAttention::from_projections({e, h, h, e, false}, sd, comm.split(comm.rank(), 0));
  EXPECT_LE(relative_error(layer.forward(x, x, x), one.forward(x, x, x)), kTolerance);  // still in step
}

// Hostile inputs against the same layer on a one-rank communicator (the whole computation in one
// process): strided and float64 inputs, no positions, no batch, S != L with is_causal, masks in
// both layouts, over head splits that leave ranks without heads or replicate key/value heads.
TEST(TensorParallelAttention, EdgeInputsEqualTheOneRankLayer) {
  const Communicator comm = world();
  const Communicator self = comm.split(comm.rank(), 0);
  const int64_t e = 12;
  for (const auto& [hq, hk, d] : {std::tuple<int64_t, int64_t, int64_t>{6, 2, 2}, {3, 3, 4}, {4, 1, 3}, {1, 1, 12}}) {
    const std::map<std::string, Tensor> sd{
        {"q_proj.weight", Tensor::randn({hq * d, e}, 1)}, {"q_proj.bias", Tensor::randn({hq * d}, 2)},
        {"k_proj.weight", Tensor::randn({hk * d, e}, 3)}, {"v_proj.weight", Tensor::randn({hk * d, e}, 5)},
        {"o_proj.weight", Tensor::randn({e, hq * d}, 7)}, {"o_proj.bias", Tensor::randn({e}, 8)}};
    for (const bool bf : {false, true}) {
      SCOPED_TRACE(detail::concat("Hq ", hq, " Hk ", hk, bf ? " batch_first" : ""));
      const TensorParallelAttentionConfig c{e, hq, hk, d, bf};
      const auto split = TensorParallelAttention::from_projections(c, sd, comm);
      const auto one = TensorParallelAttention::from_projections(c, sd, self);
      const Tensor x = Tensor::randn({5, 3, e}, 9).transpose(0, 1);                               // strided [3, 5, e]
      const Tensor kv = Tensor::randn(bf ? Shape{4, 3, e} : Shape{5, 4, e}, 10).transpose(0, 1);  // S = 4
      TensorParallelOptions o;
      o.is_causal = !bf;
      for (const auto& [q, k] : {std::pair{x, kv}, std::pair{x.to(DType::f64), kv.to(DType::f64)},
                                 std::pair{Tensor::randn({0, 3, e}, 1), Tensor::randn({0, 3, e}, 1)},
                                 std::pair{Tensor::randn({3, 0, e}, 1), Tensor::randn({3, 0, e}, 1)}}) {
        const Tensor want = one.forward(q, k, k, o), dy = Tensor::randn(want.shape(), 11);
        const Tensor got = split.forward(q, k, k, o);
        EXPECT_EQ(got.shape(), want.shape());
        const TensorParallelGradients gs = split.backward(q, k, k, dy, o), gw = one.backward(q, k, k, dy, o);
        EXPECT_EQ(gs.query.shape(), q.shape());
        if (want.numel() > 0) {
          EXPECT_LE(relative_error(got, want), kTolerance) << shape_str(q.shape());
          EXPECT_LE(relative_error(gs.query, gw.query), kTolerance);
          EXPECT_LE(relative_error(gs.key, gw.key), kTolerance);
        }
      }
      const Tensor y = Tensor::randn({3, 2, e}, 12);  // [L 3, N 2] or, batch_first, [N 3, L 2]
      const int64_t l = bf ? 2 : 3, n = bf ? 3 : 2;
      for (const Tensor& m : {Tensor::randn({l, l}, 13), Tensor::randn({n, hq, l, l}, 14)}) {
        TensorParallelOptions masked;
        masked.attn_mask = m;
        EXPECT_LE(relative_error(split.forward(y, y, y, masked), one.forward(y, y, y, masked)), kTolerance);
      }
    }
  }
}

}  // namespace
}  // namespace qkv::dist
