// Argument checks and batch-layout helpers shared by gemm (oneDNN) and
// gemm_reference, so both accept and reject exactly the same calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/cpu/strided_walk.h"
#include "qkv/gemm.h"

namespace qkv::detail {

// One batch dim with its element stride in each operand.
struct GemmDim {
  int64_t size = 1;
  int64_t sa = 0, sb = 0, sc = 0;
  bool operator==(const GemmDim&) const = default;
};

// "m=2, n=3, k=4, trans_a=false, trans_b=true, lda=4, ldb=4, ldc=3, batch=[2, 3],
// stride_a=[..], stride_b=[..], stride_c=[..]": quoted by every gemm error.
std::string gemm_args_str(const GemmShape& s, const GemmBatch& batch);

// Throws ValueError naming `op` and the arguments when they are inconsistent;
// returns the number of matrices in the batch (the product of batch.shape).
// (float32 and float64 calls alike: the pointers are only checked for null.)
int64_t check_gemm_args(const char* op, const GemmShape& s, double alpha, const void* a, const void* b, double beta,
                        const void* c, const GemmBatch& batch);

// check_gemm_args for gemm_panels (B packed: checked as a dense [K, N]; no batch).
int64_t check_gemm_panels_args(const char* op, const GemmShape& s, double alpha, const void* a, const void* panels,
                               double beta, const void* c);

// The batch as a list of dims (checked arguments only).
std::vector<GemmDim> gemm_batch_dims(const GemmBatch& batch);

// An equivalent, smaller batch: drops size-1 dims, orders dims by decreasing C
// stride and merges neighbours that are contiguous with each other in all three
// operands (e.g. [B, H] over contiguous storage becomes one dim of B*H). Fewer
// dims mean fewer distinct oneDNN primitives and simpler descriptors.
std::vector<GemmDim> simplify_gemm_batch(std::vector<GemmDim> dims);

// The batch as the dims of a strided walk (operands a, b, c).
kernels::WalkDims<3> gemm_walk_dims(const std::vector<GemmDim>& dims);

// Product of the dim sizes.
int64_t gemm_batch_count(const std::vector<GemmDim>& dims);

// Calls fn(offset_a, offset_b, offset_c) for batch matrices [first, last) in
// row-major order of `dims` (last dim fastest).
template <class Fn>
void for_each_gemm_batch(const std::vector<GemmDim>& dims, int64_t first, int64_t last, Fn&& fn) {
  kernels::for_each_walk_offset<3>(gemm_walk_dims(dims), first, last,
                                   [&](const kernels::WalkOffsets<3>& o) { fn(o[0], o[1], o[2]); });
}

// C = beta * C for one [m, n] matrix; beta == 0 stores zeros without reading C.
template <class T>
void scale_gemm_output(T* c, int64_t m, int64_t n, int64_t ldc, T beta) {
  for (int64_t i = 0; i < m; ++i) {
    T* row = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) row[j] = beta == T{0} ? T{0} : row[j] * beta;
  }
}

// K == 0 or alpha == 0: C = beta * C for every batch matrix, A and B not touched.
template <class T>
void scale_gemm_batch(const GemmShape& s, T beta, T* c, const std::vector<GemmDim>& dims) {
  for_each_gemm_batch(dims, 0, gemm_batch_count(dims),
                      [&](int64_t, int64_t, int64_t oc) { scale_gemm_output(c + oc, s.m, s.n, s.ldc, beta); });
}

// int8 gemm: ValueError naming `op` when K is so large that int32 could overflow
// (K * 128 * 128 > 2^31 - 1, i.e. K > 131071).
void check_int8_depth(const char* op, const GemmShape& s, const GemmBatch& batch);

// 16-bit A and B where gemm_has_native is false: each batch matrix's stored A and B
// rows widened to float32 (kernels::convert_rows) into per-thread buffers, then one
// float32 gemm per matrix (gemm.cc). `dims` as simplify_gemm_batch returns them.
template <class H>
void gemm_widened(const GemmShape& s, float alpha, const H* a, const H* b, float beta, float* c,
                  const std::vector<GemmDim>& dims);

// int8 A and B where oneDNN's int8 matmul is not exact (gemm_onednn.cc: CPUs without VNNI,
// whose vpmaddubsw saturates pairs of products at 16 bits): float32 gemms over depth
// chunks of at most 1024, each exact (every partial sum is an integer of magnitude
// <= 1024 * 128 * 128 = 2^24), added in int32. Same result as gemm_reference, bit for bit.
void gemm_int8_widened(const GemmShape& s, const int8_t* a, const int8_t* b, int32_t* c,
                       const std::vector<GemmDim>& dims);
// How many int8 gemms so far took gemm_int8_widened (tests: 7-bit weights must not).
int64_t gemm_int8_widened_runs();

// The int8 gemm for a B whose values all lie in [-64, 63] (the 7-bit weights quantizers make
// where gemm_int8_full_range() is false): on oneDNN's int8 kernel on every CPU, as its
// vpmaddubsw pairs cannot saturate then (2 * 255 * 64 <= 2^15: exact, and 2x the float32
// rate under ONEDNN_MAX_CPU_ISA=AVX2 on Zen 4, docs/kernels.md). A B outside the range
// gives wrong sums on such CPUs: not checked per call (a scan of B per call would cost ~10% of
// a 64-row block's product), so internal to the layers that own their weights and know their
// range (nn::Linear quantizes them to [-63, 63]; a loaded layer scans them once).
void gemm_int8_narrow_b(const GemmShape& s, const int8_t* a, const int8_t* b, int32_t* c, const GemmBatch& batch = {});

// ---- introspection of qkv::gemm (gemm_onednn.cc), for tests and benchmarks ----

// Test hook: while on, gemm_has_native answers false for bf16 and f16, so the widening
// path (and attention's float32 tiles) run on any CPU. Process-wide.
void force_gemm_widening(bool on);
// Test hook: while on, the int8 gemm takes gemm_int8_widened on any CPU and
// gemm_int8_full_range() is false, as on a CPU without VNNI (gemm_int8_narrow_b still runs
// on oneDNN). Process-wide.
void force_gemm_int8_widening(bool on);
// oneDNN's effective CPU ISA as its cpu_isa enum names it ("avx512_core_bf16", "avx2";
// honours ONEDNN_MAX_CPU_ISA), for machine_info (gemm_onednn_isa.cc).
std::string gemm_onednn_isa();
// How many calls so far ran on oneDNN's reference matmul (`ref:any`, 100x slower or more: a
// plan oneDNN had no fast kernel for). Tests of the kernels that matter check it stays put.
int64_t gemm_reference_runs();

// Capacity of gemm's plan cache (least recently used plans are dropped).
inline constexpr size_t kGemmPlanCacheCapacity = 256;

// How gemm would run these arguments: "empty", "scale" (K == 0 or alpha == 0), or
// "<oneDNN implementation> outer=<dims looped outside oneDNN>[ parallel]".
// Creates (and caches) the plan like a gemm call would.
std::string gemm_plan_str(const GemmShape& s, float alpha, float beta, const GemmBatch& batch = {});
// oneDNN's implementation name for the plan gemm_panels runs for s (after it stages
// non-dense A or C rows: gemm_onednn.cc dense_panels_shape), or "unpacked: " and
// gemm_plan_str of the unpacked product where !gemm_panels_native().
std::string gemm_panels_plan_str(const GemmShape& s, float alpha, float beta);
// gemm_panels' A and C as dense rows (gemm.cc): oneDNN 2.6 runs a product on packed panels
// whose A or C rows are not dense (lda != K, a transposed A, ldc != N) on its reference
// matmul: 80 ms for one 128x64 x 64x512 product of attention on the MHA layer's head views
// (q rows 3E apart; ONEDNN_VERBOSE ref:any), 15 s for a (8, 12, 512, 64) layer call. Such A
// and C are staged through dense rows (the copy engine): m (k + n) floats copied against
// 2 m n k flops. dense_panels_shape: s with dense A and C; dense_panels_a: a, or its rows
// copied to `buffer`; dense_panels_c: c, or `buffer` (holding C where beta != 0), which
// finish_panels_c copies back to c after the product.
GemmShape dense_panels_shape(const GemmShape& s);
const float* dense_panels_a(const GemmShape& s, const float* a, std::vector<float>& buffer);
float* dense_panels_c(const GemmShape& s, float* c, float beta, std::vector<float>& buffer);
void finish_panels_c(const GemmShape& s, const float* out, float* c);
// s with its packed B as a dense [K, N] (trans_b false, ldb N): what gemm_panels is checked
// as, and the product it runs where B is unpacked.
GemmShape unpacked_panels_shape(const GemmShape& s);
// b [k, n] (dense rows) = the op(B) that gemm_pack_panels packed into `panels`.
void gemm_unpack_panels(int64_t k, int64_t n, const float* panels, float* b);
size_t gemm_plan_cache_size();
void gemm_plan_cache_clear();

}  // namespace qkv::detail
