// run_isolated (io/isolated.h): fork(), the child runs the reader and writes
//   "QKVI", u8 status (0 reply, 1 error), u8 error class, u64 length, length bytes
// (the reply, or the error message) into a pipe and _exit()s; the parent reads
// with poll() until a deadline, then reaps the child and judges how it ended.
#include "io/keras_tf/isolated.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <new>
#include <optional>

#if defined(__SANITIZE_ADDRESS__)
#define QKV_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define QKV_ASAN 1
#endif
#endif
#if defined(QKV_ASAN) && __has_include(<sanitizer/common_interface_defs.h>)
#include <sanitizer/common_interface_defs.h>
#define QKV_SANITIZER_API 1
#endif

namespace qkv::io::detail {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::array<char, 4> kMagic{'Q', 'K', 'V', 'I'};
constexpr size_t kHeaderBytes = 14;
enum class Status : uint8_t { reply = 0, error = 1 };
// The qkv error classes (qkv/error.h) a child's exception travels as.
enum class ErrorKind : uint8_t { error, shape, value, dtype, index, format, io, other };
constexpr int kChildWriteFailed = 3;

// ---- child --------------------------------------------------------------------------

bool write_all(int fd, const void* data, size_t n) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

bool send(int fd, Status status, ErrorKind kind, std::span<const std::span<const std::byte>> chunks) {
  uint64_t length = 0;
  for (const auto& c : chunks) length += c.size();
  std::array<unsigned char, kHeaderBytes> header{};
  std::memcpy(header.data(), kMagic.data(), kMagic.size());
  header[4] = static_cast<unsigned char>(status);
  header[5] = static_cast<unsigned char>(kind);
  for (size_t i = 0; i < 8; ++i) header[6 + i] = static_cast<unsigned char>(length >> (8 * i));
  if (!write_all(fd, header.data(), header.size())) return false;
  for (const auto& c : chunks) {
    if (!write_all(fd, c.data(), c.size())) return false;
  }
  return true;
}

// The exception being handled as a class and a message.
std::pair<ErrorKind, std::string> current_error() {
  try {
    throw;
  } catch (const FormatError& e) {
    return {ErrorKind::format, e.what()};
  } catch (const IOError& e) {
    return {ErrorKind::io, e.what()};
  } catch (const ShapeError& e) {
    return {ErrorKind::shape, e.what()};
  } catch (const ValueError& e) {
    return {ErrorKind::value, e.what()};
  } catch (const DTypeError& e) {
    return {ErrorKind::dtype, e.what()};
  } catch (const IndexError& e) {
    return {ErrorKind::index, e.what()};
  } catch (const Error& e) {
    return {ErrorKind::error, e.what()};
  } catch (const std::exception& e) {
    return {ErrorKind::other, e.what()};
  } catch (...) {
    return {ErrorKind::other, "an exception that is not a std::exception"};
  }
}

#ifndef QKV_ASAN  // no RLIMIT_AS under ASan, which reserves terabytes of address space
// The child's size in bytes of address space (the first field of /proc/self/statm).
// Read with open/read: no stdio in a child forked from a threaded process.
size_t address_space_in_use() {
  const int fd = ::open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[64] = {};
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  return std::strtoull(buf, nullptr, 10) * static_cast<size_t>(::sysconf(_SC_PAGESIZE));
}

// Inherited mappings count against RLIMIT_AS too, so the limit is what the child
// already has plus `extra`; an existing lower limit stays.
void limit_address_space(size_t extra) {
  rlimit current{};
  if (::getrlimit(RLIMIT_AS, &current) != 0) return;
  const size_t in_use = address_space_in_use();
  rlim_t want = in_use > SIZE_MAX - extra ? RLIM_INFINITY : static_cast<rlim_t>(in_use + extra);
  if (current.rlim_cur != RLIM_INFINITY && current.rlim_cur < want) want = current.rlim_cur;
  const rlimit limit{want, current.rlim_max};
  ::setrlimit(RLIMIT_AS, &limit);
}
#endif

void prepare_child(const IsolationOptions& options) {
  // Writing to a pipe the parent has closed (it gave up waiting) must end in an
  // error from write(), not in SIGPIPE.
  ::signal(SIGPIPE, SIG_IGN);
  // A fault ends the child by its signal, which the parent names, not in handlers
  // inherited from the parent (a sanitizer's report of the parent, a fuzzer saving
  // its input as a crash).
  sigset_t faults;
  sigemptyset(&faults);
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS}) {
    ::signal(sig, SIG_DFL);
    sigaddset(&faults, sig);
  }
  ::sigprocmask(SIG_UNBLOCK, &faults, nullptr);
#ifdef QKV_SANITIZER_API
  // A sanitizer error in the child (libhdf5's memcpy out of bounds) must not run
  // the parent's death callbacks (libFuzzer would save the input as a crash).
  __sanitizer_set_death_callback(nullptr);
#endif
#ifndef QKV_ASAN
  if (options.memory_bytes > 0) limit_address_space(options.memory_bytes);
#else
  (void)options;
#endif
}

[[noreturn]] void child_main(int fd, const IsolationOptions& options, const std::function<IsolatedReply()>& work) {
  prepare_child(options);
  bool sent = false;
  try {
    // Never freed: _exit() follows, and freeing a large reply only costs time.
    const auto* reply = new IsolatedReply(work());
    sent = send(fd, Status::reply, ErrorKind::error, reply->chunks);
  } catch (...) {
    const auto [kind, message] = current_error();
    const std::span<const std::byte> text(reinterpret_cast<const std::byte*>(message.data()), message.size());
    sent = send(fd, Status::error, kind, std::span(&text, 1));
  }
  // _exit: no atexit handlers or static destructors (they belong to the parent's
  // state), no stdio flush of the parent's buffers, no leak check.
  ::_exit(sent ? 0 : kChildWriteFailed);
}

// ---- parent -------------------------------------------------------------------------

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { close(); }
  int get() const { return fd_; }
  void close() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

// Owns the child: killed and reaped on every path out of run_isolated.
class Child {
 public:
  explicit Child(pid_t pid) : pid_(pid) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() {
    if (pid_ > 0) {
      kill();
      wait();
    }
  }
  void kill() const { ::kill(pid_, SIGKILL); }
  // The wait status, or nullopt when it cannot be known (SIGCHLD ignored by the
  // application: the kernel reaps children itself).
  std::optional<int> wait() {
    int status = 0;
    pid_t r = -1;
    do {
      r = ::waitpid(pid_, &status, 0);
    } while (r < 0 && errno == EINTR);
    pid_ = -1;
    if (r < 0) return std::nullopt;
    return status;
  }

 private:
  pid_t pid_;
};

// Reads up to `n` bytes before `deadline`; fewer at end of file. Sets `timed_out`.
size_t read_until(int fd, std::byte* out, size_t n, Clock::time_point deadline, bool& timed_out, const Context& ctx) {
  size_t got = 0;
  while (got < n) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd pfd{fd, POLLIN, 0};
    const int ready = ::poll(&pfd, 1, static_cast<int>(std::min<int64_t>(left, INT_MAX)));
    if (ready < 0 && errno != EINTR) fail_at<IOError>(ctx, "poll on the reader process's pipe: ", std::strerror(errno));
    if (ready <= 0) continue;
    const ssize_t k = ::read(fd, out + got, n - got);
    if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (k < 0) fail_at<IOError>(ctx, "reading the reader process's pipe: ", std::strerror(errno));
    if (k == 0) break;
    got += static_cast<size_t>(k);
  }
  return got;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

[[noreturn]] void fail_child(const Context& ctx, const IsolationOptions& options, const std::string& reason) {
  fail_at(ctx, options.failure, " (reader process ", reason, ")", options.hint.empty() ? "" : "; ", options.hint);
}

[[noreturn]] void rethrow(ErrorKind kind, const std::string& message, const Context& ctx,
                          const IsolationOptions& options) {
  switch (kind) {
    case ErrorKind::error: throw Error(message);
    case ErrorKind::shape: throw ShapeError(message);
    case ErrorKind::value: throw ValueError(message);
    case ErrorKind::dtype: throw DTypeError(message);
    case ErrorKind::index: throw IndexError(message);
    case ErrorKind::format: throw FormatError(message);
    case ErrorKind::io: throw IOError(message);
    case ErrorKind::other: fail_child(ctx, options, "failed: " + message);
  }
  fail_child(ctx, options, "sent an error of unknown class " + std::to_string(static_cast<int>(kind)));
}

// No honest reply is larger than the machine's memory.
uint64_t max_reply_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : uint64_t{1} << 40;
}

std::string seconds_text(std::chrono::milliseconds t) {
  return qkv::detail::concat(static_cast<double>(t.count()) / 1000.0, " s");
}

}  // namespace

IsolatedReply reply_of(std::vector<std::byte> bytes) {
  auto owned = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  return {{std::span<const std::byte>(*owned)}, owned};
}

std::shared_ptr<Storage> run_isolated(const Context& ctx, const IsolationOptions& options,
                                      const std::function<IsolatedReply()>& work) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) fail_at<IOError>(ctx, "cannot create a pipe: ", std::strerror(errno));
  Fd read_end(fds[0]), write_end(fds[1]);
  ::fcntl(read_end.get(), F_SETPIPE_SZ, 1 << 20);  // fewer wake-ups for large replies; best effort
  pid_t pid = -1;
  {
    std::unique_lock<std::recursive_mutex> lock;
    if (options.fork_lock) lock = options.fork_lock();
    pid = ::fork();
    if (pid == 0) {
      read_end.close();
      child_main(write_end.get(), options, work);
    }
    // Closed before the lock goes: a child forked later by another thread must not
    // hold this write end open, or the end of file below would wait for it.
    write_end.close();
  }
  if (pid < 0) fail_at<IOError>(ctx, "cannot start a reader process: fork: ", std::strerror(errno));
  Child child(pid);

  const auto deadline = Clock::now() + options.timeout;
  bool timed_out = false;
  std::array<std::byte, kHeaderBytes> header{};
  const bool header_ok =
      read_until(read_end.get(), header.data(), header.size(), deadline, timed_out, ctx) == header.size() &&
      std::memcmp(header.data(), kMagic.data(), kMagic.size()) == 0 &&
      static_cast<uint8_t>(header[4]) <= static_cast<uint8_t>(Status::error);
  uint64_t length = 0;
  for (size_t i = 0; i < 8; ++i) length |= static_cast<uint64_t>(header[6 + i]) << (8 * i);
  std::shared_ptr<Storage> body;
  bool complete = false;
  if (header_ok && length <= max_reply_bytes()) {
    body = Storage::allocate(static_cast<size_t>(length));
    if (read_until(read_end.get(), body->data(), body->nbytes(), deadline, timed_out, ctx) == length) {
      std::byte extra{};  // the end of file, which comes when the child has exited
      complete = read_until(read_end.get(), &extra, 1, deadline, timed_out, ctx) == 0 && !timed_out;
    }
  }
  if (timed_out) {
    child.kill();
    child.wait();
    fail_child(ctx, options,
               "still running after " + seconds_text(options.timeout) + ", killed" +
                   (options.timeout_setting.empty() ? "" : "; " + options.timeout_setting + " sets the limit"));
  }
  const std::optional<int> status = child.wait();
  if (status && WIFSIGNALED(*status)) fail_child(ctx, options, "killed by " + signal_name(WTERMSIG(*status)));
  if (status && WIFEXITED(*status) && WEXITSTATUS(*status) != 0) {
    fail_child(ctx, options, "exited with status " + std::to_string(WEXITSTATUS(*status)));
  }
  if (!complete) fail_child(ctx, options, "sent a truncated or garbled reply");
  if (static_cast<Status>(header[4]) == Status::error) {
    rethrow(static_cast<ErrorKind>(header[5]), std::string(reinterpret_cast<const char*>(body->data()), body->nbytes()),
            ctx, options);
  }
  return body;
}

}  // namespace qkv::io::detail
