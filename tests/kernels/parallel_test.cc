// parallel_for: coverage, chunking, nesting, exceptions; the thread count and
// the parsing of QKV_NUM_THREADS / OMP_NUM_THREADS.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "common/expect.h"
#include "common/thread_guard.h"
#include "kernels/cpu/parallel_internal.h"
#include "qkv/error.h"
#include "qkv/parallel.h"

namespace qkv {
namespace {

using test::ThreadCountGuard;

// Runs parallel_for and returns the chunks it made, checking that every index
// was visited exactly once.
std::vector<std::pair<int64_t, int64_t>> run_chunks(int64_t begin, int64_t end, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(std::max<int64_t>(end - begin, 0)));
  std::mutex mutex;
  std::vector<std::pair<int64_t, int64_t>> chunks;
  parallel_for(begin, end, grain, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) hits[static_cast<size_t>(i - begin)]++;
    const std::lock_guard<std::mutex> lock(mutex);
    chunks.emplace_back(lo, hi);
  });
  for (size_t i = 0; i < hits.size(); ++i) EXPECT_EQ(hits[i].load(), 1) << "index " << begin + i;
  return chunks;
}

TEST(Parallel, CoversEveryIndexExactlyOnce) {
  ThreadCountGuard guard;
  for (int threads : {1, 2, 3, 8}) {
    set_num_threads(threads);
    for (auto [begin, end, grain] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
             {0, 1, 1}, {0, 7, 1}, {5, 1005, 1}, {-50, 50, 3}, {0, 1000, 100}, {0, 17, 0}, {3, 4, 9}}) {
      SCOPED_TRACE(testing::Message() << threads << " threads, [" << begin << ", " << end << ") grain " << grain);
      const auto chunks = run_chunks(begin, end, grain);
      EXPECT_LE(chunks.size(), static_cast<size_t>(threads));
      for (auto [lo, hi] : chunks) {
        EXPECT_GE(hi - lo, std::min<int64_t>(std::max<int64_t>(grain, 1), end - begin));
      }
    }
  }
}

TEST(Parallel, EmptyRangeCallsNothing) {
  int calls = 0;
  parallel_for(5, 5, 1, [&](int64_t, int64_t) { ++calls; });
  parallel_for(5, 2, 1, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 0);
}

TEST(Parallel, SmallRangeRunsInlineOnTheCaller) {
  ThreadCountGuard guard;
  set_num_threads(4);
  const auto caller = std::this_thread::get_id();
  int calls = 0;
  parallel_for(0, 19, 10, [&](int64_t lo, int64_t hi) {
    ++calls;
    EXPECT_EQ(std::this_thread::get_id(), caller);
    EXPECT_EQ(lo, 0);
    EXPECT_EQ(hi, 19);
  });
  EXPECT_EQ(calls, 1);
}

TEST(Parallel, SplitsIntoConfiguredThreadCount) {
  ThreadCountGuard guard;
  set_num_threads(2);
  const auto chunks = run_chunks(0, 1000, 1);
  EXPECT_EQ(chunks.size(), 2u);  // the runtime grants 2 threads on any machine
}

TEST(Parallel, NestedCallsRunInline) {
  ThreadCountGuard guard;
  set_num_threads(2);
  std::atomic<int> inner_calls{0}, inner_items{0};
  parallel_for(0, 2, 1, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const auto outer_thread = std::this_thread::get_id();
      parallel_for(0, 100, 1, [&](int64_t a, int64_t b) {
        EXPECT_EQ(std::this_thread::get_id(), outer_thread);
        inner_calls++;
        inner_items += static_cast<int>(b - a);
      });
    }
  });
  EXPECT_EQ(inner_calls.load(), 2);
  EXPECT_EQ(inner_items.load(), 200);
}

TEST(Parallel, RethrowsTheFirstExceptionAfterAllChunks) {
  ThreadCountGuard guard;
  for (int threads : {1, 2, 4}) {
    set_num_threads(threads);
    std::atomic<int64_t> done{0};
    EXPECT_THROW(parallel_for(0, 400, 1,
                              [&](int64_t lo, int64_t hi) {
                                done += hi - lo;
                                if (lo == 0) fail<ValueError>("chunk at 0");
                              }),
                 ValueError);
    EXPECT_EQ(done.load(), 400);  // the other chunks still ran to completion
  }
}

TEST(Parallel, ExceptionMessageIsKept) {
  ThreadCountGuard guard;
  set_num_threads(2);
  try {
    parallel_for(0, 10, 1, [](int64_t, int64_t) { throw std::runtime_error("boom"); });
    ADD_FAILURE() << "no exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom");
  }
}

// Clears the interrupt flag however the test ends.
struct InterruptGuard {
  ~InterruptGuard() { clear_interrupt(); }
};

TEST(Parallel, InterruptStopsPollingChunksAndThrowsAfterTheRegion) {
  ThreadCountGuard guard;
  InterruptGuard clear;
  for (int threads : {1, 2, 4}) {
    set_num_threads(threads);
    std::atomic<int64_t> done{0};
    EXPECT_THROW_WITH(parallel_for(0, 1 << 20, 1,
                                   [&](int64_t lo, int64_t hi) {
                                     for (int64_t i = lo; i < hi && !interrupt_requested(); ++i) {
                                       if (i == lo + 10) request_interrupt();  // Ctrl-C mid-chunk
                                       ++done;
                                     }
                                   }),
                      Interrupted, "interrupted");
    EXPECT_LT(done.load(), int64_t{1} << 20);  // the chunks stopped at their next poll
    clear_interrupt();
    EXPECT_FALSE(run_chunks(0, 100, 1).empty());  // cleared: runs normally again
  }
}

TEST(Parallel, PendingInterruptThrowsBeforeAnyWork) {
  InterruptGuard clear;
  request_interrupt();
  int calls = 0;
  EXPECT_THROW(parallel_for(0, 10, 1, [&](int64_t, int64_t) { ++calls; }), Interrupted);
  EXPECT_EQ(calls, 0);
  EXPECT_THROW_WITH(check_interrupt("attention_reference"), Interrupted, "attention_reference: interrupted");
  clear_interrupt();
  EXPECT_FALSE(interrupt_requested());
  EXPECT_NO_THROW(check_interrupt("attention_reference"));
}

TEST(Parallel, InterruptedIsAQkvError) {
  InterruptGuard clear;
  request_interrupt();
  EXPECT_THROW(check_interrupt("op"), Error);
}

TEST(Parallel, SetAndGetNumThreadsRoundTrip) {
  ThreadCountGuard guard;
  for (int n : {1, 3, 2, 7}) {
    set_num_threads(n);
    EXPECT_EQ(get_num_threads(), n);
  }
  EXPECT_THROW(set_num_threads(0), ValueError);
  EXPECT_THROW(set_num_threads(-3), ValueError);
  EXPECT_EQ(get_num_threads(), 7);  // unchanged by the rejected calls
}

TEST(Parallel, SetNumThreadsAppliesToOtherThreads) {
  ThreadCountGuard guard;
  set_num_threads(3);
  int seen = 0, synced = 0;
  std::thread([&] {
    seen = get_num_threads();
    synced = detail::sync_runtime_threads();  // what gemm hands oneDNN
  }).join();
  EXPECT_EQ(seen, 3);
  EXPECT_EQ(synced, 3);
}

TEST(Parallel, ParseThreadCount) {
  using detail::parse_thread_count;
  EXPECT_EQ(parse_thread_count("4"), 4);
  EXPECT_EQ(parse_thread_count(" 3 "), 3);
  EXPECT_EQ(parse_thread_count("4,2"), 4);  // OMP_NUM_THREADS nesting list
  EXPECT_EQ(parse_thread_count("16"), 16);
  EXPECT_EQ(parse_thread_count(nullptr), 0);
  EXPECT_EQ(parse_thread_count(""), 0);
  EXPECT_EQ(parse_thread_count("0"), 0);
  EXPECT_EQ(parse_thread_count("-2"), 0);
  EXPECT_EQ(parse_thread_count("+2"), 0);
  EXPECT_EQ(parse_thread_count("abc"), 0);
  EXPECT_EQ(parse_thread_count("4x"), 0);
  EXPECT_EQ(parse_thread_count("2.5"), 0);
  EXPECT_EQ(parse_thread_count("99999"), 0);
  EXPECT_EQ(parse_thread_count("99999999999999999999"), 0);
}

TEST(Parallel, DefaultThreadCountPrecedence) {
  using detail::default_thread_count;
  EXPECT_EQ(default_thread_count("3", "5", 8), 3);
  EXPECT_EQ(default_thread_count(nullptr, "5", 8), 5);
  EXPECT_EQ(default_thread_count("bad", "5,1", 8), 5);
  EXPECT_EQ(default_thread_count("0", nullptr, 8), 8);
  EXPECT_EQ(default_thread_count(nullptr, nullptr, 8), 8);
  EXPECT_EQ(default_thread_count(nullptr, nullptr, 0), 1);
}

}  // namespace
}  // namespace qkv
