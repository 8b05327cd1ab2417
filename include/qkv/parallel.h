// The one way qkv runs work on several threads (OpenMP underneath; oneDNN, which
// qkv::gemm uses, shares the same OpenMP runtime and thread count).
#pragma once

#include <cstdint>
#include <functional>

namespace qkv {

// Threads used by parallel_for and gemm. Initially QKV_NUM_THREADS, else
// OMP_NUM_THREADS (its first entry), else the number of cores; malformed or
// non-positive values are ignored.
int get_num_threads();
// Sets the thread count for later parallel_for and gemm calls (n >= 1;
// ValueError otherwise). Global: affects every thread of the process.
void set_num_threads(int n);

// Splits [begin, end) into at most get_num_threads() contiguous chunks of at
// least `grain` items (grain < 1 counts as 1) and calls fn(chunk_begin, chunk_end)
// once per chunk; together the chunks cover every index exactly once.
// Runs fn(begin, end) inline when the range has fewer than 2 * grain items, when
// one thread is configured, or when already inside a parallel region (nesting
// never oversubscribes). The first exception thrown by fn is rethrown in the
// caller after every chunk has finished.
// Also stops early on an interrupt (below): chunks not yet started are skipped,
// and Interrupted is thrown once every running chunk has returned.
void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

// ---- Interrupts (Ctrl-C) --------------------------------------------------------------
// One process-wide flag: a SIGINT handler (the CLI's, the Python binding's) sets it,
// long-running work polls it between work items and stops with qkv::Interrupted.
// Polling is one relaxed atomic load, cheap enough for every row of a loop.

// Sets the flag. Async-signal-safe (a lock-free atomic store): call it from a handler.
void request_interrupt() noexcept;
// Whether an interrupt is pending. Loops inside a parallel_for chunk return early
// when it is; parallel_for then throws.
bool interrupt_requested() noexcept;
// Clears the flag (before a new top-level call: an old Ctrl-C must not stop it).
void clear_interrupt() noexcept;
// Throws Interrupted ("<op>: interrupted") when the flag is set; for serial loops.
void check_interrupt(const char* op);

}  // namespace qkv
