// Tensor-core building blocks of the CUDA FlashAttention kernels (forward:
// attention_cuda_kernel.cu; backward: attention_backward_cuda_kernel.cu), sm_80 and
// later: PTX wrappers for cp.async, ldmatrix and mma.sync m16n8k16, the swizzled
// shared-memory tile layout, its ldmatrix fragment addresses, the tile loader, the
// warps' products both kernels are made of, and the grids' heaviest-first order.
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

// ---- warp products on the tensor cores ------------------------------------------

// c[m] = A_m B^T for the warp's M m-tiles of 16 rows of tile `sa` (from row `row0`)
// against the N rows of tile `sb`, both [.., D] swizzled: row r, column n * 8 + x of
// product m in c[m][n] as the mma accumulator (c[m][n][0..1]: row lane / 4, columns
// 2 (lane % 4) + 0..1; c[m][n][2..3]: row lane / 4 + 8). The forward's S = Q K^T, the
// backward's S^T = K Q^T and dP^T = V dO^T. A fragments (ldmatrix, matrices 0-3 from
// lanes 0-7, 8-15, 16-23, 24-31): rows 0-7 / 8-15 / 0-7 / 8-15, k chunks 0 / 0 / 1 / 1 =
// a0..a3 of m16n8k16, read from shared memory per k-step (registers are for c). B
// fragments (B[k][n] = sb[n][k]): rows n 0-7 / 0-7 / 8-15 / 8-15, k chunks 0 / 1 / 0 / 1
// = b0, b1 of n-tile 2 np, then of 2 np + 1; each serves the M m-tiles.
template <class T, int D, int M, int N>
__device__ __forceinline__ void mma_abt(const T* sa, int row0, const T* sb, float (&c)[M][N / 8][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int n = 0; n < N / 8; ++n) c[m][n][0] = c[m][n][1] = c[m][n][2] = c[m][n][3] = 0.0f;
  }
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    uint32_t a[M][4];
#pragma unroll
    for (int m = 0; m < M; ++m) {
      ldmatrix_x4(a[m], fragment_address<D>(smem_address(sa), row0 + m * 16 + lane % 16, ks, lane / 16));
    }
#pragma unroll
    for (int np = 0; np < N / 16; ++np) {
      uint32_t b[4];
      const int row = np * 16 + (lane % 8) + 8 * (lane / 16);
      ldmatrix_x4(b, fragment_address<D>(smem_address(sb), row, ks, (lane / 8) % 2));
#pragma unroll
      for (int m = 0; m < M; ++m) {
        mma_16816<T>(c[m][2 * np], a[m], b[0], b[1]);
        mma_16816<T>(c[m][2 * np + 1], a[m], b[2], b[3]);
      }
    }
  }
}

// Accumulators [16, N] as the A fragments of a product over their columns, rounded to
// T: a[m][kk][0] = row lane / 4, columns 16 kk + 2 (lane % 4) + 0..1 = c[m][2 kk][0..1];
// [1] = row + 8 = c[m][2 kk][2..3]; [2], [3] = columns + 8 = c[m][2 kk + 1]. The forward's
// P (so that the float scores die before P V), the backward's P^T and dS^T.
template <class T, int M, int N>
__device__ __forceinline__ void pack_rows(const float (&c)[M][N / 8][4], uint32_t (&a)[M][N / 16][4]) {
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk) {
      a[m][kk][0] = pack2<T>(c[m][2 * kk][0], c[m][2 * kk][1]);
      a[m][kk][1] = pack2<T>(c[m][2 * kk][2], c[m][2 * kk][3]);
      a[m][kk][2] = pack2<T>(c[m][2 * kk + 1][0], c[m][2 * kk + 1][1]);
      a[m][kk][3] = pack2<T>(c[m][2 * kk + 1][2], c[m][2 * kk + 1][3]);
    }
  }
}

// c[m] += A_m B for A_m [16, K] packed by pack_rows and B[k][n] = sb[k][n], a swizzled
// [K, D] tile read transposed: the forward's O += P V, the backward's dV += P^T dO and
// dK += dS^T Q. ldmatrix .trans gives lane t the elements (2 (t % 4) + 0..1, t / 4) of a
// stored 8x8 matrix, so matrices of rows k 0-7 / 8-15 / 0-7 / 8-15, column chunks 0 / 0 /
// 1 / 1 are b0, b1 of n-tile 2 dp, then of 2 dp + 1; each serves the M m-tiles.
template <class T, int D, int M, int K>
__device__ __forceinline__ void mma_ab_packed(const uint32_t (&a)[M][K / 16][4], const T* sb, float (&c)[M][D / 8][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int kk = 0; kk < K / 16; ++kk) {
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t b[4];
      const int row = kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
      ldmatrix_x4_trans(b, fragment_address<D>(smem_address(sb), row, dp, lane / 16));
#pragma unroll
      for (int m = 0; m < M; ++m) {
        mma_16816<T>(c[m][2 * dp], a[m][kk], b[0], b[1]);
        mma_16816<T>(c[m][2 * dp + 1], a[m][kk], b[2], b[3]);
      }
    }
  }
}

// ---- grid order ------------------------------------------------------------------

// Which work the 1-D grid's block blockIdx.x does, when each of `entries` batch entries has
// `blocks` blocks ranked by cost (rank 0 the heaviest: the forward's last causal query
// tile, the backward's first causal key block). group > 0: heaviest first within groups
// of `group` entries (all ranks 0 of a group, then all ranks 1, ...), so that short blocks
// fill the tail, a longest-first list schedule; group 0: entry by entry, rank by rank.
// Unsigned 32-bit arithmetic: the launches check that blocks x entries < 2^31. (With
// int64, or signed int, ptxas spilled 16 more bytes in the backward at D = 128; unsigned
// spills none there, 8 bytes fewer than the division the backward had before.)
struct GridSlot {
  unsigned entry, rank;
};
__device__ __forceinline__ GridSlot grid_slot(int64_t blocks64, int64_t entries64, int64_t group64) {
  const unsigned i = blockIdx.x, blocks = static_cast<unsigned>(blocks64);
  const unsigned entries = static_cast<unsigned>(entries64), group = static_cast<unsigned>(group64);
  if (group == 0) return {i / blocks, i % blocks};
  const unsigned span = group * blocks, first = i / span * group;
  const unsigned within = i % span, size = min(group, entries - first);
  return {first + within % size, within / size};
}

}  // namespace qkv::attention::cuda_kernel
