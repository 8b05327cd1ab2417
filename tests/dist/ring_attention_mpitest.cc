// Ring and Ulysses attention on every rank of the job equal the single-process fused
// kernel (scaled_dot_product_attention on the whole sequence) within 1e-5 relative, for
// sequence lengths that do not split evenly, both layouts, causal, GQA and masks.
#include <gtest/gtest.h>

#include "common/expect.h"
#include "dist/dist_test_util.h"
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

// The inputs (same seeds on every rank), the single-process result, and this rank's shards.
struct Problem {
  Tensor q, k, v, want, want_lse;
  Problem(const AttentionCase& c, const Communicator& comm) {
    q = Tensor::randn({c.batch, c.hq, c.lq, c.d}, 11);
    k = Tensor::randn({c.batch, c.hk, c.lk, c.d}, 12);
    v = Tensor::randn({c.batch, c.hk, c.lk, c.dv}, 13);
    AttentionOptions o;
    o.is_causal = c.causal;
    o.enable_gqa = c.hq != c.hk;
    o.return_logsumexp = true;
    AttentionResult r = scaled_dot_product_attention(q, k, v, o);
    want = shard(r.output, c, comm);
    want_lse = shard_sequence(*r.logsumexp, -1, comm.rank(), comm.size(), c.layout);
  }
};

const AttentionCase kCases[] = {
    {2, 4, 4, 37, 37, 16, 16, false, SequenceLayout::contiguous},
    {1, 4, 4, 64, 64, 32, 32, true, SequenceLayout::zigzag},
    {1, 2, 2, 29, 29, 8, 8, true, SequenceLayout::zigzag},  // chunks of 3 and 4 positions
    {1, 2, 2, 30, 30, 8, 8, true, SequenceLayout::contiguous},
    {2, 8, 2, 41, 41, 16, 24, true, SequenceLayout::zigzag},      // GQA, Dv != D
    {1, 3, 3, 19, 45, 16, 8, false, SequenceLayout::contiguous},  // cross-attention, Lq != Lk
    {1, 6, 3, 5, 5, 8, 8, false, SequenceLayout::zigzag},         // fewer positions than chunks
};

// Ring's or Ulysses' options for a case.
template <class Options>
Options options_of(const AttentionCase& c) {
  Options o;
  o.is_causal = c.causal;
  o.layout = c.layout;
  o.enable_gqa = c.hq != c.hk;
  return o;
}

TEST(RingAttention, EqualsTheFusedKernelOnTheWholeSequence) {
  const Communicator comm = world();
  for (const AttentionCase& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Problem p(c, comm);
    RingAttentionOptions o = options_of<RingAttentionOptions>(c);
    o.return_logsumexp = true;
    const AttentionResult got = ring_attention(shard(p.q, c, comm), shard(p.k, c, comm), shard(p.v, c, comm), comm, o);
    EXPECT_LE(relative_error(got.output, p.want), kTolerance);
    EXPECT_LE(relative_error(*got.logsumexp, p.want_lse), kTolerance);
  }
}

// The single-process gradients of sum(out * dout) for a case.
AttentionGradients whole_sequence_gradients(const Problem& p, const AttentionCase& c, const Tensor& dout) {
  AttentionOptions full;
  full.is_causal = c.causal;
  full.enable_gqa = c.hq != c.hk;
  full.return_logsumexp = true;
  const AttentionResult f = scaled_dot_product_attention(p.q, p.k, p.v, full);
  return scaled_dot_product_attention_backward(p.q, p.k, p.v, f.output, dout, *f.logsumexp, full);
}

void expect_shards_of(const AttentionGradients& got, const AttentionGradients& want, const AttentionCase& c,
                      const Communicator& comm) {
  EXPECT_LE(relative_error(got.dq, shard(want.dq, c, comm)), kTolerance);
  EXPECT_LE(relative_error(got.dk, shard(want.dk, c, comm)), kTolerance);
  EXPECT_LE(relative_error(got.dv, shard(want.dv, c, comm)), kTolerance);
}

TEST(RingAttention, BackwardEqualsTheFusedBackwardOnTheWholeSequence) {
  const Communicator comm = world();
  for (const AttentionCase& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Problem p(c, comm);
    const Tensor dout = Tensor::randn({c.batch, c.hq, c.lq, c.dv}, 14);
    RingAttentionOptions o = options_of<RingAttentionOptions>(c);
    o.return_logsumexp = true;
    const Tensor q = shard(p.q, c, comm), k = shard(p.k, c, comm), v = shard(p.v, c, comm);
    const AttentionResult r = ring_attention(q, k, v, comm, o);
    const AttentionGradients got =
        ring_attention_backward(q, k, v, r.output, shard(dout, c, comm), *r.logsumexp, comm, o);
    expect_shards_of(got, whole_sequence_gradients(p, c, dout), c, comm);
  }
}

TEST(UlyssesAttention, BackwardEqualsTheFusedBackwardOnTheWholeSequence) {
  const Communicator comm = world();
  for (const AttentionCase& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Problem p(c, comm);
    const Tensor dout = Tensor::randn({c.batch, c.hq, c.lq, c.dv}, 15);
    const AttentionGradients got =
        ulysses_attention_backward(shard(p.q, c, comm), shard(p.k, c, comm), shard(p.v, c, comm), shard(dout, c, comm),
                                   comm, options_of<UlyssesAttentionOptions>(c));
    expect_shards_of(got, whole_sequence_gradients(p, c, dout), c, comm);
  }
}

TEST(RingAttention, AppliesThisRanksRowsOfAMask) {
  const Communicator comm = world();
  const AttentionCase c{1, 2, 2, 33, 33, 8, 8, false, SequenceLayout::zigzag};
  const Problem p(c, comm);
  Tensor mask = Tensor::randn({1, 1, c.lq, c.lk}, 5);  // additive: random biases
  AttentionOptions full;
  full.attn_mask = mask;
  const Tensor want = shard(scaled_dot_product_attention(p.q, p.k, p.v, full).output, c, comm);
  RingAttentionOptions o;
  o.layout = c.layout;
  o.attn_mask = shard(mask, c, comm);
  const Tensor got = ring_attention(shard(p.q, c, comm), shard(p.k, c, comm), shard(p.v, c, comm), comm, o).output;
  EXPECT_LE(relative_error(got, want), kTolerance);
}

TEST(RingAttention, ShardsThatDoNotMatchTheLayoutAreAShapeError) {
  const Communicator comm = world();
  const Tensor q = Tensor::randn({1, 1, comm.rank() == 0 ? 5 : 3, 4}, 1);
  RingAttentionOptions o;
  o.layout = SequenceLayout::contiguous;
  if (comm.size() == 1) {
    EXPECT_NO_THROW((void)ring_attention(q, q, q, comm, o));
    return;
  }
  EXPECT_THROW((void)ring_attention(q, q, q, comm, o), ShapeError);  // 5 + 3 + ... is not an even split
}

// The mask is this rank's query rows against every key: the whole sequence's mask (the easy
// mistake) used to run with rows 0 .. Lq_r - 1 on every rank, silently wrong past rank 0, and
// extra key columns were ignored. On one rank the whole mask is the rank's rows and must still
// give the fused kernel's result.
TEST(RingAttention, AMaskThatIsNotThisRanksRowsIsAShapeError) {
  const Communicator comm = world();
  const AttentionCase c{1, 2, 2, 12, 12, 4, 4, false, SequenceLayout::contiguous};
  const Problem p(c, comm);
  const Tensor mask = Tensor::randn({c.lq, c.lk}, 11);  // additive
  const Tensor q = shard(p.q, c, comm), k = shard(p.k, c, comm), v = shard(p.v, c, comm);
  RingAttentionOptions o;
  o.attn_mask = mask;
  if (comm.size() == 1) {
    AttentionOptions full;
    full.attn_mask = mask;
    EXPECT_LE(relative_error(ring_attention(q, k, v, comm, o).output,
                             scaled_dot_product_attention(p.q, p.k, p.v, full).output),
              kTolerance);
  } else {
    EXPECT_THROW((void)ring_attention(q, k, v, comm, o), ShapeError);
  }
  const Tensor rows = shard(mask, c, comm);
  o.attn_mask = Tensor::zeros({rows.size(0), c.lk + 1});  // one key column too many
  EXPECT_THROW((void)ring_attention(q, k, v, comm, o), ShapeError);
  o.attn_mask = rows.slice(-1, 0, c.lk - 1);  // one too few
  EXPECT_THROW((void)ring_attention(q, k, v, comm, o), ShapeError);
}

// Ranks called with different options used to compute silently with them (is_causal on one
// rank only), and a refusal on one rank (a float64 input) left the others waiting for
// QKV_DIST_TIMEOUT (120 s here) before a CommunicationError: now every rank fails at once.
TEST(RingAndUlysses, RanksCalledDifferentlyOrARefusalFailOnEveryRank) {
  const Communicator comm = world();
  const AttentionCase c{1, 2, 2, 8, 8, 4, 4, false, SequenceLayout::contiguous};
  const Problem p(c, comm);
  const Tensor q = shard(p.q, c, comm), k = shard(p.k, c, comm), v = shard(p.v, c, comm);
  // Shapes the kernel refuses (GQA heads without enable_gqa, q's D against k's) fail on every
  // rank, also where L = 2 over 3-4 ranks leaves a rank no query rows or H = 2 leaves it no heads:
  // those ranks used to wait QKV_DIST_TIMEOUT while the others failed.
  const auto tiny = [&](int64_t heads, int64_t d, uint64_t seed) {
    return shard(Tensor::randn({1, heads, 2, d}, seed), c, comm);
  };
  EXPECT_THROW((void)ring_attention(tiny(4, 4, 1), tiny(2, 4, 2), tiny(2, 4, 3), comm, {}), ShapeError);
  EXPECT_THROW((void)ring_attention(tiny(2, 4, 1), tiny(2, 3, 2), tiny(2, 3, 3), comm, {}), ShapeError);
  EXPECT_THROW((void)ulysses_attention(tiny(2, 4, 1), tiny(2, 3, 2), tiny(2, 3, 3), comm, {}), ShapeError);
  // Mask and is_causal together are refused on every rank, as SDPA refuses them: a rank whose
  // pairs or heads never reached the kernel's causal case used to go on (ring returned, Ulysses
  // waited QKV_DIST_TIMEOUT in its all-to-all).
  RingAttentionOptions rm;
  rm.is_causal = true;
  rm.attn_mask = Tensor::ones({q.size(-2), c.lk}, DType::b8);
  EXPECT_THROW_WITH(ring_attention(q, k, v, comm, rm), ValueError, "ring_attention: attn_mask and is_causal");
  UlyssesAttentionOptions um;
  um.is_causal = true;
  um.attn_mask = Tensor::ones({c.lq, c.lk}, DType::b8);
  EXPECT_THROW_WITH(ulysses_attention(q, k, v, comm, um), ValueError, "ulysses_attention: attn_mask and is_causal");
  if (comm.size() == 1) {  // nothing to disagree with: a refusal is the rank's own error
    EXPECT_THROW((void)ring_attention(q.to(DType::f64), k, v, comm, {}), DTypeError);
    EXPECT_THROW((void)ulysses_attention(q.to(DType::f64), k, v, comm, {}), DTypeError);
    EXPECT_THROW((void)ulysses_attention_backward(q, k, v, Tensor::zeros(q.shape(), DType::f64), comm, {}), DTypeError);
    RingAttentionOptions with_lse;
    with_lse.return_logsumexp = true;
    const AttentionResult r = ring_attention(q, k, v, comm, with_lse);
    EXPECT_THROW((void)ring_attention_backward(q, k, v, r.output, r.output.to(DType::f64), *r.logsumexp, comm, {}),
                 DTypeError);
    return;
  }
  const bool first = comm.rank() == 0;
  RingAttentionOptions ro;
  ro.is_causal = first;
  EXPECT_THROW((void)ring_attention(q, k, v, comm, ro), ValueError);
  UlyssesAttentionOptions uo;
  uo.is_causal = first;
  EXPECT_THROW((void)ulysses_attention(q, k, v, comm, uo), ValueError);
  EXPECT_THROW((void)ulysses_attention_backward(q, k, v, Tensor::zeros(q.shape()), comm, uo), ValueError);
  const Tensor q64 = first ? q : q.to(DType::f64);  // refused on every rank but 0
  // Every rank raises the refusing ranks' class: a DTypeError in both (Ulysses used to raise a
  // ShapeError for a dtype).
  EXPECT_THROW((void)ring_attention(q64, k, v, comm, {}), DTypeError);
  EXPECT_THROW((void)ulysses_attention(q64, k, v, comm, {}), DTypeError);
  RingAttentionOptions with_lse;
  with_lse.return_logsumexp = true;
  const AttentionResult r = ring_attention(q, k, v, comm, with_lse);
  const Tensor lse = first ? *r.logsumexp : r.logsumexp->slice(-1, 0, 1);  // a wrong shape on ranks > 0
  EXPECT_THROW((void)ring_attention_backward(q, k, v, r.output, r.output, lse, comm, {}), Error);
  const Tensor dout64 = first ? r.output : r.output.to(DType::f64);
  EXPECT_THROW_WITH(ring_attention_backward(q, k, v, r.output, dout64, *r.logsumexp, comm, {}), DTypeError,
                    "must be float32, got float32, float64, float32");
  // Still in step: the same call on every rank runs.
  EXPECT_LE(relative_error(ring_attention(q, k, v, comm, {}).output, p.want), kTolerance);
}

TEST(UlyssesAttention, EqualsTheFusedKernelOnTheWholeSequence) {
  const Communicator comm = world();
  for (const AttentionCase& c : kCases) {
    SCOPED_TRACE(describe(c));
    const Problem p(c, comm);
    const auto o = options_of<UlyssesAttentionOptions>(c);
    const Tensor got = ulysses_attention(shard(p.q, c, comm), shard(p.k, c, comm), shard(p.v, c, comm), comm, o);
    EXPECT_LE(relative_error(got, p.want), kTolerance);
  }
}

TEST(UlyssesAttention, SplitsPerHeadMasksWithTheHeads) {
  const Communicator comm = world();
  const AttentionCase c{1, 5, 5, 21, 21, 8, 8, false, SequenceLayout::contiguous};
  const Problem p(c, comm);
  const Tensor mask = Tensor::randn({1, c.hq, c.lq, c.lk}, 9);
  AttentionOptions full;
  full.attn_mask = mask;
  const Tensor want = shard(scaled_dot_product_attention(p.q, p.k, p.v, full).output, c, comm);
  UlyssesAttentionOptions o;
  o.attn_mask = mask;
  const Tensor got = ulysses_attention(shard(p.q, c, comm), shard(p.k, c, comm), shard(p.v, c, comm), comm, o);
  EXPECT_LE(relative_error(got, want), kTolerance);
}

}  // namespace
}  // namespace qkv::dist
