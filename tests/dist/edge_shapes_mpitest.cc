// Ring and Ulysses attention, forward and backward, on the shapes and layouts a hostile caller
// passes: empty batches and sequences, no keys, D or Dv = 0, strided (permuted) inputs, odd
// lengths over 1-4 ranks with causal zigzag and contiguous splits, rows whose every key is
// masked out. The oracle is the single-process fused kernel (and its backward) on the whole
// sequence, itself checked against the float64 reference in tests/attention.
#include <gtest/gtest.h>

#include <optional>

#include "dist/dist_test_util.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/dist/ring_attention.h"
#include "qkv/dist/ulysses_attention.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

using testing::AttentionCase;
using testing::describe;
using testing::relative_error;
using testing::shard;
using testing::world;

constexpr double kTolerance = 1e-5;

// Relative error, or 0 for two empty tensors of one shape.
double error_of(const Tensor& got, const Tensor& want) {
  if (want.numel() == 0) return got.shape() == want.shape() ? 0.0 : 1.0;
  return relative_error(got, want);
}

void expect_equal_to_the_whole_sequence(const AttentionCase& e, const Communicator& comm, bool strided,
                                        const std::optional<Tensor>& mask = std::nullopt) {
  SCOPED_TRACE(describe(e) + (strided ? " strided" : ""));
  auto input = [&](int64_t h, int64_t l, int64_t d, uint64_t seed) {  // [B, H, L, D], permuted from [B, L, H, D]
    const Tensor t = Tensor::randn({e.batch, l, h, d}, seed).permute({0, 2, 1, 3});
    return strided ? t : t.contiguous();
  };
  const Tensor q = input(e.hq, e.lq, e.d, 1), k = input(e.hk, e.lk, e.d, 2), v = input(e.hk, e.lk, e.dv, 3);
  const Tensor dout = input(e.hq, e.lq, e.dv, 4);
  AttentionOptions whole;
  whole.is_causal = e.causal;
  whole.enable_gqa = e.hq != e.hk;
  whole.return_logsumexp = true;
  whole.attn_mask = mask;
  const AttentionResult f = scaled_dot_product_attention(q, k, v, whole);
  const AttentionGradients want = scaled_dot_product_attention_backward(q, k, v, f.output, dout, *f.logsumexp, whole);
  const Tensor sq = shard(q, e, comm), sk = shard(k, e, comm), sv = shard(v, e, comm);
  const Tensor sd = shard(dout, e, comm);
  auto expect_gradients = [&](const AttentionGradients& g) {
    EXPECT_LE(error_of(g.dq, shard(want.dq, e, comm)), kTolerance);
    EXPECT_LE(error_of(g.dk, shard(want.dk, e, comm)), kTolerance);
    EXPECT_LE(error_of(g.dv, shard(want.dv, e, comm)), kTolerance);
  };
  RingAttentionOptions ro;
  ro.is_causal = e.causal, ro.layout = e.layout, ro.enable_gqa = e.hq != e.hk, ro.return_logsumexp = true;
  if (mask) ro.attn_mask = shard(*mask, e, comm);  // this rank's rows
  const AttentionResult r = ring_attention(sq, sk, sv, comm, ro);
  EXPECT_LE(error_of(r.output, shard(f.output, e, comm)), kTolerance);
  expect_gradients(ring_attention_backward(sq, sk, sv, r.output, sd, *r.logsumexp, comm, ro));
  UlyssesAttentionOptions uo;
  uo.is_causal = e.causal, uo.layout = e.layout, uo.enable_gqa = e.hq != e.hk;
  uo.attn_mask = mask;  // the whole sequence's
  EXPECT_LE(error_of(ulysses_attention(sq, sk, sv, comm, uo), shard(f.output, e, comm)), kTolerance);
  expect_gradients(ulysses_attention_backward(sq, sk, sv, sd, comm, uo));
}

TEST(RingAndUlysses, EdgeShapesAndStridedInputsEqualTheWholeSequence) {
  const Communicator comm = world();
  const AttentionCase edges[] = {
      {2, 2, 2, 7, 7, 4, 4, true, SequenceLayout::zigzag},        // 7 over 2P chunks
      {1, 3, 3, 11, 11, 4, 4, true, SequenceLayout::contiguous},  // uneven causal contiguous
      {1, 2, 2, 7, 10, 4, 3, false, SequenceLayout::zigzag},      // cross-attention, zigzag
      {1, 6, 2, 9, 9, 4, 4, false, SequenceLayout::contiguous},   // GQA, Hk < P on 3-4 ranks
      {1, 3, 1, 5, 5, 4, 4, true, SequenceLayout::zigzag},        // MQA, fewer positions than chunks
      {0, 2, 2, 8, 8, 4, 4, false, SequenceLayout::contiguous},   // empty batch
      {1, 2, 2, 0, 0, 4, 4, false, SequenceLayout::contiguous},   // empty sequence
      {1, 2, 2, 6, 0, 4, 4, false, SequenceLayout::contiguous},   // no keys
      {1, 2, 2, 6, 6, 0, 4, false, SequenceLayout::contiguous},   // D = 0
      {1, 2, 2, 6, 6, 4, 0, false, SequenceLayout::contiguous},   // Dv = 0
  };
  for (const AttentionCase& e : edges) {
    expect_equal_to_the_whole_sequence(e, comm, false);
    expect_equal_to_the_whole_sequence(e, comm, true);
  }
}

TEST(RingAndUlysses, RowsWithEveryKeyMaskedOutEqualTheWholeSequence) {
  const Communicator comm = world();
  Tensor keep = Tensor::ones({8, 8}, DType::b8);
  for (int64_t j = 0; j < 8; ++j) keep.set_item({2, j}, 0.0);  // row 2: no key
  for (int64_t i = 0; i < 8; ++i) keep.set_item({i, 7}, 0.0);  // key 7: no query
  expect_equal_to_the_whole_sequence({1, 2, 2, 8, 8, 4, 4, false, SequenceLayout::zigzag}, comm, false, keep);
  const Tensor additive = Tensor::randn({8, 8}, 7).transpose(0, 1);  // strided
  expect_equal_to_the_whole_sequence({1, 2, 2, 8, 8, 4, 4, false, SequenceLayout::contiguous}, comm, true, additive);
}

}  // namespace
}  // namespace qkv::dist
