// Checked element and byte counts, the allocation limit and its messages (qkv/size.h).
#include "qkv/size.h"

#include "qkv/out_of_memory.h"

#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <limits>

namespace qkv {

namespace {

thread_local const AllocationScope* innermost_scope = nullptr;
// The text of the innermost scope the last exception unwound on this thread (empty:
// none), for bad_alloc_message; a new scope forgets it, so it never names later work.
thread_local std::string unwound_text;

enum class LimitSource { physical, env, api };

struct EnvLimit {
  size_t bytes = std::numeric_limits<size_t>::max();
  LimitSource source = LimitSource::physical;
  std::string error;  // set when QKV_MAX_ALLOC_BYTES does not parse
};

// "8589934592", "8G", "512m": bytes, or nullopt.
std::optional<size_t> parse_bytes(std::string_view text) {
  size_t value = 0, i = 0;
  for (; i < text.size() && std::isdigit(static_cast<unsigned char>(text[i])); ++i) {
    if (__builtin_mul_overflow(value, size_t{10}, &value) ||
        __builtin_add_overflow(value, static_cast<size_t>(text[i] - '0'), &value)) {
      return std::nullopt;
    }
  }
  if (i == 0) return std::nullopt;
  if (i + 1 == text.size()) {
    const char* units = "kmgt";
    const char* u = std::strchr(units, std::tolower(static_cast<unsigned char>(text[i])));
    if (u == nullptr || *u == '\0') return std::nullopt;
    for (const char* p = units; p <= u; ++p) {
      if (__builtin_mul_overflow(value, size_t{1024}, &value)) return std::nullopt;
    }
  } else if (i != text.size()) {
    return std::nullopt;
  }
  if (value == 0) return std::nullopt;
  return value;
}

// The container's memory limit (cgroup v2, then v1), when it has a finite one.
std::optional<size_t> cgroup_limit() {
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    std::FILE* f = std::fopen(path, "r");
    if (f == nullptr) continue;
    unsigned long long bytes = 0;
    const bool number = std::fscanf(f, "%llu", &bytes) == 1;  // "max" (no limit) does not parse
    std::fclose(f);
    if (number) return static_cast<size_t>(bytes);
  }
  return std::nullopt;
}

EnvLimit read_env_limit() {
  EnvLimit limit;
  if (const char* env = std::getenv("QKV_MAX_ALLOC_BYTES"); env != nullptr && *env != '\0') {
    if (auto bytes = parse_bytes(env)) {
      limit.bytes = *bytes;
      limit.source = LimitSource::env;
    } else {
      limit.error = std::string("QKV_MAX_ALLOC_BYTES='") + env +
                    "' is not a positive byte count (digits, optionally followed by K, M, G or T)";
    }
    return limit;
  }
  const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
  size_t bytes = 0;
  if (pages > 0 && page > 0 && !__builtin_mul_overflow(static_cast<size_t>(pages), static_cast<size_t>(page), &bytes)) {
    limit.bytes = bytes;
  }
  // A container limit below the physical memory is what an OOM kill would enforce.
  if (const auto cgroup = cgroup_limit(); cgroup && *cgroup > 0 && *cgroup < limit.bytes) limit.bytes = *cgroup;
  return limit;
}

const EnvLimit& env_limit() {
  static const EnvLimit limit = read_env_limit();  // read once
  return limit;
}

std::atomic<size_t> api_limit{0};  // 0: none set

// "17179869184 bytes (16.0 GiB)".
std::string bytes_str(size_t n) {
  std::string s = std::to_string(n) + " bytes";
  char buf[32];
  if (n >= (size_t{1} << 30)) {
    std::snprintf(buf, sizeof buf, " (%.1f GiB)", static_cast<double>(n) / static_cast<double>(size_t{1} << 30));
    s += buf;
  } else if (n >= (size_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, " (%.1f MiB)", static_cast<double>(n) / static_cast<double>(size_t{1} << 20));
    s += buf;
  }
  return s;
}

// "the limit QKV_MAX_ALLOC_BYTES=N" / "physical memory (N bytes; ...)".
std::string limit_str(size_t limit) {
  if (api_limit.load(std::memory_order_relaxed) != 0) {
    return "the limit of " + std::to_string(limit) + " bytes set by set_max_alloc_bytes";
  }
  if (env_limit().source == LimitSource::env) return "QKV_MAX_ALLOC_BYTES=" + std::to_string(limit);
  return "the memory of this machine (" + bytes_str(limit) + "; QKV_MAX_ALLOC_BYTES overrides)";
}

[[noreturn]] void fail_over_limit(size_t nbytes, std::string_view what, std::string_view fallback_op) {
  fail<OutOfMemoryError>(AllocationScope::describe(fallback_op), ": ", what, " needs ", bytes_str(nbytes),
                         ", more than ", limit_str(max_alloc_bytes()));
}

std::string shapes_str(std::span<const std::vector<int64_t>> shapes) {
  std::string s;
  for (size_t i = 0; i < shapes.size(); ++i) s += (i ? ", " : "") + shape_str(shapes[i]);
  return s;
}

// "operands [2, 3], [3, 4]"; names listed one per input ("q, k, v") pair up with them:
// "q [2, 3], k [3, 4], v [3, 5]".
std::string inputs_str(std::string_view names, std::span<const std::vector<int64_t>> shapes) {
  std::vector<std::string_view> each;
  for (size_t at = 0;;) {
    const size_t comma = names.find(", ", at);
    each.push_back(names.substr(at, comma == std::string_view::npos ? comma : comma - at));
    if (comma == std::string_view::npos) break;
    at = comma + 2;
  }
  if (each.size() != shapes.size() || shapes.size() < 2) return std::string(names) + " " + shapes_str(shapes);
  std::string s;
  for (size_t i = 0; i < shapes.size(); ++i) s += (i ? ", " : "") + std::string(each[i]) + " " + shape_str(shapes[i]);
  return s;
}

}  // namespace

// ---- counts ----------------------------------------------------------------------------

std::optional<int64_t> checked_mul(int64_t a, int64_t b) {
  int64_t product = 0;
  if (a < 0 || b < 0 || __builtin_mul_overflow(a, b, &product) || product > kMaxElements) return std::nullopt;
  return product;
}

std::optional<int64_t> checked_numel(std::span<const int64_t> shape) {
  int64_t extent = 1;  // product of the non-zero dims
  bool has_zero = false;
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (d == 0) {
      has_zero = true;
      continue;
    }
    const auto next = checked_mul(extent, d);
    if (!next) return std::nullopt;
    extent = *next;
  }
  return has_zero ? 0 : extent;
}

std::optional<size_t> checked_nbytes(int64_t numel, size_t itemsize) {
  size_t bytes = 0;
  if (numel < 0 || __builtin_mul_overflow(static_cast<size_t>(numel), itemsize, &bytes)) return std::nullopt;
  return bytes;
}

// ---- the limit -------------------------------------------------------------------------

size_t max_alloc_bytes() {
  if (const size_t set = api_limit.load(std::memory_order_relaxed); set != 0) return set;
  const EnvLimit& limit = env_limit();
  if (!limit.error.empty()) fail<ValueError>(limit.error);
  return limit.bytes;
}

void set_max_alloc_bytes(std::optional<size_t> limit) {
  if (limit && *limit == 0) fail<ValueError>("set_max_alloc_bytes: a limit of 0 bytes allows no allocation");
  api_limit.store(limit ? *limit : 0, std::memory_order_relaxed);
}

// ---- scopes and messages -----------------------------------------------------------------

AllocationScope::AllocationScope(std::string_view op, std::string_view subject,
                                 std::span<const std::vector<int64_t>> inputs, const char* inputs_name)
    : op_(op), subject_(subject), inputs_(inputs), inputs_name_(inputs_name), outer_(innermost_scope) {
  innermost_scope = this;
  unwound_text.clear();  // an earlier exception was handled: its scope names nothing here
}

AllocationScope::~AllocationScope() {
  innermost_scope = outer_;
  // Unwound by an exception: the first (innermost) scope it leaves keeps its text for a
  // catch outside every scope (qkv/out_of_memory.h). No throw from here: a text that
  // cannot be built is lost.
  if (std::uncaught_exceptions() > 0 && unwound_text.empty()) {
    try {
      unwound_text = text();
    } catch (...) {
      unwound_text.clear();
    }
  }
}

std::string AllocationScope::text() const {
  std::string s(op_);
  if (!subject_.empty()) s += ": '" + std::string(subject_) + "'";
  if (!inputs_.empty()) s += " (" + inputs_str(inputs_name_, inputs_) + ")";
  return s;
}

std::string AllocationScope::describe(std::string_view fallback) {
  return innermost_scope != nullptr ? innermost_scope->text() : std::string(fallback);
}

void AllocationScope::fail_bad_alloc() const { fail<OutOfMemoryError>(text(), ": out of memory (std::bad_alloc)"); }

std::string bad_alloc_message(std::string_view fallback) {
  std::string where = unwound_text.empty() ? AllocationScope::describe(fallback) : std::move(unwound_text);
  unwound_text.clear();
  return where + ": out of memory (std::bad_alloc)";
}

void forget_unwound_scope() { unwound_text.clear(); }

std::string allocation_what(std::span<const int64_t> shape, DType dtype, const char* role) {
  return std::string(role) + " " + shape_str(shape) + " " + std::string(dtype_name(dtype));
}

size_t checked_alloc_bytes(std::span<const int64_t> shape, DType dtype, const char* role,
                           std::string_view fallback_op) {
  for (int64_t d : shape) {
    if (d < 0) {
      fail<ShapeError>(AllocationScope::describe(fallback_op), ": ", allocation_what(shape, dtype, role),
                       " has a negative dimension");
    }
  }
  const auto numel = checked_numel(shape);
  const auto bytes = numel ? checked_nbytes(*numel, itemsize(dtype)) : std::nullopt;
  if (!bytes) {
    double log2_bytes = std::log2(static_cast<double>(itemsize(dtype)));
    for (int64_t d : shape) log2_bytes += d > 0 ? std::log2(static_cast<double>(d)) : 0.0;  // zeros excused
    char buf[32];
    const double rounded = std::round(log2_bytes);
    std::snprintf(buf, sizeof buf, std::fabs(log2_bytes - rounded) < 1e-9 ? "2^%.0f" : "2^%.1f", log2_bytes);
    fail<OutOfMemoryError>(AllocationScope::describe(fallback_op), ": ", allocation_what(shape, dtype, role), " needs ",
                           buf, " bytes: the size overflows");
  }
  if (*bytes > 0 && *bytes > max_alloc_bytes())
    fail_over_limit(*bytes, allocation_what(shape, dtype, role), fallback_op);
  return *bytes;
}

void check_alloc_bytes(size_t nbytes, std::string_view what, std::string_view fallback_op) {
  if (nbytes > 0 && nbytes > max_alloc_bytes()) fail_over_limit(nbytes, what, fallback_op);
}

void fail_out_of_memory(size_t nbytes, std::string_view what, std::string_view fallback_op) {
  fail<OutOfMemoryError>(AllocationScope::describe(fallback_op), ": out of memory allocating ", what, " (",
                         bytes_str(nbytes), ")");
}

}  // namespace qkv
