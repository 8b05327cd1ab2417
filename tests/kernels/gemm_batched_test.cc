// Batched qkv::gemm: layouts oneDNN expresses in one descriptor (permuted and
// broadcast batch strides) and those it cannot (looped), argument checks, the
// plan cache and calls from several threads.
#include <gtest/gtest.h>

#include <string>
#include <thread>
#include <vector>

#include "common/thread_guard.h"
#include "kernels/cpu/gemm_internal.h"
#include "kernels/gemm_test_util.h"
#include "qkv/error.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"

namespace qkv {
namespace {

using test::Case;
using test::expect_matches_reference;
using test::plain;

using test::ThreadCountGuard;

std::string plan_of(const Case& c) { return detail::gemm_plan_str(c.s, c.alpha, c.beta, c.batch); }

TEST(Gemm, BatchedContiguous) {
  Case c = plain(17, 9, 13);
  c.batch = {{3, 4}, {4 * 17 * 13, 17 * 13}, {4 * 13 * 9, 13 * 9}, {4 * 17 * 9, 17 * 9}};
  expect_matches_reference(c);
  EXPECT_NE(plan_of(c).find("outer=0"), std::string::npos) << plan_of(c);
}

// Attention's layouts: q, k, v stored [B, L, H, D] and used as [B, H, L, D].
TEST(Gemm, BatchedHeadsFromBLHDStorage) {
  const int64_t B = 2, L = 33, H = 3, D = 16;
  Case scores;  // [B, H, L, L] = q @ k^T
  scores.s = {false, true, L, L, D, H * D, H * D, L};
  scores.alpha = 0.25f;
  scores.batch = {{B, H}, {L * H * D, D}, {L * H * D, D}, {H * L * L, L * L}};
  expect_matches_reference(scores);
  EXPECT_NE(plan_of(scores).find("outer=0"), std::string::npos) << plan_of(scores);
  Case out;  // [B, L, H, D] storage = p [B, H, L, L] @ v
  out.s = {false, false, L, D, L, L, H * D, H * D};
  out.batch = {{B, H}, {H * L * L, L * L}, {L * H * D, D}, {L * H * D, D}};
  expect_matches_reference(out);
  EXPECT_NE(plan_of(out).find("outer=0"), std::string::npos) << plan_of(out);
}

TEST(Gemm, BatchedBroadcastStrideZero) {
  const int64_t M = 7, N = 5, K = 6;
  Case c = plain(M, N, K);
  c.batch = {{3, 4}, {0, M * K}, {4 * K * N, K * N}, {4 * M * N, M * N}};  // A shared over dim 0
  expect_matches_reference(c);
  EXPECT_NE(plan_of(c).find("outer=0"), std::string::npos) << plan_of(c);
  c.batch = {{3, 4}, {4 * M * K, M * K}, {K * N, 0}, {4 * M * N, M * N}};  // B shared over dim 1
  expect_matches_reference(c);
  c.batch = {{3, 4}, {M * K, 0}, {0, K * N}, {4 * M * N, M * N}};  // one of each
  expect_matches_reference(c);
  EXPECT_NE(plan_of(c).find("outer=0"), std::string::npos) << plan_of(c);
  // Grouped-query attention: 2 k/v heads each shared by 3 query heads.
  c.s.trans_b = true;
  c.s.ldb = K;
  c.batch = {{2, 2, 3}, {6 * M * K, 3 * M * K, M * K}, {2 * N * K, N * K, 0}, {6 * M * N, 3 * M * N, M * N}};
  expect_matches_reference(c);
}

TEST(Gemm, BatchedBothOperandsBroadcastIsLooped) {
  Case c = plain(9, 8, 7);
  c.batch = {{5}, {0}, {0}, {72}};  // oneDNN requires one of A, B to span each dst dim
  expect_matches_reference(c);
  EXPECT_NE(plan_of(c).find("outer=1"), std::string::npos) << plan_of(c);
}

TEST(Gemm, BatchedNegativeStridesAreLooped) {
  Case c = plain(6, 5, 4);
  c.batch = {{3}, {-24}, {20}, {30}};
  expect_matches_reference(c);
  EXPECT_NE(plan_of(c).find("outer=1"), std::string::npos) << plan_of(c);
}

TEST(Gemm, BatchedOverlappingInputsAreLooped) {
  Case c = plain(4, 3, 5);
  c.batch = {{6}, {5}, {0}, {12}};  // A's matrices are sliding windows one row apart
  expect_matches_reference(c);
}

TEST(Gemm, BatchedPermutedAndPaddedStrides) {
  Case c = plain(5, 6, 7, true, false, 2);  // lda = 7, ldb = 8, ldc = 8
  // C batch dims in reverse order of storage, A padded, B permuted.
  c.batch = {{2, 3}, {3 * 60, 60}, {61, 2 * 61}, {5 * 8, 2 * 5 * 8}};
  expect_matches_reference(c);
}

TEST(Gemm, MoreBatchDimsThanOneDnnSupports) {
  // Eleven non-mergeable dims: 13 descriptor dims > oneDNN's 12.
  Case c = plain(3, 2, 2);
  int64_t sa = 6, sc = 6;
  for (int d = 0; d < 11; ++d) {
    c.batch.shape.push_back(2);
    c.batch.stride_c.insert(c.batch.stride_c.begin(), sc);
    c.batch.stride_a.push_back(sa);  // reversed order: no two dims merge
    c.batch.stride_b.push_back(0);
    sa *= 2;
    sc *= 2;
  }
  expect_matches_reference(c);
  EXPECT_EQ(plan_of(c).find("outer=0"), std::string::npos) << plan_of(c);
}

TEST(Gemm, LoopedBatchRunsOnParallelForWhenSmall) {
  ThreadCountGuard guard;
  set_num_threads(2);
  Case c = plain(8, 8, 8);
  c.batch = {{64}, {0}, {0}, {64}};
  EXPECT_NE(plan_of(c).find("parallel"), std::string::npos) << plan_of(c);
  expect_matches_reference(c);
}

TEST(Gemm, EmptyBatchDoesNothing) {
  Case c = plain(4, 4, 4);
  c.batch = {{3, 0}, {16, 16}, {16, 16}, {16, 16}};
  EXPECT_EQ(plan_of(c), "empty");
  expect_matches_reference(c);
}

TEST(Gemm, RejectsInconsistentArguments) {
  std::vector<float> buf(64, 0.0f);
  const float* p = buf.data();
  float* c = buf.data();
  auto expect_error = [&](const GemmShape& s, const GemmBatch& batch, const std::string& part) {
    using GemmF32 = void (*)(const GemmShape&, float, const float*, const float*, float, float*, const GemmBatch&);
    for (GemmF32 fn : std::initializer_list<GemmF32>{gemm, gemm_reference}) {
      try {
        fn(s, 1.0f, p, p, 0.0f, c, batch);
        ADD_FAILURE() << "no error for " << part;
      } catch (const ValueError& e) {
        EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find("m="), std::string::npos) << e.what();
      }
    }
  };
  expect_error({false, false, -1, 2, 2, 2, 2, 2}, {}, "m, n and k must be >= 0");
  expect_error({false, false, 2, 2, 3, 2, 2, 2}, {}, "lda=2 is less than");
  expect_error({true, false, 3, 2, 2, 2, 2, 2}, {}, "lda=2 is less than");
  expect_error({false, true, 2, 3, 2, 2, 1, 3}, {}, "ldb=1 is less than");
  expect_error({false, false, 2, 3, 2, 2, 3, 2}, {}, "ldc=2 is less than");
  expect_error({false, false, 2, 2, 2, 2, 2, 2}, {{2}, {4}, {4}, {}}, "one entry per batch dim");
  expect_error({false, false, 2, 2, 2, 2, 2, 2}, {{2}, {4}, {4}, {0}}, "stride_c is 0");
  expect_error({false, false, 2, 2, 2, 2, 2, 2}, {{-1}, {4}, {4}, {4}}, "negative batch dim");
  EXPECT_THROW(gemm({false, false, 2, 2, 2, 2, 2, 2}, 1.0f, nullptr, p, 0.0f, c), ValueError);
  EXPECT_THROW(gemm({false, false, 2, 2, 2, 2, 2, 2}, 1.0f, p, p, 0.0f, nullptr), ValueError);
}

TEST(Gemm, PlanCacheIsBoundedAndReused) {
  detail::gemm_plan_cache_clear();
  const Case first = plain(5, 3, 4);
  plan_of(first);
  plan_of(first);
  EXPECT_EQ(detail::gemm_plan_cache_size(), 1u);
  for (int64_t m = 1; m <= 300; ++m) plan_of(plain(m, 2, 3));
  EXPECT_EQ(detail::gemm_plan_cache_size(), detail::kGemmPlanCacheCapacity);
  expect_matches_reference(first);  // evicted long ago: rebuilt transparently
}

TEST(Gemm, ConcurrentCallsFromThreads) {
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([t] {
      for (int i = 0; i < 10; ++i) {
        Case c = plain(16 + t * 8 + i, 24 + i, 32 + t, (i & 1) != 0, (i & 2) != 0);
        c.batch = {{3}, {0}, {c.s.k * c.s.n}, {c.s.m * c.s.n}};
        expect_matches_reference(c, static_cast<uint32_t>(t * 100 + i));
      }
    });
  }
  for (auto& th : threads) th.join();
}

// oneDNN 2.6 with its library-managed scratchpad gets this wrong (or crashes):
// one cached primitive executed by several threads at once.
TEST(Gemm, ConcurrentCallsWithTheSameShape) {
  ThreadCountGuard guard;
  set_num_threads(1);  // one OpenMP thread per caller: no oversubscription
  const int64_t M = 33, N = 65, K = 17;
  std::vector<float> a(M * K), b(K * N);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) - 3.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) - 2.0f;
  const GemmShape s{false, false, M, N, K, K, N, N};
  std::vector<float> want(M * N);
  gemm_reference(s, 1.0f, a.data(), b.data(), 0.0f, want.data());
  std::vector<int> wrong(4, 0);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::vector<float> c(M * N);
      for (int rep = 0; rep < 1000; ++rep) {
        gemm(s, 1.0f, a.data(), b.data(), 0.0f, c.data());
        wrong[t] += c != want;  // small integers: exact in any order
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong, std::vector<int>(4, 0));
}

TEST(Gemm, CalledInsideParallelFor) {
  ThreadCountGuard guard;
  set_num_threads(2);
  const int64_t M = 33, N = 65, K = 17, count = 64;
  std::vector<float> a(M * K * count), b(K * N), c(M * N * count), r(M * N * count);
  for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i % 7) - 3.0f;
  for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<float>(i % 5) - 2.0f;
  const GemmShape s{false, false, M, N, K, K, N, N};
  parallel_for(0, count, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) gemm(s, 1.0f, &a[i * M * K], b.data(), 0.0f, &c[i * M * N]);
  });
  for (int64_t i = 0; i < count; ++i) gemm_reference(s, 1.0f, &a[i * M * K], b.data(), 0.0f, &r[i * M * N]);
  EXPECT_EQ(c, r);  // small integers: exact in any order
}

TEST(Gemm, FollowsThreadCountChanges) {
  ThreadCountGuard guard;
  for (int n : {1, 2, 1}) {
    set_num_threads(n);
    expect_matches_reference(plain(300, 200, 100));
  }
}

}  // namespace
}  // namespace qkv
