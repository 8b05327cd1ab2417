// Runs a reader on untrusted bytes in a fork()ed child process (not public API), for
// libraries that may crash, hang or exhaust memory on hostile input (libhdf5 1.10.8:
// docs/formats-keras-tf.md). The child sends back bytes; whatever happens to it, the caller
// gets those bytes, the qkv::Error the child threw, or a FormatError.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "io/io_internal.h"

namespace qkv::io::detail {

// What the child sends back: `chunks` one after the other. `keep_alive` owns what
// they point into (so a reader's tensors go out without a copy into one buffer).
struct IsolatedReply {
  std::vector<std::span<const std::byte>> chunks;
  std::shared_ptr<void> keep_alive;
};
// A reply of one owned byte buffer.
IsolatedReply reply_of(std::vector<std::byte> bytes);

struct IsolationOptions {
  // The FormatError text when the child fails, e.g. "libhdf5 failed on this file";
  // the reason follows in parentheses, then "; " + `hint` when not empty.
  std::string failure;
  std::string hint;
  // The child is killed after this long. `timeout_setting` names what sets it (an
  // environment variable) in the timeout message; may be empty.
  std::chrono::milliseconds timeout{std::chrono::seconds(120)};
  std::string timeout_setting;
  // Address space the child may add to what it inherits (RLIMIT_AS; not set under
  // AddressSanitizer, which reserves terabytes of address space up front). 0: no limit.
  size_t memory_bytes = 0;
  // Taken around fork() when set, so that no other thread is inside the library the
  // child calls (its locks would stay locked in the child forever). The child must
  // not take it again: a mutex locked at fork() stays locked in the child.
  std::function<std::unique_lock<std::recursive_mutex>()> fork_lock;
};

// Runs `work` in a child process and returns its reply as one 64-byte aligned storage.
// A qkv::Error thrown by `work` is thrown here again (same class, same message); a
// child killed by a signal, exiting non-zero, past its deadline or sending a
// truncated reply is a FormatError "<op>: <source>: <failure> (<reason>)[; <hint>]".
// `work` must not use OpenMP or other thread pools: the child has no threads but its own.
std::shared_ptr<Storage> run_isolated(const Context& ctx, const IsolationOptions& options,
                                      const std::function<IsolatedReply()>& work);

}  // namespace qkv::io::detail
