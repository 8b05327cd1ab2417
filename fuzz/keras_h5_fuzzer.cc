// libFuzzer target: qkv::io::parse_keras_h5 on arbitrary bytes. libhdf5 runs in the
// reader process (src/io/isolated.h), so its crashes, endless loops and runaway
// allocations on hostile files (docs/formats-keras-tf.md) must end in a FormatError here; so
// must every other malformed input. Anything else in this process is a finding.
// Seeds: fuzz/corpus/keras_h5 (real Keras files).
//
// Coverage: qkv's layout walk runs in the reader process, whose coverage counters
// are its own copy; share_coverage_counters() makes the counter pages shared memory
// so that what the child covers reaches libFuzzer here.
//
// At exit the target prints how the inputs ended ("keras_h5 outcomes: ..."): how
// many the readers rejected cleanly and how many reader processes libhdf5 took down
// (by signal, exit status or deadline). Faults inside the reader process cannot be
// told apart from faults of qkv's layout walk there; its stderr shows the report.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "qkv/io_keras.h"

// For the reader process, which inherits them (the parent no longer calls libhdf5):
// libhdf5 sizes some allocations from file metadata and may ask malloc for ~2^64
// bytes; outside ASan malloc returns null and libhdf5 reports an error, and
// allocator_may_return_null=1 makes ASan do the same. max_allocation_size_mb keeps
// single allocations under libFuzzer's -malloc_limit_mb (default: -rss_limit_mb=2048),
// whose hook would otherwise save the input as an "oom" from inside the child. There
// is no RLIMIT_AS under ASan; the child's deadline (QKV_HDF5_TIMEOUT_S) bounds it.
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1:max_allocation_size_mb=2000"; }

namespace {

// The linker's bounds of the inline 8-bit coverage counters (-fsanitize=fuzzer),
// __start___sancov_cntrs / __stop___sancov_cntrs. Read through inline assembly: a C++
// declaration of those names would clash with the coverage pass's own in this file,
// which then renames its copy and registers no counters with libFuzzer at all.
uint8_t* counters_begin() {
  uint8_t* p = nullptr;
  asm("leaq __start___sancov_cntrs(%%rip), %0" : "=r"(p));
  return p;
}
uint8_t* counters_end() {
  uint8_t* p = nullptr;
  asm("leaq __stop___sancov_cntrs(%%rip), %0" : "=r"(p));
  return p;
}

// The bytes that share the counters' first and last pages (other sections: in this
// link ASan's global descriptors and the PC table, both written only at start-up).
// They become shared with the children too, so they are checked for changes.
struct Neighbours {
  uint8_t* head = nullptr;
  std::vector<uint8_t> head_bytes;
  uint8_t* tail = nullptr;
  std::vector<uint8_t> tail_bytes;
};
// Byte copies and compares that ASan does not check: the pages hold other globals'
// redzones (volatile keeps the loops from becoming intercepted memcpy/memcmp calls).
__attribute__((no_sanitize("address"))) void copy_bytes(uint8_t* to, const uint8_t* from, size_t n) {
  for (size_t i = 0; i < n; ++i) static_cast<volatile uint8_t*>(to)[i] = static_cast<const volatile uint8_t*>(from)[i];
}
__attribute__((no_sanitize("address"))) bool same_bytes(const uint8_t* a, const uint8_t* b, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (static_cast<const volatile uint8_t*>(a)[i] != static_cast<const volatile uint8_t*>(b)[i]) return false;
  }
  return true;
}

Neighbours& neighbours() {
  static auto* n = new Neighbours();
  return *n;
}

void share_coverage_counters() {
  uint8_t* const start = counters_begin();
  uint8_t* const stop = counters_end();
  if (stop <= start) return;
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t begin = reinterpret_cast<uintptr_t>(start) & ~(page - 1);
  const uintptr_t end = (reinterpret_cast<uintptr_t>(stop) + page - 1) & ~(page - 1);
  auto* first = reinterpret_cast<uint8_t*>(begin);
  std::vector<uint8_t> saved(end - begin);
  copy_bytes(saved.data(), first, saved.size());
  // Same addresses (the instrumented code and libFuzzer hold them), now MAP_SHARED:
  // a fork()ed child writes into the same pages.
  if (mmap(first, end - begin, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS | MAP_FIXED, -1, 0) == MAP_FAILED) {
    std::perror("keras_h5_fuzzer: mmap of the coverage counters");
    std::abort();
  }
  copy_bytes(first, saved.data(), saved.size());
  Neighbours& n = neighbours();
  n.head = first;
  n.head_bytes.assign(saved.begin(), saved.begin() + (start - first));
  n.tail = stop;
  n.tail_bytes.assign(saved.end() - (reinterpret_cast<uint8_t*>(end) - stop), saved.end());
}

void check_neighbours() {
  const Neighbours& n = neighbours();
  if (n.head == nullptr) return;
  if (!same_bytes(n.head, n.head_bytes.data(), n.head_bytes.size()) ||
      !same_bytes(n.tail, n.tail_bytes.data(), n.tail_bytes.size())) {
    std::fprintf(stderr, "keras_h5_fuzzer: data next to the shared coverage counters changed\n");
    std::abort();
  }
}

std::map<std::string, size_t>& outcomes() {
  static auto* counts = new std::map<std::string, size_t>();
  return *counts;
}

// "reader process killed by SIGSEGV" etc. from the message, else "rejected".
std::string outcome_of(const std::string& message) {
  const std::string marker = "(reader process ";
  const size_t at = message.find(marker);
  if (at == std::string::npos) return "rejected (qkv::Error)";
  std::string reason = message.substr(at + marker.size(), message.find(')', at) - at - marker.size());
  if (reason.starts_with("still running")) return "reader process timed out";
  if (reason.starts_with("failed: ")) return "reader process threw a non-qkv exception";
  return "reader process " + reason;
}

void print_outcomes() {
  std::string line = "keras_h5 outcomes:";
  for (const auto& [what, n] : outcomes()) line += " " + what + " = " + std::to_string(n) + ";";
  std::fprintf(stderr, "%s\n", line.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Under scripts/fuzz.sh's -timeout=10, so that a hung libhdf5 is a killed child,
  // not a libFuzzer timeout of this process.
  setenv("QKV_HDF5_TIMEOUT_S", "5", 0);
  share_coverage_counters();
  std::atexit(print_outcomes);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const qkv::io::WeightFile w = qkv::io::parse_keras_h5(std::as_bytes(std::span(data, size)), "fuzz.h5");
    volatile double sink = 0;
    for (const auto& [name, t] : w.tensors) {
      for (double v : t.to_vector<double>()) sink = sink + v;
    }
    ++outcomes()["accepted"];
  } catch (const qkv::Error& e) {
    ++outcomes()[outcome_of(e.what())];
  }
  check_neighbours();
  return 0;
}
