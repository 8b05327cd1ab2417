// Tensor-core building blocks of the CUDA FlashAttention kernels (forward:
// attention_cuda_kernel.cu; backward: attention_backward_cuda_kernel.cu), sm_80 and
// later: PTX wrappers for cp.async, ldmatrix and mma.sync m16n8k16, the swizzled
// shared-memory tile layout, its ldmatrix fragment addresses and the tile loader.
// Device code only: included by .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace qkv::attention::cuda_kernel {

// ---- PTX wrappers ------------------------------------------------------------------

__device__ __forceinline__ uint32_t smem_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared; `valid` false writes zeros (src-size 0) without reading.
__device__ __forceinline__ void cp_async_16(void* dst, const void* src, bool valid) {
  const int bytes = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_address(dst)), "l"(src), "r"(bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// `address` is a shared-memory byte address (smem_address). Not volatile: the loads
// may be scheduled freely between the barriers that order them.
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t address) {
  asm("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(address)
      : "memory");
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t address) {
  asm("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
      : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
      : "r"(address)
      : "memory");
}

// c += a b: a 16x16 (row-major fragment), b 16x8 (column-major), c 16x8 float32.
template <class T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1);
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as the packed pair of T an mma operand register holds (lo = first).
template <class T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  const __half2 v = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- tiles in shared memory ---------------------------------------------------------

// Element offset of (row, 16-byte chunk) in a swizzled tile of D columns.
template <int D>
__device__ __forceinline__ int swizzle(int row, int chunk) {
  return row * D + ((chunk ^ (row & 7)) << 3);
}

// The byte address of an ldmatrix fragment in a swizzled tile at `tile`: this lane's
// row `row` (row % 8 == lane % 8 for every fragment read here) and 16-byte chunk
// 2 * step + half, half = 0 or 1 per lane. Written as (2 step) ^ (half ^ row % 8) so
// that the lane-dependent part is one value and step (a compile-time constant) costs
// one XOR: the compiler need not keep an address per fragment in registers.
template <int D>
__device__ __forceinline__ uint32_t fragment_address(uint32_t tile, int row, int step, int half) {
  const int lane_bits = half ^ (row & 7);
  return tile + static_cast<uint32_t>(row * D * 2) + (static_cast<uint32_t>((2 * step) ^ lane_bits) << 4);
}

// Rows [row0, row0 + R) of a [len, D] matrix (rows `stride` apart) into a swizzled
// tile, by a block of `Threads` threads; rows at or past `len` become zeros (their scores are masked, and zero values
// keep NaN out of P V).
template <int R, int D, int Threads, class T>
__device__ __forceinline__ void load_tile(T* tile, const T* base, int64_t stride, int64_t row0, int64_t len) {
  constexpr int kChunks = D / 8, kRowsPerPass = Threads / kChunks;
  static_assert(R % kRowsPerPass == 0, "whole passes");
  // This thread copies chunk `chunk` of rows row, row + kRowsPerPass, ...
  const int row = threadIdx.x / kChunks, chunk = threadIdx.x % kChunks;
  const T* src = base + (row0 + row) * stride + chunk * 8;
  T* dst = tile + swizzle<D>(row, chunk);
#pragma unroll
  for (int pass = 0; pass < R / kRowsPerPass; ++pass) {
    const bool valid = row0 + row + pass * kRowsPerPass < len;
    // (row + pass * kRowsPerPass) % 8 == row % 8: one swizzle for every pass.
    cp_async_16(dst + pass * kRowsPerPass * D, valid ? src + pass * kRowsPerPass * stride : base, valid);
  }
}

}  // namespace qkv::attention::cuda_kernel
