// Internals of parallel.cc shared with the gemm wrapper and the tests.
#pragma once

namespace qkv::detail {

// A thread-count environment value: a positive decimal integer, optionally
// followed by a comma list as OMP_NUM_THREADS allows ("4,2": 4). Returns 0 when
// `value` is null, empty, malformed, non-positive or absurdly large (> 4096).
int parse_thread_count(const char* value);

// The initial thread count: QKV_NUM_THREADS's value, else OMP_NUM_THREADS's,
// else `cores` (at least 1). Arguments are the raw environment values (or null).
int default_thread_count(const char* qkv_value, const char* omp_value, int cores);

// Makes the OpenMP runtime of the calling thread use the threads a oneDNN call
// made here should use, and returns that count: get_num_threads(), or 1 inside
// a parallel region (oneDNN never nests). oneDNN (OMP runtime) sizes primitives
// and their regions with omp_get_max_threads(), a per-thread (per-task) setting,
// so gemm calls this on each call to follow set_num_threads from any thread.
int sync_runtime_threads();

// Sets the calling thread's OpenMP thread count for the object's lifetime, e.g.
// to create single-threaded oneDNN primitives that run inside parallel_for.
class ScopedRuntimeThreads {
 public:
  explicit ScopedRuntimeThreads(int n);
  ~ScopedRuntimeThreads();
  ScopedRuntimeThreads(const ScopedRuntimeThreads&) = delete;
  ScopedRuntimeThreads& operator=(const ScopedRuntimeThreads&) = delete;

 private:
  int previous_;
};

// True inside a parallel region (where oneDNN and parallel_for run serially).
bool in_parallel_region();

}  // namespace qkv::detail
