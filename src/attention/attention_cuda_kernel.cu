// FlashAttention-2's forward (Dao 2023, Algorithm 1) on tensor cores, bf16 or f16
// operands with float32 accumulation, for sm_80 and later (mma.sync m16n8k16,
// ldmatrix, cp.async; Hopper runs the same code).
//
// One block of 4 warps computes kBr = 128 query rows of one batch entry; each warp
// owns 32 rows (two m16 tiles, so every K and V fragment read from shared memory
// feeds two tensor-core products), and its scores, softmax statistics and output
// accumulator stay in registers. Key/value tiles of 64 rows (128 at D = 64) stream
// through shared memory, double-buffered with cp.async: the next tile's loads are in
// flight while the tensor cores work on this one. Two blocks share an SM (about 230
// registers a thread, 96 KB of shared memory a block at D = 128), so one block's
// softmax and barriers overlap the other's products: with one block of 8 warps of 16
// rows per SM the kernel ran at 145 TFLOP/s on an H200 (docs/cuda.md). Shared memory
// rows are swizzled (16-byte chunk c of row r lives at chunk c ^ (r % 8)), so the 8
// row addresses of every ldmatrix phase fall in 8 different bank groups.
// Scores are kept in base 2 (scale * log2 e folded in once), so the softmax is one
// ex2.approx per score. Causal blocks skip the tiles right of the diagonal and run
// heaviest first; only tiles that cross the diagonal, the key end or a mask pay for
// masking.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <cstdlib>

#include "attention/attention_cuda_kernel.h"
#include "attention/attention_cuda_mma.cuh"
#include "kernels/cuda/cuda_runtime.h"
#include "qkv/error.h"

namespace qkv::attention::cuda_kernel {

namespace {

constexpr int kWarps = 4;
constexpr int kM = 2;                  // m-tiles of 16 query rows per warp
constexpr int kBr = kWarps * 16 * kM;  // 128 query rows per block
constexpr int kThreads = kWarps * 32;

// ---- the per-block problem ---------------------------------------------------------

struct Block {
  const void* q;
  const void* k;
  const void* v;
  void* out;
  float* lse;
  const char* mask;  // bytes; element offset applied by the reader
  int64_t mask_offset;
  int64_t lq, lk;
  int64_t m0;  // first query row of the block
};

// Decodes blockIdx into the block's pointers and lengths; false when the block has no rows.
template <class T>
__device__ bool locate(const FlashParams& p, Block& b) {
  // Causal blocks run heaviest (last query tile) first within groups of order_group
  // entries (all of them by default); others entry by entry (order_group 0).
  const GridSlot slot = grid_slot(p.m_blocks, p.entries, p.order_group);
  const int64_t entry = slot.entry;
  const int64_t m_block = p.order_group > 0 ? p.m_blocks - 1 - slot.rank : slot.rank;
  int64_t rest = entry, q = 0, k = 0, v = 0, o = 0, l = 0, m = 0;
  for (int d = p.batch_ndim - 1; d >= 0; --d) {
    const int64_t index = rest % p.batch[d];
    rest /= p.batch[d];
    const int64_t kv_index = d == p.batch_ndim - 1 ? index / p.gqa_group : index;
    q += index * p.q_batch_stride[d];
    k += kv_index * p.k_batch_stride[d];
    v += kv_index * p.v_batch_stride[d];
    o += index * p.out_batch_stride[d];
    l += index * p.lse_batch_stride[d];
    m += index * p.mask_batch_stride[d];
  }
  b.lq = p.lq;
  b.lk = p.lk;
  if (p.cu_seqlens_q != nullptr) {
    const int64_t s = blockIdx.z, qs = p.cu_seqlens_q[s], ks = p.cu_seqlens_k[s];
    b.lq = p.cu_seqlens_q[s + 1] - qs;
    b.lk = p.cu_seqlens_k[s + 1] - ks;
    q += qs * p.q_row;
    k += ks * p.k_row;
    v += ks * p.v_row;
    o += qs * p.out_row;
    l += qs * p.lse_row;
  }
  b.m0 = m_block * kBr;
  if (b.m0 >= b.lq) return false;
  b.q = static_cast<const T*>(p.q) + q;
  b.k = static_cast<const T*>(p.k) + k;
  b.v = static_cast<const T*>(p.v) + v;
  b.out = static_cast<T*>(p.out) + o;
  b.lse = p.lse == nullptr ? nullptr : p.lse + l;
  b.mask = static_cast<const char*>(p.mask);
  b.mask_offset = m;
  return true;
}

// The mask's value for score (i, j) in base-2 units to add (bool False: -inf).
template <class T>
__device__ __forceinline__ float mask_value(const FlashParams& p, const Block& b, int64_t i, int64_t j) {
  const int64_t at = b.mask_offset + i * p.mask_row + j * p.mask_col;
  constexpr float kLog2e = 1.4426950408889634f;
  switch (p.mask_kind) {
    case MaskKind::boolean: return b.mask[at] != 0 ? 0.0f : -INFINITY;
    case MaskKind::f32: return reinterpret_cast<const float*>(b.mask)[at] * kLog2e;
    case MaskKind::same_as_q: return static_cast<float>(reinterpret_cast<const T*>(b.mask)[at]) * kLog2e;
    case MaskKind::none: break;
  }
  return 0.0f;
}

// ---- the kernel ---------------------------------------------------------------------

// One warp's state: kM m-tiles of 16 query rows (rows warp * 16 kM + 16 m + lane/4
// and + 8 of each); the row statistics are in base 2.
template <class T, int D>
struct Warp {
  float o[kM][D / 8][4];  // [16 kM, D] output accumulator, one per 8-column tile
  float row_max[kM][2];
  float row_sum[kM][2];  // this thread's part of the row sums
};

// Scales S to base 2 and, in tiles that need it, masks the keys a row must not see:
// past the key end, right of the diagonal, or the mask's. The bounds are relative to
// the tile in 32-bit ints (clamped), so a masked tile costs a few integer ops a score.
template <class T, int D, int BC>
__device__ __forceinline__ void scale_and_mask(const FlashParams& p, const Block& b, int64_t n0, bool masked,
                                               float (&s)[kM][BC / 8][4]) {
  const int lane = threadIdx.x % 32, row0 = threadIdx.x / 32 * 16 * kM;
  if (!masked) {
#pragma unroll
    for (int m = 0; m < kM; ++m) {
#pragma unroll
      for (int n = 0; n < BC / 8; ++n) {
#pragma unroll
        for (int e = 0; e < 4; ++e) s[m][n][e] *= p.scale_log2;
      }
    }
    return;
  }
  constexpr int64_t kFar = 1 << 30;
  // Key jr of the tile is visible when jr < key_limit and (not causal) jr - ir <= diagonal.
  const int key_limit = static_cast<int>(min(b.lk - n0, kFar));
  const int diagonal = p.causal ? static_cast<int>(max(min(b.m0 - n0, kFar), -kFar)) : static_cast<int>(kFar);
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int n = 0; n < BC / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int ir = row0 + m * 16 + lane / 4 + (e / 2) * 8;  // query row in the block
        const int jr = n * 8 + 2 * (lane % 4) + (e % 2);        // key in the tile
        float x = s[m][n][e] * p.scale_log2;
        if (jr >= key_limit || jr - ir > diagonal) {
          x = -INFINITY;
        } else if (p.mask_kind != MaskKind::none && b.m0 + ir < b.lq) {
          x += mask_value<T>(p, b, b.m0 + ir, n0 + jr);
        }
        s[m][n][e] = x;
      }
    }
  }
}

// Online softmax of one tile: new row maxima, the old accumulator rescaled, S
// replaced by P = exp2(S - max).
template <class T, int D, int BC>
__device__ __forceinline__ void softmax_tile(Warp<T, D>& w, float (&s)[kM][BC / 8][4]) {
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float mx = w.row_max[m][r];
#pragma unroll
      for (int n = 0; n < BC / 8; ++n) mx = fmaxf(mx, fmaxf(s[m][n][2 * r], s[m][n][2 * r + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 threads of a row
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      // A row with no visible key yet keeps max -inf: subtract 0 instead (exp2(-inf) = 0).
      const float base = mx == -INFINITY ? 0.0f : mx;
      const float correction = exp2_approx(w.row_max[m][r] - base);
      w.row_max[m][r] = mx;
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < BC / 8; ++n) {
        s[m][n][2 * r] = exp2_approx(s[m][n][2 * r] - base);
        s[m][n][2 * r + 1] = exp2_approx(s[m][n][2 * r + 1] - base);
        sum += s[m][n][2 * r] + s[m][n][2 * r + 1];
      }
      w.row_sum[m][r] = w.row_sum[m][r] * correction + sum;
#pragma unroll
      for (int t = 0; t < D / 8; ++t) {
        w.o[m][t][2 * r] *= correction;
        w.o[m][t][2 * r + 1] *= correction;
      }
    }
  }
}

// O / l to the output (through the warp's own rows of the Q tile, for 16-byte
// stores), and the logsumexp.
template <class T, int D>
__device__ __forceinline__ void write_out(const FlashParams& p, const Block& b, Warp<T, D>& w, T* sq) {
  const int lane = threadIdx.x % 32, row0 = threadIdx.x / 32 * 16 * kM;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      float l = w.row_sum[m][r];
      l += __shfl_xor_sync(0xffffffffu, l, 1);
      l += __shfl_xor_sync(0xffffffffu, l, 2);
      // No visible key: output 0 and lse -inf (log 0); a NaN sum stays NaN.
      const float inv = l == 0.0f ? 0.0f : 1.0f / l;
      const int row = row0 + m * 16 + lane / 4 + 8 * r;
#pragma unroll
      for (int t = 0; t < D / 8; ++t) {
        const uint32_t pair = pack2<T>(w.o[m][t][2 * r] * inv, w.o[m][t][2 * r + 1] * inv);
        *reinterpret_cast<uint32_t*>(sq + swizzle<D>(row, t) + 2 * (lane % 4)) = pair;
      }
      const int64_t i = b.m0 + row;
      if (b.lse != nullptr && lane % 4 == 0 && i < b.lq) {
        constexpr float kLn2 = 0.6931471805599453f;
        b.lse[i * p.lse_row] = l == 0.0f ? -INFINITY : (w.row_max[m][r] + __log2f(l)) * kLn2;
      }
    }
  }
  __syncwarp();
  constexpr int kChunks = D / 8;
  T* out = static_cast<T*>(b.out);
#pragma unroll
  for (int c = lane; c < 16 * kM * kChunks; c += 32) {
    const int row = row0 + c / kChunks, chunk = c % kChunks;
    const int64_t i = b.m0 + row;
    if (i < b.lq) {
      *reinterpret_cast<uint4*>(out + i * p.out_row + chunk * 8) =
          *reinterpret_cast<const uint4*>(sq + swizzle<D>(row, chunk));
    }
  }
}

template <class T, int D, int BC>
__global__ void __launch_bounds__(kThreads, 2) flash_forward(const __grid_constant__ FlashParams p) {
  constexpr int kBc = BC;
  extern __shared__ __align__(128) unsigned char smem[];
  T* sq = reinterpret_cast<T*>(smem);  // [kBr, D]
  T* sk = sq + kBr * D;                // [2][kBc, D]
  T* sv = sk + 2 * kBc * D;            // [2][kBc, D]
  Block b;
  if (!locate<T>(p, b)) return;
  const T* q = static_cast<const T*>(b.q);
  const T* k = static_cast<const T*>(b.k);
  const T* v = static_cast<const T*>(b.v);

  // Key tiles this block needs: all, or up to its last row's diagonal when causal.
  const int64_t last_row = min(b.m0 + kBr, b.lq) - 1;
  const int64_t key_end = p.causal ? min(b.lk, last_row + 1) : b.lk;
  const int tiles = static_cast<int>((key_end + kBc - 1) / kBc);

  load_tile<kBr, D, kThreads>(sq, q, p.q_row, b.m0, b.lq);
  load_tile<kBc, D, kThreads>(sk, k, p.k_row, 0, b.lk);
  load_tile<kBc, D, kThreads>(sv, v, p.v_row, 0, b.lk);
  cp_async_commit();

  Warp<T, D> w;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
#pragma unroll
    for (int t = 0; t < D / 8; ++t) w.o[m][t][0] = w.o[m][t][1] = w.o[m][t][2] = w.o[m][t][3] = 0.0f;
    w.row_max[m][0] = w.row_max[m][1] = -INFINITY;
    w.row_sum[m][0] = w.row_sum[m][1] = 0.0f;
  }
  for (int n = 0; n < tiles; ++n) {
    const int stage = n & 1;
    if (n + 1 < tiles) {  // the next tile's loads fly while this one computes
      load_tile<kBc, D, kThreads>(sk + (stage ^ 1) * kBc * D, k, p.k_row, int64_t{n + 1} * kBc, b.lk);
      load_tile<kBc, D, kThreads>(sv + (stage ^ 1) * kBc * D, v, p.v_row, int64_t{n + 1} * kBc, b.lk);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int64_t n0 = int64_t{n} * kBc;
    const bool masked = n0 + kBc > b.lk || (p.causal && n0 + kBc - 1 > b.m0) || p.mask_kind != MaskKind::none;
    uint32_t pk[kM][kBc / 16][4];
    {
      float s[kM][kBc / 8][4];
      mma_abt<T, D, kM, BC>(sq, threadIdx.x / 32 * 16 * kM, sk + stage * kBc * D, s);  // S = Q K^T
      scale_and_mask<T, D, BC>(p, b, n0, masked, s);
      softmax_tile<T, D, BC>(w, s);
      pack_rows<T, kM, BC>(s, pk);
    }
    mma_ab_packed<T, D, kM, BC>(pk, sv + stage * kBc * D, w.o);  // O += P V
    __syncthreads();  // every warp is done with this stage before it is refilled
  }
  cp_async_wait<0>();  // no tile: the first loads still land before the block ends
  __syncthreads();
  write_out<T, D>(p, b, w, sq);
}

template <class T, int D, int BC>
void launch(const FlashParams& p, cudaStream_t stream, const char* op) {
  constexpr int kSmem = (kBr * D + 4 * BC * D) * static_cast<int>(sizeof(T));
  auto* kernel = flash_forward<T, D, BC>;
  kernels::cuda::check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), op,
                       "cudaFuncSetAttribute (dynamic shared memory)");
  // All of L1 as shared memory, so that two blocks (2 x 96 KB at D = 128) share an SM.
  kernels::cuda::check(
      cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared), op,
      "cudaFuncSetAttribute (shared memory carveout)");
  FlashParams f = p;
  f.m_blocks = (p.max_lq + kBr - 1) / kBr;
  f.entries = 1;
  for (int d = 0; d < p.batch_ndim; ++d) f.entries *= p.batch[d];
  if (f.m_blocks * f.entries > INT32_MAX || p.sequences > 65535) {
    fail<ValueError>(op, ": the CUDA kernel takes at most 2^31 - 1 blocks of ", kBr, " query rows (got ", f.m_blocks,
                     " x ", f.entries, " batch entries) and 65535 sequences (got ", p.sequences, ")");
  }
  f.order_group = p.causal ? order_group(f.entries, "QKV_CUDA_FLASH_GROUP") : 0;
  const dim3 grid(static_cast<unsigned>(f.m_blocks * f.entries), 1, static_cast<unsigned>(p.sequences));
  kernel<<<grid, kThreads, kSmem, stream>>>(f);
  kernels::cuda::check(cudaGetLastError(), op, "the FlashAttention kernel's launch");
}

// Key/value rows per tile: QKV_CUDA_FLASH_BC=32 or 64 (read once) for tuning runs,
// else the default measured fastest (docs/cuda.md).
int key_tile_rows() {
  static const int rows = kernels::cuda::env_int("QKV_CUDA_FLASH_BC", 64) == 32 ? 32 : 64;
  return rows;
}

template <class T, int D>
void launch_tiles(const FlashParams& p, cudaStream_t stream, const char* op) {
  key_tile_rows() == 32 ? launch<T, D, 32>(p, stream, op) : launch<T, D, 64>(p, stream, op);
}

}  // namespace

// All the entries (one longest-first order over the whole grid), unless the knob asks
// for N, for measuring. On an H100 (docs/cuda.md) the forward's whole grid ran 8% faster
// than entry by entry at (4, 16, 4096) and (1, 16, 16384); smaller groups did as well
// only when the last group was not much smaller than the others (its blocks are the tail).
int64_t order_group(int64_t entries, const char* knob) {
  const int64_t forced = kernels::cuda::env_int(knob, 0);
  const int64_t all = std::max<int64_t>(1, entries);
  return forced > 0 ? std::min(forced, all) : all;  // (a group past the entries is all of them)
}

void launch_flash_forward(const FlashParams& p, void* stream_handle, const char* op) {
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const bool bf16 = p.type == ElementType::bf16;
  if (p.head_dim == 64) {
    bf16 ? launch_tiles<__nv_bfloat16, 64>(p, stream, op) : launch_tiles<__half, 64>(p, stream, op);
  } else {
    bf16 ? launch_tiles<__nv_bfloat16, 128>(p, stream, op) : launch_tiles<__half, 128>(p, stream, op);
  }
}

}  // namespace qkv::attention::cuda_kernel
