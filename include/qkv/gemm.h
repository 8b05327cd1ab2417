// The one GEMM entry point of qkv: oneDNN matmul for float32, bfloat16 and float16
// operands (float32 accumulation and output), OpenBLAS dgemm for float64 (oneDNN has
// no f64 matmul on CPUs).
//
// Row-major: C[b] = alpha * op(A[b]) * op(B[b]) + beta * C[b], op(A) is [M, K],
// op(B) is [K, N], C is [M, N]. lda/ldb/ldc are row strides of the matrices as
// stored (A stored [M, K] when !trans_a, [K, M] when trans_a; elements within a
// stored row are contiguous). A leading dimension must be >= its stored row
// length unless the matrix has a single stored row (then it is not used).
//
// Batches may have several dims (outermost first) with arbitrary element strides
// per operand; a stride of 0 broadcasts A or B over that dim. C's batches must
// not overlap (a zero C stride on a dim of size > 1 is a ValueError).
//
// BLAS conventions: beta == 0 means C is not read (NaN in C is overwritten);
// alpha == 0 or K == 0 means A and B are not read (C = beta * C). Any of M, N,
// K or a batch dim may be 0. Pointers of operands that are not read may be null.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/dtype.h"
#include "qkv/half.h"

namespace qkv {

struct GemmBatch {
  std::vector<int64_t> shape;     // batch dims, outermost first; empty = one matrix
  std::vector<int64_t> stride_a;  // element strides per batch dim (0 = broadcast)
  std::vector<int64_t> stride_b;
  std::vector<int64_t> stride_c;
};

struct GemmShape {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  int64_t lda = 0, ldb = 0, ldc = 0;
};

// Fast path: oneDNN matmul, multi-threaded with get_num_threads() threads
// (single-threaded when called inside parallel_for). Primitives are created once
// per (shape, strides, transposes, alpha, beta, thread count) and kept in a
// bounded, thread-safe LRU cache; batch layouts one oneDNN descriptor cannot
// express run as a loop of smaller oneDNN calls. ValueError naming the shapes
// on inconsistent arguments.
void gemm(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c,
          const GemmBatch& batch = {});

// Scalar reference with double accumulation (one rounding per element of C):
// the oracle for gemm in tests. Same arguments, checks and conventions.
void gemm_reference(const GemmShape& s, float alpha, const float* a, const float* b, float beta, float* c,
                    const GemmBatch& batch = {});

// bfloat16 / float16 A and B, float32 C, float32 accumulation (mixed precision: the
// products of 16-bit operands are exact in float32). oneDNN's bf16/f16 matmul where this
// CPU has a kernel for it (gemm_has_native: AVX512-BF16, AVX512-FP16, AMX); elsewhere A
// and B are widened to float32, one batch matrix at a time, into per-thread buffers and
// multiplied by the float32 gemm (same result up to float32 summation order). Same
// conventions and checks as the float32 gemm.
void gemm(const GemmShape& s, float alpha, const bfloat16* a, const bfloat16* b, float beta, float* c,
          const GemmBatch& batch = {});
void gemm(const GemmShape& s, float alpha, const float16* a, const float16* b, float beta, float* c,
          const GemmBatch& batch = {});
// Their oracle: double accumulation of the exact products, one rounding per element of C.
void gemm_reference(const GemmShape& s, float alpha, const bfloat16* a, const bfloat16* b, float beta, float* c,
                    const GemmBatch& batch = {});
void gemm_reference(const GemmShape& s, float alpha, const float16* a, const float16* b, float beta, float* c,
                    const GemmBatch& batch = {});

// int8 A and B, int32 C = op(A) op(B) exactly (no alpha/beta: quantized callers scale the
// int32 result themselves, e.g. per token and per channel): oneDNN's s8 matmul (VNNI or
// AMX where present, AVX2 int8 elsewhere). K <= kGemmInt8MaxDepth so that int32 cannot
// overflow (ValueError otherwise); other checks as above.
void gemm(const GemmShape& s, const int8_t* a, const int8_t* b, int32_t* c, const GemmBatch& batch = {});
// The int8 gemm's largest K: 131071 * 128 * 128 < 2^31, no int32 overflow even for -128 * -128.
inline constexpr int64_t kGemmInt8MaxDepth = 131071;
// Its oracle: int64 accumulation.
void gemm_reference(const GemmShape& s, const int8_t* a, const int8_t* b, int32_t* c, const GemmBatch& batch = {});
// Whether that gemm runs at int8 speed for any int8 B on this CPU (VNNI, AMX). Where false
// (AVX2: oneDNN's vpmaddubsw pairs saturate at 16 bits) it stays exact through float32
// products over depth chunks, at the float32 rate, and only a B within [-64, 63] runs on
// oneDNN's int8 kernel: quantizers that choose their weights' range make 7-bit weights there
// (nn::Linear::quantize_dynamic). Probed once (honours ONEDNN_MAX_CPU_ISA).
bool gemm_int8_full_range();

// Whether gemm on `operands` (f32, bf16 or f16; f64 is always OpenBLAS) runs a oneDNN
// kernel made for that type on this CPU, rather than oneDNN's reference kernel or the
// widening path. Probed once per dtype (honours ONEDNN_MAX_CPU_ISA). Kernels use it to
// choose between 16-bit tiles and float32 tiles (attention_cpu.cc).
bool gemm_has_native(DType operands);

// ---- float32 B packed once, multiplied many times --------------------------------------
// op(B) [K, N] as ceil(N / 64) panels one after another, panel p holding columns
// [64 p, 64 p + 64) as a row-major [K16, 64] matrix (K16 = K rounded up to a multiple of
// 16; rows past K and columns past N are zero): oneDNN's blocked weights layout
// (BA16a64b), which its brgemm kernels read as they are, where a B stored as rows of
// op(B)^T (attention's K) is transposed into that layout on every call. Whole panels
// p.. of a packed matrix are themselves the packed columns 64 p.. (attention packs K
// once per call and multiplies runs of its key blocks; attention_cpu.cc).
int64_t gemm_panels_size(int64_t k, int64_t n);  // floats of the packed op(B)
// panels [gemm_panels_size(k, n)] = op(B) packed; b as gemm reads it (trans_b, ldb). With
// `stream`, stores of a transposed b bypass the cache (for packed matrices that will have
// left it before they are read; ordered before this thread's later stores).
void gemm_pack_panels(bool trans_b, int64_t k, int64_t n, const float* b, int64_t ldb, float* panels,
                      bool stream = false);
// C = alpha * op(A) * P + beta * C with P [K, N] packed by gemm_pack_panels (s.trans_b
// and s.ldb are not used); one matrix, no batch. Conventions and checks as gemm.
// A (and C) need not be dense: rows that are not (lda != K, trans_a, ldc != N) are staged
// through dense per-thread rows, as oneDNN 2.6 runs such packed products on its reference
// matmul (80 ms for one 128 x 64 x 512 product).
void gemm_panels(const GemmShape& s, float alpha, const float* a, const float* panels, float beta, float* c);
// Whether gemm_panels runs on a fast oneDNN kernel for packed B on this CPU (its brgemm
// matmul, AVX-512 cores; oneDNN 2.6 has only its reference matmul for packed B on AVX2, 0.2
// GFLOP/s). Probed once (honours ONEDNN_MAX_CPU_ISA). Where false, gemm_panels unpacks B
// and runs gemm: callers that pack only to spare gemm's per-call transposition of B should
// not pack (attention's K panels do not).
bool gemm_panels_native();
void gemm_panels_reference(const GemmShape& s, float alpha, const float* a, const float* panels, float beta, float* c);

// float64: OpenBLAS cblas_dgemm per batch matrix (OpenMP build of OpenBLAS, so it
// uses get_num_threads() threads, one inside parallel_for). Many small matrices run
// as a parallel_for over the batch, each dgemm on one thread. Same conventions and
// checks as the float32 gemm.
void gemm(const GemmShape& s, double alpha, const double* a, const double* b, double beta, double* c,
          const GemmBatch& batch = {});

// float64 oracle: long double accumulation, one rounding per element of C.
void gemm_reference(const GemmShape& s, double alpha, const double* a, const double* b, double beta, double* c,
                    const GemmBatch& batch = {});

}  // namespace qkv
