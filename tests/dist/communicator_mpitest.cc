// qkv::dist::Communicator on every rank of the job: point to point, the collectives on
// tensors (uneven sizes too) and the errors of mismatched ranks.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/expect.h"
#include "dist/dist_test_util.h"
#include "qkv/dist/shard.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

using testing::world;

// Rank r's values: r * 1000 + i, so that every element says where it came from.
Tensor tagged(const Shape& shape, int rank) {
  Tensor t = Tensor::arange(shape_numel(shape)).reshape(shape);
  std::vector<float> v = t.to_vector<float>();
  for (float& x : v) x += static_cast<float>(rank) * 1000.0f;
  return Tensor::from_vector(v, shape);
}

TEST(Communicator, RingOfSendsAndReceivesDeliversEachNeighboursTensor) {
  const Communicator c = world();
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() - 1 + c.size()) % c.size();
  const Tensor mine = tagged({3, 5}, c.rank());
  const Tensor got = Tensor::empty({3, 5});
  std::vector<Request> r;
  r.push_back(c.irecv(got, prev, 7));
  r.push_back(c.isend(mine.transpose(0, 1).contiguous().transpose(0, 1), next, 7));  // strided: packed once
  wait_all(r);
  EXPECT_EQ(got.to_vector<float>(), tagged({3, 5}, prev).to_vector<float>());
}

TEST(Communicator, AShorterMessageThanTheReceivingTensorIsAnError) {
  const Communicator c = world();
  const int next = (c.rank() + 1) % c.size(), prev = (c.rank() - 1 + c.size()) % c.size();
  const Tensor got = Tensor::empty({3});
  Request recv = c.irecv(got, prev, 9);
  Request send = c.isend(Tensor::zeros({2}), next, 9);
  EXPECT_THROW_WITH(recv.wait(), CommunicationError, "received 8 bytes, expected 12");
  send.wait();
}

TEST(Communicator, AllReduceSumsEveryRank) {
  const Communicator c = world();
  const Tensor t = Tensor::full({4, 3}, c.rank() + 1, DType::f64);
  c.all_reduce_sum(t);
  const double want = c.size() * (c.size() + 1) / 2.0;
  for (double x : t.to_vector<double>()) EXPECT_EQ(x, want);
}

TEST(Communicator, AllGatherConcatenatesUnevenShardsAlongAnyDim) {
  const Communicator c = world();
  for (int64_t dim : {0, 1, 2}) {
    Shape shape{2, 3, 4};
    shape[static_cast<size_t>(dim)] = c.rank() + 1;  // rank r contributes r + 1 rows along dim
    const Tensor got = c.all_gather(tagged(shape, c.rank()), dim);
    int64_t at = 0;
    for (int r = 0; r < c.size(); ++r) {
      Shape rs{2, 3, 4};
      rs[static_cast<size_t>(dim)] = r + 1;
      EXPECT_EQ(got.slice(dim, at, at + r + 1).contiguous().to_vector<float>(), tagged(rs, r).to_vector<float>())
          << "dim " << dim << " rank " << r;
      at += r + 1;
    }
    EXPECT_EQ(got.size(dim), at);
  }
}

TEST(Communicator, AllGatherOfDifferentOtherDimsNamesTheRank) {
  const Communicator c = world();
  if (c.size() == 1) {
    EXPECT_EQ(c.all_gather(tagged({2, 2}, 0), 0).size(0), 2);
    return;
  }
  const Tensor t = tagged({2, c.rank() == 1 ? 4 : 3}, c.rank());
  try {
    (void)c.all_gather(t, 0);
    ADD_FAILURE() << "no error";
  } catch (const CommunicationError& e) {
    EXPECT_NE(std::string(e.what()).find("only dim 0 may differ"), std::string::npos) << e.what();
  }
}

TEST(Communicator, AllToAllRoutesEveryPartToItsRank) {
  const Communicator c = world();
  std::vector<Tensor> parts;
  std::vector<Shape> shapes;
  for (int r = 0; r < c.size(); ++r) {
    parts.push_back(tagged({c.rank() + 1, r + 2}, c.rank()));  // what this rank sends to r
    shapes.push_back({r + 1, c.rank() + 2});                   // what r sends here
  }
  const std::vector<Tensor> got = c.all_to_all(parts, shapes);
  for (int r = 0; r < c.size(); ++r) {
    EXPECT_EQ(got[static_cast<size_t>(r)].to_vector<float>(), tagged({r + 1, c.rank() + 2}, r).to_vector<float>());
  }
}

TEST(Communicator, AllToAllWithAWrongReceiveShapeIsAnErrorNotAnOverrun) {
  const Communicator c = world();
  std::vector<Tensor> parts(static_cast<size_t>(c.size()), Tensor::zeros({2, 2}));
  std::vector<Shape> shapes(static_cast<size_t>(c.size()), Shape{2, 3});
  EXPECT_THROW((void)c.all_to_all(parts, shapes), CommunicationError);
}

// A tensor refused on one rank (not contiguous, a dim out of range, parts of two dtypes) left the
// other ranks waiting QKV_DIST_TIMEOUT in the collective, and ranks summing tensors of one element
// count but different dtypes summed one rank's float64 bytes as another's float32. Now an error
// on every rank at once, and the ranks are still in step.
TEST(Communicator, ATensorRefusedOnOneRankFailsTheCollectiveOnEveryRank) {
  const Communicator c = world();
  if (c.size() == 1) return;
  const bool odd = c.rank() == c.size() - 1;
  const std::string last = "rank " + std::to_string(c.size() - 1);
  const Tensor good = Tensor::ones({4, 2});
  if (odd) {
    EXPECT_THROW_WITH(c.all_reduce_sum(Tensor::ones({2, 4}).transpose(0, 1)), ValueError, "must be contiguous");
  } else {
    EXPECT_THROW_WITH(c.all_reduce_sum(good.clone()), CommunicationError, last + " refused its tensor");
  }
  const Tensor mixed = odd ? Tensor::ones({4, 2}, DType::f64) : Tensor::ones({4, 2});
  EXPECT_THROW_WITH(c.all_reduce_sum(mixed), CommunicationError, odd ? "elements of float32" : "elements of float64");
  if (odd) {
    EXPECT_THROW((void)c.all_gather(good, 5), IndexError);
  } else {
    EXPECT_THROW_WITH(c.all_gather(good, 0), CommunicationError, last + " refused its tensor");
  }
  std::vector<Tensor> parts(static_cast<size_t>(c.size()), Tensor::zeros({2, 2}));
  const std::vector<Shape> shapes(static_cast<size_t>(c.size()), Shape{2, 2});
  if (odd) {
    parts[0] = Tensor::zeros({2, 2}, DType::f64);
    EXPECT_THROW((void)c.all_to_all(parts, shapes), DTypeError);
  } else {
    EXPECT_THROW_WITH(c.all_to_all(parts, shapes), CommunicationError, last + " refused its parts");
  }
  const Tensor t = Tensor::ones({3});
  c.all_reduce_sum(t);  // still in step
  EXPECT_EQ(t.item({0}), c.size());
}

TEST(Communicator, SplitGroupsRanksByColor) {
  const Communicator c = world();
  const Communicator half = c.split(c.rank() % 2, c.rank());
  EXPECT_EQ(half.size(), (c.size() + 1 - c.rank() % 2) / 2);
  EXPECT_EQ(half.rank(), c.rank() / 2);
  const Tensor t = Tensor::full({1}, 1.0, DType::i64);
  half.all_reduce_sum(t);
  EXPECT_EQ(t.item(), half.size());
}

TEST(Shard, ZigzagShardsReassembleTheSequence) {
  const Communicator c = world();
  for (SequenceLayout layout : {SequenceLayout::contiguous, SequenceLayout::zigzag}) {
    for (int64_t length : {int64_t{1}, int64_t{7}, int64_t{40}}) {
      const Tensor full = Tensor::arange(length * 2).reshape({length, 2});
      const Tensor mine = shard_sequence(full, 0, c.rank(), c.size(), layout);
      const Tensor back = unshard_sequence(c.all_gather(mine.contiguous(), 0), 0, c.size(), layout);
      EXPECT_EQ(back.to_vector<float>(), full.to_vector<float>()) << sequence_layout_name(layout) << " " << length;
    }
  }
}

}  // namespace
}  // namespace qkv::dist
