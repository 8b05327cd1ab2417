// run_isolated (src/io/isolated.h): the reply, the child's qkv errors, and every way
// a child can fail (signal, exit status, deadline, no reply) seen from the parent.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "io/keras_tf/isolated.h"

namespace qkv::io::detail {
namespace {

const Context kCtx{"test_op", "x.h5"};

IsolationOptions options(std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  IsolationOptions o;
  o.failure = "the reader failed on this file";
  o.hint = "the file is malformed";
  o.timeout = timeout;
  o.timeout_setting = "QKV_TEST_TIMEOUT";
  o.memory_bytes = size_t{1} << 30;
  return o;
}

std::string text(const std::shared_ptr<Storage>& s) {
  return std::string(reinterpret_cast<const char*>(s->data()), s->nbytes());
}

IsolatedReply reply_text(const std::string& s) {
  std::vector<std::byte> b(s.size());
  std::memcpy(b.data(), s.data(), s.size());
  return reply_of(std::move(b));
}

// The FormatError message of a failing run.
std::string failure_of(const IsolationOptions& o, const std::function<IsolatedReply()>& work) {
  try {
    run_isolated(kCtx, o, work);
  } catch (const FormatError& e) {
    return e.what();
  }
  ADD_FAILURE() << "run_isolated did not throw FormatError";
  return "";
}

TEST(IsolatedRun, ReturnsTheChildsBytesAlignedInOneStorage) {
  const auto out = run_isolated(kCtx, options(), [] { return reply_text("hello from the child"); });
  EXPECT_EQ(text(out), "hello from the child");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(out->data()) % Storage::kAlignment, 0u);
}

TEST(IsolatedRun, ConcatenatesChunksAndCarriesRepliesLargerThanThePipe) {
  const size_t n = size_t{24} << 20;  // past any pipe buffer: the parent must read while the child writes
  const auto out = run_isolated(kCtx, options(), [n] {
    auto big = std::make_shared<std::vector<std::byte>>(n);
    for (size_t i = 0; i < n; ++i) (*big)[i] = static_cast<std::byte>(i * 7 + 3);
    static const char tail[] = "end";
    IsolatedReply r;
    r.chunks = {std::span<const std::byte>(*big), std::as_bytes(std::span(tail, 3))};
    r.keep_alive = big;
    return r;
  });
  ASSERT_EQ(out->nbytes(), n + 3);
  for (size_t i = 0; i < n; i += 4093) ASSERT_EQ(out->data()[i], static_cast<std::byte>(i * 7 + 3)) << i;
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(out->data() + n), 3), "end");
}

TEST(IsolatedRun, EmptyReplyIsAnEmptyStorage) {
  const auto out = run_isolated(kCtx, options(), [] { return reply_of({}); });
  EXPECT_EQ(out->nbytes(), 0u);
}

TEST(IsolatedRun, ChildQkvErrorIsRethrownWithItsClassAndMessage) {
  try {
    run_isolated(kCtx, options(), []() -> IsolatedReply { fail<DTypeError>("test_op: x.h5: dataset 'w' is uint8"); });
    FAIL() << "no exception";
  } catch (const DTypeError& e) {
    EXPECT_STREQ(e.what(), "test_op: x.h5: dataset 'w' is uint8");
  }
  try {
    run_isolated(kCtx, options(), []() -> IsolatedReply { fail<IOError>("test_op: x.h5: cannot read"); });
    FAIL() << "no exception";
  } catch (const IOError& e) {
    EXPECT_STREQ(e.what(), "test_op: x.h5: cannot read");
  }
  // The base class stays the base class (not turned into one of its subclasses).
  try {
    run_isolated(kCtx, options(), []() -> IsolatedReply { throw Error("plain"); });
    FAIL() << "no exception";
  } catch (const FormatError&) {
    FAIL() << "became a FormatError";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(), "plain");
  }
}

TEST(IsolatedRun, OtherExceptionsBecomeFormatErrorsNamingThem) {
  const std::string m = failure_of(options(), []() -> IsolatedReply { throw std::runtime_error("boom"); });
  EXPECT_EQ(m, "test_op: x.h5: the reader failed on this file (reader process failed: boom); the file is malformed");
}

TEST(IsolatedRun, ChildKilledByASignalIsAFormatErrorNamingTheSignal) {
  const std::string m = failure_of(options(), []() -> IsolatedReply {
    ::raise(SIGSEGV);
    return reply_of({});
  });
  EXPECT_EQ(m,
            "test_op: x.h5: the reader failed on this file (reader process killed by SIGSEGV); the file is malformed");
}

TEST(IsolatedRun, AbortIsNotCaughtByHandlersOfTheParent) {
  // The parent's SIGABRT handler (as libFuzzer installs one) must not run in the child.
  struct sigaction old {};
  struct sigaction act {};
  act.sa_handler = [](int) { ::_exit(42); };
  ::sigaction(SIGABRT, &act, &old);
  const std::string m = failure_of(options(), []() -> IsolatedReply { std::abort(); });
  ::sigaction(SIGABRT, &old, nullptr);
  EXPECT_NE(m.find("(reader process killed by SIGABRT)"), std::string::npos) << m;
}

TEST(IsolatedRun, ChildExitingNonZeroIsAFormatErrorWithTheStatus) {
  const std::string m = failure_of(options(), []() -> IsolatedReply { ::_exit(7); });
  EXPECT_EQ(
      m, "test_op: x.h5: the reader failed on this file (reader process exited with status 7); the file is malformed");
}

TEST(IsolatedRun, ChildExitingWithoutAReplyIsAFormatError) {
  const std::string m = failure_of(options(), []() -> IsolatedReply { ::_exit(0); });
  EXPECT_NE(m.find("(reader process sent a truncated or garbled reply)"), std::string::npos) << m;
}

TEST(IsolatedRun, ChildPastTheDeadlineIsKilledAndReported) {
  // The child would sleep for a minute; the 200 ms deadline ends it.
  const std::string m = failure_of(options(std::chrono::milliseconds(200)), []() -> IsolatedReply {
    ::sleep(60);
    return reply_of({});
  });
  EXPECT_EQ(m,
            "test_op: x.h5: the reader failed on this file (reader process still running after 0.2 s, killed; "
            "QKV_TEST_TIMEOUT sets the limit); the file is malformed");
}

TEST(IsolatedRun, ForkLockIsHeldAroundForkOnly) {
  static std::recursive_mutex mutex;
  IsolationOptions o = options();
  int taken = 0;
  o.fork_lock = [&] {
    ++taken;
    return std::unique_lock<std::recursive_mutex>(mutex);
  };
  const auto out = run_isolated(kCtx, o, [] { return reply_text("ok"); });
  EXPECT_EQ(text(out), "ok");
  EXPECT_EQ(taken, 1);
  EXPECT_TRUE(mutex.try_lock());  // released again in the parent
  mutex.unlock();
}

TEST(IsolatedRun, MemoryLimitStopsARunawayChild) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "no RLIMIT_AS under AddressSanitizer";
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
  GTEST_SKIP() << "no RLIMIT_AS under AddressSanitizer";
#endif
#endif
  IsolationOptions o = options();
  o.memory_bytes = size_t{64} << 20;
  const std::string m = failure_of(o, []() -> IsolatedReply {
    std::vector<std::byte> big(size_t{1} << 30);  // 1 GiB > 64 MiB: bad_alloc in the child
    return reply_of(std::move(big));
  });
  EXPECT_NE(m.find("(reader process failed: std::bad_alloc)"), std::string::npos) << m;
}

}  // namespace
}  // namespace qkv::io::detail
