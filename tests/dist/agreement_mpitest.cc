// The agreement step every qkv::dist operation starts with (communicator.h refuse_call,
// dist/internal.h agree_on_call): a rank that refuses its arguments makes every rank fail at
// once, with an error naming it and quoting its reason (the same class for argument errors),
// ranks called differently are told what differs, and what only some ranks would have refused
// later (the kernel on ranks with heads or query rows, the ring on ranks whose shard is wrong)
// is refused on every rank. Each case used to leave some ranks waiting QKV_DIST_TIMEOUT (120 s
// in ctest) or returning while others failed; afterwards the ranks are still in step.
#include <gtest/gtest.h>

#include <exception>
#include <string>

#include "common/expect.h"
#include "dist/dist_test_util.h"
#include "qkv/attention.h"
#include "qkv/cuda.h"
#include "qkv/dist/ring_attention.h"
#include "qkv/dist/ulysses_attention.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

using testing::relative_error;
using testing::world;

// "rank 1 of 3 refused the call, so rank 0 stops too; rank 1 said: <its error>" on the others.
std::string refused_by(const Communicator& comm, int rank, const std::string& reason) {
  return "rank " + std::to_string(rank) + " of " + std::to_string(comm.size()) + " refused the call, so rank " +
         std::to_string(comm.rank()) + " stops too; rank " + std::to_string(rank) + " said: " + reason;
}

// This rank's contiguous shard of [1, heads, length, d] (the same seed on every rank).
Tensor shard(int64_t heads, int64_t length, int64_t d, uint64_t seed, const Communicator& comm) {
  return shard_sequence(Tensor::randn({1, heads, length, d}, seed), -2, comm.rank(), comm.size(),
                        SequenceLayout::contiguous)
      .contiguous();
}

TEST(Agreement, ARefusalNamesTheRankAndItsReasonOnEveryRank) {
  const Communicator comm = world();
  const int last = comm.size() - 1;
  const bool refuses = comm.rank() == last;
  const Tensor q = shard(2, 8, 4, 1, comm), k = shard(2, 8, 4, 2, comm), v = shard(2, 8, 4, 3, comm);
  const Tensor mine = refuses ? q.to(DType::f64) : q;
  const std::string ring_reason = "ring_attention: q, k and v must be float32, got q float64";
  EXPECT_THROW_WITH(ring_attention(mine, k, v, comm), DTypeError,
                    refuses ? ring_reason : "ring_attention: " + refused_by(comm, last, ring_reason));
  // Ulysses' backward: a grad_out of another dtype on one rank (with H = 1 < P the other ranks
  // hold no heads; with a float64 grad_out everywhere they used to wait in the second all-to-all).
  const Tensor q1 = shard(1, 8, 4, 4, comm);
  const Tensor dout = refuses ? q1.to(DType::f64) : q1;
  const std::string uly_reason = "ulysses_attention_backward: grad_out is ";
  EXPECT_THROW_WITH(ulysses_attention_backward(q1, q1, q1, dout, comm), DTypeError,
                    refuses ? uly_reason : "ulysses_attention_backward: " + refused_by(comm, last, uly_reason));
  EXPECT_THROW((void)ulysses_attention_backward(q1, q1, q1, q1.to(DType::f64), comm), DTypeError);
  // refuse_call: a rank that failed before it could make the call (the Python bindings, when
  // converting an argument fails) stops the others' call too, and its own error comes back.
  if (refuses) {
    const auto error = std::make_exception_ptr(IndexError("converting q: not an array"));
    EXPECT_THROW_WITH(refuse_call("ring_attention", comm, error), IndexError, "converting q: not an array");
  } else {
    EXPECT_THROW_WITH(ring_attention(q, k, v, comm), IndexError, refused_by(comm, last, "converting q: not an array"));
  }
  // A failure that is not about the arguments (here a bad_alloc) is a CommunicationError on the others.
  if (comm.size() > 1) {
    if (refuses) {
      EXPECT_THROW(refuse_call("ring_attention", comm, std::make_exception_ptr(std::bad_alloc())), std::bad_alloc);
    } else {
      EXPECT_THROW_WITH(ring_attention(q, k, v, comm), CommunicationError, "refused the call");
    }
  }
  // Still in step.
  AttentionOptions whole;
  const Tensor want =
      shard_sequence(scaled_dot_product_attention(Tensor::randn({1, 2, 8, 4}, 1), Tensor::randn({1, 2, 8, 4}, 2),
                                                  Tensor::randn({1, 2, 8, 4}, 3), whole)
                         .output,
                     -2, comm.rank(), comm.size(), SequenceLayout::contiguous);
  EXPECT_LE(relative_error(ring_attention(q, k, v, comm).output, want), 1e-5);
}

TEST(Agreement, RanksCalledDifferentlyAreToldWhatDiffers) {
  const Communicator comm = world();
  if (comm.size() == 1) return;  // nobody to differ from
  const Tensor q = shard(2, 8, 4, 1, comm);
  RingAttentionOptions o;
  o.is_causal = comm.rank() == 0;
  EXPECT_THROW_WITH(ring_attention(q, q, q, comm, o), ValueError,
                    comm.rank() == 0
                        ? "rank 1 has is_causal 0; rank 0 has is_causal 1"
                        : "rank 0 has is_causal 1; rank " + std::to_string(comm.rank()) + " has is_causal 0");
  // Sizes outside the sequence axis: the sequence axis is '*' (it may differ between ranks).
  const Tensor v = comm.rank() == 0 ? shard(2, 8, 5, 2, comm) : shard(2, 8, 4, 2, comm);
  EXPECT_THROW_WITH(ulysses_attention(q, q, v, comm), ValueError,
                    comm.rank() == 0 ? "rank 1 has v [1, 2, *, 4] float32; rank 0 has v [1, 2, *, 5] float32"
                                     : "rank 0 has v [1, 2, *, 5] float32; rank " + std::to_string(comm.rank()) +
                                           " has v [1, 2, *, 4] float32");
}

// Ranks in different operations with equal fields (ring on rank 0, Ulysses on the others) used to
// agree and then pair up their transfers wrongly (waiting QKV_DIST_TIMEOUT).
TEST(Agreement, RanksInDifferentOperationsAreToldSo) {
  const Communicator comm = world();
  if (comm.size() == 1) return;
  const Tensor q = shard(2, 8, 4, 1, comm);
  const std::string me = std::to_string(comm.rank());
  if (comm.rank() == 0) {
    EXPECT_THROW_WITH(ring_attention(q, q, q, comm), ValueError,
                      "rank 1 has operation ulysses_attention; rank 0 has operation ring_attention");
  } else {
    EXPECT_THROW_WITH(ulysses_attention(q, q, q, comm), ValueError,
                      "rank 0 has operation ring_attention; rank " + me + " has operation ulysses_attention");
  }
}

// Shards whose lengths the layout does not give. Ring checked every rank's keys but only its own
// queries, so with 3 or more ranks a rank whose queries fit went on into the ring and waited
// QKV_DIST_TIMEOUT for the ranks that had failed alone; Ulysses checked no lengths: the first
// all-to-all took any, the second failed on some ranks while the others returned.
TEST(Agreement, ShardLengthsOffTheLayoutFailOnEveryRank) {
  const Communicator comm = world();
  if (comm.size() == 1) return;
  const int64_t l = 4 * comm.size();  // 4 rows per rank; rank 0 passes 3 queries, rank 1 passes 5
  const Tensor k = shard(2, l, 4, 2, comm);
  const Tensor full_q = Tensor::randn({1, 2, l, 4}, 1);
  const int r = comm.rank();
  const int64_t q0 = r == 0 ? 0 : (r == 1 ? 3 : 4 * r), q1 = r == 0 ? 3 : 4 * (r + 1);
  const Tensor q = full_q.slice(2, q0, q1).contiguous();
  EXPECT_THROW_WITH(ring_attention(q, k, k, comm), ShapeError, "rank 0 holds 3 queries; the contiguous layout of");
  EXPECT_THROW_WITH(ulysses_attention(q, k, k, comm), ShapeError, "rank 0 holds 3 queries; the contiguous layout of");
  EXPECT_THROW_WITH(ulysses_attention(q, q, q, comm), ShapeError, "rank 0 holds 3 queries");
  const Tensor good = shard(2, l, 4, 1, comm);
  EXPECT_EQ(ulysses_attention(good, k, k, comm).shape(), good.shape());  // still in step
}

// MPI here moves host memory: a GPU tensor reached MPI as a device pointer read as host memory
// (ring, Ulysses, the Communicator), and tensor parallelism's Linear refused it on the ranks with
// heads only. Now a DeviceError on every rank, before any transfer. Runs where a GPU is.
TEST(Agreement, TensorsOnAGpuAreADeviceErrorOnEveryRank) {
  if (!cuda::available()) GTEST_SKIP() << "no GPU";
  const Communicator comm = world();
  const Tensor q = shard(2, 8, 4, 1, comm), g = q.to(Device::cuda(0));
  const Tensor before = ring_attention(q, q, q, comm).output;  // the ranks in step, before any refusal
  EXPECT_THROW_WITH(ring_attention(g, q, q, comm), DeviceError, "no kernel for tensors on cuda:0");
  EXPECT_THROW_WITH(ulysses_attention(q, q, g, comm), DeviceError, "every input must be on one device");
  if (comm.size() > 1) {  // on one rank only: the others name it
    const Tensor mine = comm.rank() == 1 ? g : q;
    EXPECT_THROW_WITH(ring_attention(mine, q, q, comm), DeviceError, "rank 1 of ");
  }
  EXPECT_THROW((void)comm.all_gather(g, 0), DeviceError);
  EXPECT_LE(relative_error(ring_attention(q, q, q, comm).output, before), 0.0);  // still in step after them
}

}  // namespace
}  // namespace qkv::dist
