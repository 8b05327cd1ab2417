// Ctrl-C during a qkv call from Python: KeyboardInterrupt within a fraction of a second.
//
// qkv computes with the GIL released, and Python only acts on SIGINT between
// bytecodes of the main thread: its C handler records the signal, and the
// Python-level handler (KeyboardInterrupt) runs when the call has returned, seconds
// or minutes later. Two designs were weighed:
//  - a watcher thread that takes the GIL and runs PyErr_CheckSignals now and then:
//    it cannot work, as CPython runs signal handlers on the main thread only (the
//    call on another thread returns 0), and it would poll even when nothing happens;
//  - (chosen) a C-level SIGINT handler installed for the duration of the call: it sets
//    qkv's interrupt flag (qkv/parallel.h; a lock-free atomic store, async-signal-safe)
//    and then calls the handler it replaced (Python's), so Python records the signal
//    exactly as without qkv. The kernels poll the flag between work items and stop
//    with qkv::Interrupted, which bind_errors turns into PyErr_CheckSignals(): the
//    Python-level handler runs (KeyboardInterrupt by default, or the user's own from
//    signal.signal; if that one returns, KeyboardInterrupt is raised anyway, as the
//    work was abandoned).
// The handler is installed only over a C function (Python's handler): under SIG_DFL
// the signal kills the process as asked, under SIG_IGN it is ignored. Nested and
// concurrent calls share one installation (a count under a mutex); the flag is
// cleared when the first of them starts, so an old Ctrl-C never stops a new call, and
// the old handler comes back when the last one ends (unless someone replaced ours).
#pragma once

#include <nanobind/nanobind.h>

namespace qkv::python {

// Installs the chaining SIGINT handler for its lifetime (see above).
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;
};

// What every binding uses around C++ work: Ctrl-C is watched, then the GIL is
// released (destroyed in reverse: the GIL is taken back first).
class InterruptibleRelease {
 public:
  InterruptibleRelease() = default;

 private:
  InterruptScope scope_;
  nanobind::gil_scoped_release release_;
};

}  // namespace qkv::python
