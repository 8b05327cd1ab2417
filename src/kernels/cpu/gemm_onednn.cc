// qkv::gemm over oneDNN matmul (f32, bf16 and f16 operands with f32 C; s8 operands with s32
// C; OMP runtime).
//
// Every call is reduced to a canonical Problem (batch dims simplified, unused
// leading dimensions canonicalised, thread count included), which keys an LRU
// cache of Plans. A Plan is one oneDNN primitive over the innermost batch dims
// it can express, plus the outer batch dims (if any) we loop over ourselves.
//
// What one oneDNN descriptor can express (probed on 2.6, see docs/kernels.md):
// non-negative strides that do not make a memory descriptor overlap, at most 12
// dims, and broadcasting by one of A or B per dim (a stride-0 dim becomes a
// size-1 dim of that operand's descriptor). oneDNN 2.6 crashes (SIGFPE) on
// K == 0, so empty problems never reach it.
//
// Scratchpads are user-managed, one buffer per calling thread: with oneDNN 2.6's
// library-managed scratchpad, one primitive executed from two threads at once
// (two callers with the same shape, or our parallel batch loop) gives wrong
// results or crashes (reproduced with 33x65x17 and 256^3 brgemm matmuls).
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <iterator>
#include <list>
#include <memory>
#include <mutex>
#include <new>
#include <optional>
#include <string>
#include <type_traits>
#include <unordered_map>

#include "kernels/cpu/gemm_internal.h"
#include "kernels/cpu/parallel_internal.h"
#include "qkv/error.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "qkv/size.h"

namespace qkv {

namespace {

using detail::GemmDim;
using dnnl::memory;

// Below this many flops per oneDNN call, an outer batch loop runs on
// parallel_for with single-threaded calls rather than serially with threaded ones
// (measured with bench/gemm_bench.cc, BM_GemmLoopedBatch; see docs/kernels.md).
constexpr double kSerialCallFlops = 1 << 22;

struct Problem {
  memory::data_type ab = memory::data_type::f32;  // A and B
  memory::data_type c = memory::data_type::f32;   // C: f32, or s32 for s8 operands
  bool trans_a = false, trans_b = false;
  bool b_panels = false;  // B packed by gemm_pack_panels (oneDNN's BA16a64b); trans_b, ldb unused
  int64_t m = 0, n = 0, k = 0, lda = 0, ldb = 0, ldc = 0;
  uint32_t alpha_bits = 0, beta_bits = 0;  // bits, so that -0.0 and NaN are keys too
  int threads = 1;
  std::vector<GemmDim> dims;
  bool operator==(const Problem&) const = default;
};

struct ProblemHash {
  size_t operator()(const Problem& p) const {
    uint64_t h = 0x9e3779b97f4a7c15ull;
    auto mix = [&h](uint64_t v) { h = (h ^ v) * 0x100000001b3ull + (h >> 29); };
    mix(static_cast<uint64_t>(p.trans_a) | static_cast<uint64_t>(p.trans_b) << 1 | static_cast<uint64_t>(p.ab) << 2 |
        static_cast<uint64_t>(p.c) << 10 | static_cast<uint64_t>(p.b_panels) << 20);
    for (int64_t v : {p.m, p.n, p.k, p.lda, p.ldb, p.ldc}) mix(static_cast<uint64_t>(v));
    mix(p.alpha_bits | static_cast<uint64_t>(p.beta_bits) << 32);
    mix(static_cast<uint64_t>(p.threads));
    for (const GemmDim& d : p.dims) {
      for (int64_t v : {d.size, d.sa, d.sb, d.sc}) mix(static_cast<uint64_t>(v));
    }
    return static_cast<size_t>(h);
  }
};

struct Plan {
  dnnl::matmul prim;
  memory::desc a_md, b_md, c_md, scratch_md;
  std::vector<GemmDim> outer;   // batch dims looped here, outermost first; empty = one call
  bool parallel_outer = false;  // outer loop on parallel_for, single-threaded oneDNN calls
  std::string impl;             // oneDNN's implementation name
  bool reference = false;       // impl is oneDNN's reference matmul (detail::gemm_reference_runs)
};

// A leading dimension is unused when only one row is stored; giving it the dense
// value keeps such calls on the fast kernels (oneDNN 2.6 picks its slow reference
// kernel for some odd strides of size-1 dims) and shares their cache entry.
int64_t canonical_ld(int64_t stored_rows, int64_t row_len, int64_t ld) {
  return stored_rows <= 1 ? std::max<int64_t>(row_len, 1) : ld;
}

Problem make_problem(memory::data_type ab, const GemmShape& s, float alpha, float beta, std::vector<GemmDim> dims,
                     int threads, bool b_panels = false) {
  Problem p;
  p.ab = ab;
  p.c = ab == memory::data_type::s8 ? memory::data_type::s32 : memory::data_type::f32;
  p.trans_a = s.trans_a;
  p.trans_b = s.trans_b;
  p.m = s.m;
  p.n = s.n;
  p.k = s.k;
  p.lda = canonical_ld(s.trans_a ? s.k : s.m, s.trans_a ? s.m : s.k, s.lda);
  p.ldb = canonical_ld(s.trans_b ? s.n : s.k, s.trans_b ? s.k : s.n, s.ldb);
  p.ldc = canonical_ld(s.m, s.n, s.ldc);
  if (b_panels) p.b_panels = true, p.trans_b = false, p.ldb = 0;
  p.alpha_bits = std::bit_cast<uint32_t>(alpha);
  p.beta_bits = std::bit_cast<uint32_t>(beta);
  p.threads = threads;
  p.dims = std::move(dims);
  return p;
}

// ---- descriptors ---------------------------------------------------------------------

enum class Operand { a, b, c };

int64_t dim_stride(const GemmDim& d, Operand x) { return x == Operand::a ? d.sa : x == Operand::b ? d.sb : d.sc; }

// [inner batch..., rows, cols] with the operand's strides; a broadcast (stride 0)
// dim becomes size 1 with a stride past the operand's extent (oneDNN's fast
// kernels reject stride 0 even on size-1 dims).
memory::desc operand_md(const std::vector<GemmDim>& inner, Operand x, int64_t rows, int64_t cols, int64_t row_stride,
                        int64_t col_stride, memory::data_type type) {
  int64_t extent = std::max(rows * row_stride, cols * col_stride);
  for (const GemmDim& d : inner) extent = std::max(extent, d.size * dim_stride(d, x));
  memory::dims sizes, strides;
  for (const GemmDim& d : inner) {
    const int64_t stride = dim_stride(d, x);
    sizes.push_back(stride == 0 ? 1 : d.size);
    strides.push_back(stride == 0 ? extent : stride);
  }
  sizes.insert(sizes.end(), {rows, cols});
  strides.insert(strides.end(), {row_stride, col_stride});
  return memory::desc(sizes, type, strides);
}

bool expressible(const std::vector<GemmDim>& inner) {
  if (inner.size() + 2 > DNNL_MAX_NDIMS) return false;
  return std::all_of(inner.begin(), inner.end(),
                     [](const GemmDim& d) { return d.sa >= 0 && d.sb >= 0 && d.sc > 0 && (d.sa > 0 || d.sb > 0); });
}

dnnl::engine& cpu_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One stream per calling thread: creating one per call costs microseconds, and
// a stream must not be shared by threads executing at the same time.
dnnl::stream& thread_stream() {
  thread_local dnnl::stream stream(cpu_engine());
  return stream;
}

// The plan that loops over dims[0, split) and hands dims[split, end) to oneDNN,
// or nothing when oneDNN cannot express that split well.
std::optional<Plan> try_plan(const Problem& p, size_t split) {
  const std::vector<GemmDim> inner(p.dims.begin() + static_cast<std::ptrdiff_t>(split), p.dims.end());
  if (!expressible(inner)) return std::nullopt;
  Plan plan;
  plan.outer.assign(p.dims.begin(), p.dims.begin() + static_cast<std::ptrdiff_t>(split));
  const double call_flops = 2.0 * static_cast<double>(p.m) * static_cast<double>(p.n) * static_cast<double>(p.k) *
                            static_cast<double>(detail::gemm_batch_count(inner));
  plan.parallel_outer =
      p.threads > 1 && detail::gemm_batch_count(plan.outer) >= p.threads && call_flops < kSerialCallFlops;
  try {
    plan.a_md = operand_md(inner, Operand::a, p.m, p.k, p.trans_a ? 1 : p.lda, p.trans_a ? p.lda : 1, p.ab);
    plan.b_md = p.b_panels
                    ? memory::desc({p.k, p.n}, p.ab, memory::format_tag::BA16a64b)
                    : operand_md(inner, Operand::b, p.k, p.n, p.trans_b ? 1 : p.ldb, p.trans_b ? p.ldb : 1, p.ab);
    plan.c_md = operand_md(inner, Operand::c, p.m, p.n, p.ldc, 1, p.c);
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // see the top of the file
    const float alpha = std::bit_cast<float>(p.alpha_bits), beta = std::bit_cast<float>(p.beta_bits);
    if (alpha != 1.0f) attr.set_output_scales(0, {alpha});  // applied before the sum post-op
    if (beta != 0.0f) {
      dnnl::post_ops ops;
      ops.append_sum(beta);  // C = alpha * AB + beta * C
      attr.set_post_ops(ops);
    }
    // Calls that run inside parallel_for must be created single-threaded.
    const detail::ScopedRuntimeThreads threads(plan.parallel_outer ? 1 : p.threads);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(plan.a_md, plan.b_md, plan.c_md), attr, cpu_engine());
    plan.impl = pd.impl_info_str();
    plan.scratch_md = pd.scratchpad_desc();
    // The reference kernel is orders of magnitude slower than looping over a
    // batch dim with a fast kernel; accept it only when nothing is left to loop
    // (and never for 16-bit operands: those are only planned where gemm_has_native).
    plan.reference = plan.impl.find("ref") != std::string::npos;
    if (plan.reference && (split < p.dims.size() || p.ab != memory::data_type::f32)) return std::nullopt;
    plan.prim = dnnl::matmul(pd);
  } catch (const dnnl::error&) {
    return std::nullopt;  // e.g. strides that make a descriptor overlap
  }
  return plan;
}

std::shared_ptr<const Plan> make_plan(const Problem& p, const GemmShape& s, const GemmBatch& batch) {
  for (size_t split = 0; split <= p.dims.size(); ++split) {
    if (auto plan = try_plan(p, split)) return std::make_shared<const Plan>(std::move(*plan));
  }
  fail<Error>("gemm: oneDNN has no matmul for ", detail::gemm_args_str(s, batch));
}

// ---- the plan cache ----------------------------------------------------------------------

class PlanCache {
 public:
  std::shared_ptr<const Plan> find(const Problem& p) {
    const std::lock_guard<std::mutex> lock(mutex_);
    const auto it = index_.find(p);
    if (it == index_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);  // most recently used first
    return it->second->second;
  }

  // Plans are built outside the lock (oneDNN JIT takes milliseconds); when two
  // threads race on a new key, the first insert wins and both use its plan.
  std::shared_ptr<const Plan> insert(const Problem& p, std::shared_ptr<const Plan> plan) {
    const std::lock_guard<std::mutex> lock(mutex_);
    if (const auto it = index_.find(p); it != index_.end()) return it->second->second;
    lru_.emplace_front(p, std::move(plan));
    index_.emplace(p, lru_.begin());
    if (lru_.size() > detail::kGemmPlanCacheCapacity) {
      index_.erase(lru_.back().first);
      lru_.pop_back();
    }
    return lru_.front().second;
  }

  size_t size() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return lru_.size();
  }

  void clear() {
    const std::lock_guard<std::mutex> lock(mutex_);
    index_.clear();
    lru_.clear();
  }

 private:
  using Entry = std::pair<Problem, std::shared_ptr<const Plan>>;
  std::mutex mutex_;
  std::list<Entry> lru_;
  std::unordered_map<Problem, std::list<Entry>::iterator, ProblemHash> index_;
};

PlanCache& plan_cache() {
  static PlanCache cache;
  return cache;
}

std::shared_ptr<const Plan> get_plan(const Problem& p, const GemmShape& s, const GemmBatch& batch) {
  if (auto plan = plan_cache().find(p)) return plan;
  return plan_cache().insert(p, make_plan(p, s, batch));
}

// ---- execution ---------------------------------------------------------------------------

// This thread's scratchpad, grown to at least `bytes` (64-byte aligned).
void* thread_scratchpad(size_t bytes) {
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  thread_local std::unique_ptr<void, Free> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    const size_t rounded = (bytes + 63) / 64 * 64;
    buffer.reset(std::aligned_alloc(64, rounded));
    if (!buffer) fail_out_of_memory(rounded, "the oneDNN scratchpad", "gemm");  // names the caller's scope
    capacity = rounded;
  }
  return buffer.get();
}

// The memory objects one thread uses to run one plan; handles are set per call.
// Creating them costs more than executing a small product, so they are reused.
struct Operands {
  memory a, b, c, scratch;
  explicit Operands(const Plan& plan)
      : a(plan.a_md, cpu_engine(), DNNL_MEMORY_NONE),
        b(plan.b_md, cpu_engine(), DNNL_MEMORY_NONE),
        c(plan.c_md, cpu_engine(), DNNL_MEMORY_NONE),
        scratch(plan.scratch_md, cpu_engine(), DNNL_MEMORY_NONE) {}
};

// One product through the C API: its argument array needs no allocation,
// unlike the C++ API's unordered_map.
void execute_one(const Plan& plan, Operands& ops, const void* a, const void* b, void* c) {
  // oneDNN never writes A or B; its memory API just has no const handles.
  ops.a.set_data_handle(const_cast<void*>(a));
  ops.b.set_data_handle(const_cast<void*>(b));
  ops.c.set_data_handle(c);
  ops.scratch.set_data_handle(thread_scratchpad(plan.scratch_md.get_size()));
  const dnnl_exec_arg_t args[] = {{DNNL_ARG_SRC, ops.a.get()},
                                  {DNNL_ARG_WEIGHTS, ops.b.get()},
                                  {DNNL_ARG_DST, ops.c.get()},
                                  {DNNL_ARG_SCRATCHPAD, ops.scratch.get()}};
  const dnnl_status_t status =
      dnnl_primitive_execute(plan.prim.get(), thread_stream().get(), static_cast<int>(std::size(args)), args);
  if (status != dnnl_success) throw dnnl::error(status, "could not execute a matmul primitive");
}

// Runs the plan's primitive on batch matrices [first, last) of plan.outer (AB: the
// element type of A and B).
template <class AB, class C>
void run_outer_range(const Plan& plan, Operands& ops, const AB* a, const AB* b, C* c, int64_t first, int64_t last) {
  detail::for_each_gemm_batch(plan.outer, first, last, [&](int64_t oa, int64_t ob, int64_t oc) {
    if (interrupt_requested()) return;  // skips the rest; parallel_for / gemm throws
    execute_one(plan, ops, a + oa, b + ob, c + oc);
  });
  thread_stream().wait();
}

// A thread's recently used plans with their memory objects: repeated calls
// with the same arguments (the common case in loops) skip the shared cache's
// lock and the memory-object set-up.
struct ThreadPlan {
  Problem key;
  std::shared_ptr<const Plan> plan;
  std::optional<Operands> ops;
};

ThreadPlan& thread_plan(Problem&& p, const GemmShape& s, const GemmBatch& batch) {
  constexpr size_t kSlots = 4;  // e.g. attention's two products, with room to spare
  thread_local std::array<ThreadPlan, kSlots> slots;
  thread_local size_t next = 0;
  for (ThreadPlan& slot : slots) {
    if (slot.ops && slot.key == p) return slot;
  }
  ThreadPlan& slot = slots[next++ % kSlots];
  slot.ops.reset();  // the slot is valid again only once everything below succeeded
  slot.plan = get_plan(p, s, batch);
  slot.key = std::move(p);
  slot.ops.emplace(*slot.plan);
  return slot;
}

// Calls run on oneDNN's reference matmul (detail::gemm_reference_runs).
std::atomic<int64_t> g_reference_runs{0};

template <class AB, class C>
void run_plan(ThreadPlan& tp, const AB* a, const AB* b, C* c) {
  const Plan& plan = *tp.plan;
  if (plan.reference) g_reference_runs.fetch_add(1, std::memory_order_relaxed);
  const int64_t count = detail::gemm_batch_count(plan.outer);
  if (!plan.parallel_outer) {
    run_outer_range(plan, *tp.ops, a, b, c, 0, count);
    check_interrupt("gemm");
    return;
  }
  parallel_for(0, count, 1, [&](int64_t lo, int64_t hi) {
    Operands ops(plan);  // per worker thread: memory objects are not thread-safe
    run_outer_range(plan, ops, a, b, c, lo, hi);
  });
}

template <class AB>
constexpr memory::data_type kOneDnnType = std::is_same_v<AB, float>      ? memory::data_type::f32
                                          : std::is_same_v<AB, bfloat16> ? memory::data_type::bf16
                                          : std::is_same_v<AB, int8_t>   ? memory::data_type::s8
                                                                         : memory::data_type::f16;

// Every gemm with float32 C: checks, empty and scale-only calls, then oneDNN, or for
// 16-bit operands without a native kernel the widening path (gemm.cc).
template <class AB>
void gemm_f32_out(const GemmShape& s, float alpha, const AB* a, const AB* b, float beta, float* c,
                  const GemmBatch& batch) {
  const int64_t count = detail::check_gemm_args("gemm", s, alpha, a, b, beta, c, batch);
  if (count == 0 || s.m == 0 || s.n == 0) return;
  std::vector<GemmDim> dims = detail::simplify_gemm_batch(detail::gemm_batch_dims(batch));
  if (s.k == 0 || alpha == 0.0f) {
    detail::scale_gemm_batch(s, beta, c, dims);
    return;
  }
  if constexpr (!std::is_same_v<AB, float>) {
    if (!gemm_has_native(dtype_of<AB>::value)) {
      detail::gemm_widened(s, alpha, a, b, beta, c, dims);
      return;
    }
  }
  const int threads = detail::sync_runtime_threads();
  try {
    run_plan(thread_plan(make_problem(kOneDnnType<AB>, s, alpha, beta, std::move(dims), threads), s, batch), a, b, c);
  } catch (const dnnl::error& e) {
    fail<Error>("gemm: oneDNN failed (", e.what(), ") for ", detail::gemm_args_str(s, batch));
  }
}

// Whether oneDNN makes a kernel other than its reference one for the 64^3 matmul of these
// operands on this CPU (the same answer for the tile shapes qkv uses); false where it makes
// none at all (oneDNN 2.6: f16 below AVX512-FP16).
bool fast_matmul(const memory::desc& a, const memory::desc& b, const memory::desc& c) {
  try {
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a, b, c), cpu_engine());
    return std::string(pd.impl_info_str()).find("ref") == std::string::npos;
  } catch (const dnnl::error&) {
    return false;
  }
}

// gemm_has_native: dense 64^3 operands of `type`, float32 C.
bool probe_native(memory::data_type type) {
  const memory::desc a({64, 64}, type, memory::dims{64, 1}), c({64, 64}, memory::data_type::f32, {64, 1});
  return fast_matmul(a, a, c);
}

std::atomic<bool> g_force_widening{false};

std::atomic<bool> g_force_int8_widening{false};

// Whether oneDNN's int8 matmul is exact on this CPU for B in [b_lo, b_hi]: without VNNI
// (AVX2, AVX-512 before Cascade Lake) oneDNN 2.6's gemm:jit multiplies s8 A (shifted to u8)
// by s8 B with vpmaddubsw, which saturates each pair of products at 16 bits: every element
// of a 64 x 64 x 768 product was wrong under ONEDNN_MAX_CPU_ISA=AVX2 with 8-bit B, none with
// B in [-64, 63] (2 * 255 * 64 <= 2^15). Probed once per range and shape on extreme values: a
// product of one column (n = 1) runs oneDNN's gemv, which shifts B to u8 instead, so that full-range
// A saturates the pairs even for narrow B (ONEDNN_MAX_CPU_ISA=AVX512_CORE, m = 768, n = 1, k = 64:
// GemmInt8.NarrowBIsExactWithoutTheFloat32Path); such products are probed as m x 1 and 1 x n.
bool probe_int8_exact(int8_t b_lo, int8_t b_hi, int64_t m = 16, int64_t n = 16) {
  constexpr int64_t k = 128;
  std::vector<int8_t> a(m * k), b(k * n);
  for (int64_t x = 0; x < m * k; ++x) a[static_cast<size_t>(x)] = static_cast<int8_t>(x % 3 == 0 ? -128 : 127);
  for (int64_t x = 0; x < k * n; ++x) b[static_cast<size_t>(x)] = x % 5 == 0 ? b_lo : b_hi;
  std::vector<int32_t> got(m * n), want(m * n);
  const GemmShape s{false, false, m, n, k, k, n, n};
  try {
    run_plan(thread_plan(make_problem(kOneDnnType<int8_t>, s, 1.0f, 0.0f, {}, 1), s, {}), a.data(), b.data(),
             got.data());
  } catch (const std::exception&) {  // dnnl::error, or qkv's Error when oneDNN has no int8 matmul
    return false;
  }
  gemm_reference(s, a.data(), b.data(), want.data());
  return got == want;
}

// Whether the int8 gemm of shape s runs on oneDNN for any int8 B (`narrow`: for B in [-64, 63]).
bool int8_exact(bool narrow, const GemmShape& s) {
  static const bool exact = probe_int8_exact(-128, 127);
  static const bool narrow_exact = probe_int8_exact(-64, 63);
  static const bool narrow_vector = probe_int8_exact(-64, 63, 16, 1) && probe_int8_exact(-64, 63, 1, 16);
  if (!narrow) return exact && !g_force_int8_widening;
  return s.m == 1 || s.n == 1 ? narrow_vector : narrow_exact;
}

// Whether oneDNN has a fast matmul for float32 B packed as BA16a64b (gemm_panels_native).
bool probe_panels() {
  const memory::desc a({64, 64}, memory::data_type::f32, memory::dims{64, 1});
  return fast_matmul(a, memory::desc({64, 64}, memory::data_type::f32, memory::format_tag::BA16a64b), a);
}

}  // namespace

void gemm(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c,
          const GemmBatch& batch) {
  gemm_f32_out(s, alpha, a, b, beta, c, batch);
}

void gemm(const GemmShape& s, float alpha, const bfloat16* a, const bfloat16* b, float beta, float* c,
          const GemmBatch& batch) {
  gemm_f32_out(s, alpha, a, b, beta, c, batch);
}

void gemm(const GemmShape& s, float alpha, const float16* a, const float16* b, float beta, float* c,
          const GemmBatch& batch) {
  gemm_f32_out(s, alpha, a, b, beta, c, batch);
}

bool gemm_panels_native() {
  static const bool native = probe_panels();
  return native;
}

void gemm_panels(const GemmShape& s, float alpha, const float* a, const float* panels, float beta, float* c) {
  detail::check_gemm_panels_args("gemm_panels", s, alpha, a, panels, beta, c);
  if (s.m == 0 || s.n == 0) return;
  if (s.k == 0 || alpha == 0.0f) {
    detail::scale_gemm_output(c, s.m, s.n, s.ldc, beta);
    return;
  }
  // No packed kernel: B unpacked, then gemm (the reference matmul is ~100x slower).
  if (!gemm_panels_native()) {
    thread_local std::vector<float> b_rows;  // [K, N]
    b_rows.resize(static_cast<size_t>(s.k * s.n));
    detail::gemm_unpack_panels(s.k, s.n, panels, b_rows.data());
    gemm(detail::unpacked_panels_shape(s), alpha, a, b_rows.data(), beta, c);
    return;
  }
  thread_local std::vector<float> a_rows, c_rows;  // [m, k], [m, n]: see dense_panels_shape
  const GemmShape d = detail::dense_panels_shape(s);
  a = detail::dense_panels_a(s, a, a_rows);
  float* out = detail::dense_panels_c(s, c, beta, c_rows);
  const int threads = detail::sync_runtime_threads();
  try {
    run_plan(thread_plan(make_problem(memory::data_type::f32, d, alpha, beta, {}, threads, true), d, {}), a, panels,
             out);
  } catch (const dnnl::error& e) {
    fail<Error>("gemm_panels: oneDNN failed (", e.what(), ") for ", detail::gemm_args_str(s, {}));
  }
  detail::finish_panels_c(s, out, c);
}

namespace {

// The int8 gemm: oneDNN where it is exact for B's range, else the float32-chunk path.
void gemm_int8(const GemmShape& s, const int8_t* a, const int8_t* b, int32_t* c, const GemmBatch& batch,
               bool narrow_b) {
  const int64_t count = detail::check_gemm_args("gemm", s, 1.0, a, b, 0.0, c, batch);
  detail::check_int8_depth("gemm", s, batch);
  if (count == 0 || s.m == 0 || s.n == 0) return;
  std::vector<GemmDim> dims = detail::simplify_gemm_batch(detail::gemm_batch_dims(batch));
  if (s.k == 0) {
    detail::scale_gemm_batch(s, int32_t{0}, c, dims);
    return;
  }
  if (!int8_exact(narrow_b, s)) {
    detail::gemm_int8_widened(s, a, b, c, dims);
    return;
  }
  const int threads = detail::sync_runtime_threads();
  try {
    run_plan(thread_plan(make_problem(kOneDnnType<int8_t>, s, 1.0f, 0.0f, std::move(dims), threads), s, batch), a, b,
             c);
  } catch (const dnnl::error& e) {
    fail<Error>("gemm: oneDNN failed (", e.what(), ") for ", detail::gemm_args_str(s, batch));
  }
}

}  // namespace

void gemm(const GemmShape& s, const int8_t* a, const int8_t* b, int32_t* c, const GemmBatch& batch) {
  gemm_int8(s, a, b, c, batch, false);
}

bool gemm_int8_full_range() { return int8_exact(false, {}); }

bool gemm_has_native(DType operands) {
  static const bool bf16 = probe_native(memory::data_type::bf16);
  static const bool f16 = probe_native(memory::data_type::f16);
  switch (operands) {
    case DType::f32: return true;
    case DType::bf16: return bf16 && !g_force_widening;
    case DType::f16: return f16 && !g_force_widening;
    default: return false;
  }
}

namespace detail {

std::string gemm_panels_plan_str(const GemmShape& s, float alpha, float beta) {
  if (!gemm_panels_native()) {
    return "unpacked: " + gemm_plan_str(unpacked_panels_shape(s), alpha, beta);
  }
  const int threads = sync_runtime_threads();
  const GemmShape d = dense_panels_shape(s);
  return get_plan(make_problem(memory::data_type::f32, d, alpha, beta, {}, threads, true), d, {})->impl;
}

std::string gemm_plan_str(const GemmShape& s, float alpha, float beta, const GemmBatch& batch) {
  static const float unused = 0.0f;  // the plan does not depend on the pointers
  const int64_t count = check_gemm_args("gemm_plan_str", s, alpha, &unused, &unused, beta, &unused, batch);
  if (count == 0 || s.m == 0 || s.n == 0) return "empty";
  std::vector<GemmDim> dims = simplify_gemm_batch(gemm_batch_dims(batch));
  if (s.k == 0 || alpha == 0.0f) return "scale";
  const int threads = sync_runtime_threads();
  const auto plan = get_plan(make_problem(memory::data_type::f32, s, alpha, beta, std::move(dims), threads), s, batch);
  std::string out = plan->impl + " outer=" + std::to_string(plan->outer.size());
  if (plan->parallel_outer) out += " parallel";
  return out;
}

size_t gemm_plan_cache_size() { return plan_cache().size(); }

void gemm_plan_cache_clear() { plan_cache().clear(); }

void force_gemm_widening(bool on) { g_force_widening = on; }

void force_gemm_int8_widening(bool on) { g_force_int8_widening = on; }

void gemm_int8_narrow_b(const GemmShape& s, const int8_t* a, const int8_t* b, int32_t* c, const GemmBatch& batch) {
  gemm_int8(s, a, b, c, batch, true);
}

int64_t gemm_reference_runs() { return g_reference_runs.load(std::memory_order_relaxed); }

}  // namespace detail

}  // namespace qkv
