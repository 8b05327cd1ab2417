// parallel_for and the thread count, over OpenMP. This is the only file of qkv
// with `#pragma omp`: every other kernel goes through parallel_for, so a new
// threading runtime is one new file.
#include "qkv/parallel.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>

#include "kernels/cpu/parallel_internal.h"
#include "qkv/error.h"

namespace qkv {
namespace detail {

namespace {

constexpr long kMaxThreads = 4096;

// The configured count; 0 until first read, so the environment is read lazily
// (not during static initialisation, where another TU's getenv order is unknown).
std::atomic<int> g_num_threads{0};

int initial_thread_count() {
  const int cores = std::max(omp_get_num_procs(), static_cast<int>(std::thread::hardware_concurrency()));
  return default_thread_count(std::getenv("QKV_NUM_THREADS"), std::getenv("OMP_NUM_THREADS"), cores);
}

}  // namespace

int parse_thread_count(const char* value) {
  if (value == nullptr) return 0;
  while (*value == ' ' || *value == '\t') ++value;
  if (*value < '0' || *value > '9') return 0;  // also rejects signs and empty strings
  errno = 0;
  char* end = nullptr;
  const long n = std::strtol(value, &end, 10);
  if (errno != 0 || n < 1 || n > kMaxThreads) return 0;
  while (*end == ' ' || *end == '\t') ++end;
  if (*end != '\0' && *end != ',') return 0;  // "4x" is malformed; "4,2" means 4 at the outer level
  return static_cast<int>(n);
}

int default_thread_count(const char* qkv_value, const char* omp_value, int cores) {
  if (const int n = parse_thread_count(qkv_value); n > 0) return n;
  if (const int n = parse_thread_count(omp_value); n > 0) return n;
  return std::max(cores, 1);
}

int sync_runtime_threads() {
  // Inside a region omp_set_num_threads only changes this task's setting for
  // regions nested in it, which is what we want: oneDNN sees 1 thread.
  const int n = in_parallel_region() ? 1 : get_num_threads();
  if (omp_get_max_threads() != n) omp_set_num_threads(n);
  return n;
}

ScopedRuntimeThreads::ScopedRuntimeThreads(int n) : previous_(omp_get_max_threads()) { omp_set_num_threads(n); }

ScopedRuntimeThreads::~ScopedRuntimeThreads() { omp_set_num_threads(previous_); }

bool in_parallel_region() { return omp_in_parallel() || omp_get_level() > 0; }

}  // namespace detail

int get_num_threads() {
  int n = detail::g_num_threads.load(std::memory_order_relaxed);
  if (n > 0) return n;
  int expected = 0;
  n = detail::initial_thread_count();
  if (!detail::g_num_threads.compare_exchange_strong(expected, n)) return expected;
  return n;
}

void set_num_threads(int n) {
  if (n < 1) fail<ValueError>("set_num_threads: expected n >= 1, got ", n);
  detail::g_num_threads.store(n, std::memory_order_relaxed);
  if (!omp_in_parallel()) omp_set_num_threads(n);
}

namespace {

// Chunk t of `chunks` near-equal contiguous parts of [begin, begin + n).
// Written without n * t, which could overflow for huge n.
void chunk_bounds(int64_t begin, int64_t n, int64_t chunks, int64_t t, int64_t* lo, int64_t* hi) {
  const int64_t q = n / chunks, r = n % chunks;
  *lo = begin + t * q + std::min(t, r);
  *hi = *lo + q + (t < r ? 1 : 0);
}

}  // namespace

namespace {

// Lock-free, so that a signal handler may store to it (static_assert below).
std::atomic<bool> g_interrupt{false};
static_assert(std::atomic<bool>::is_always_lock_free, "request_interrupt must be async-signal-safe");

}  // namespace

void request_interrupt() noexcept { g_interrupt.store(true, std::memory_order_relaxed); }

bool interrupt_requested() noexcept { return g_interrupt.load(std::memory_order_relaxed); }

void clear_interrupt() noexcept { g_interrupt.store(false, std::memory_order_relaxed); }

void check_interrupt(const char* op) {
  if (interrupt_requested()) fail<Interrupted>(op, ": interrupted");
}

void parallel_for(int64_t begin, int64_t end, int64_t grain, const std::function<void(int64_t, int64_t)>& fn) {
  if (end <= begin) return;
  check_interrupt("parallel_for");
  const int64_t n = end - begin;
  grain = std::max<int64_t>(grain, 1);
  // n / grain (floor) so every chunk gets at least `grain` items.
  const int64_t chunks = std::min<int64_t>(get_num_threads(), n / grain);
  if (chunks <= 1 || detail::in_parallel_region()) {
    fn(begin, end);
    check_interrupt("parallel_for");  // fn may have returned early on the flag
    return;
  }
  std::exception_ptr first_error;
  std::mutex error_mutex;
#pragma omp parallel num_threads(static_cast <int>(chunks))
  {
    // The runtime may grant fewer threads than asked: split by what we got.
    const int64_t team = omp_get_num_threads();
    int64_t lo = 0, hi = 0;
    chunk_bounds(begin, n, team, omp_get_thread_num(), &lo, &hi);
    try {
      if (lo < hi) fn(lo, hi);
    } catch (...) {
      // An exception must not leave an OpenMP region (std::terminate): keep the first.
      const std::lock_guard<std::mutex> lock(error_mutex);
      if (!first_error) first_error = std::current_exception();
    }
  }
  if (first_error) std::rethrow_exception(first_error);
  check_interrupt("parallel_for");
}

}  // namespace qkv
