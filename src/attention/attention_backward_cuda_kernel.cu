// FlashAttention-2's backward (Dao 2023, Algorithm 2) on tensor cores, bf16 or f16
// operands with float32 accumulation, for sm_80 and later (mma.sync m16n8k16, ldmatrix,
// cp.async; Hopper runs the same code). Four launches on one stream:
//
//  1. zero the float32 accumulators of dQ, dK, dV (cudaMemsetAsync);
//  2. preprocess: per query row D_i = dO_i . O_i and lse_i log2 e (+inf for a row that
//     saw no key, so that its P is exp2(-inf) = 0), padded to whole query tiles;
//  3. the main kernel, key-major: one block owns BC = 128 keys (8 warps; 64 keys and 4
//     warps with QKV_CUDA_BWD_BC=64, for tuning runs) of one batch entry (each warp 16
//     keys, an m16 tile), keeps K_j and V_j in shared memory and its
//     dK_j, dV_j accumulators in registers, and walks the query tiles i of 64 rows that
//     see its keys (causal: from the tile holding row j0 on), Q_i and dO_i double-
//     buffered with cp.async. Keys are the rows of every product it keeps, so the
//     transposed products come straight from accumulator registers:
//        S^T = K Q^T, P^T = exp2(S^T scale log2 e - lse_i log2 e)      (per column i)
//        dV += P^T dO,  dP^T = V dO^T,  dS^T = P^T o (dP^T - D_i),  dK += dS^T Q
//     and dQ_i += dS K through shared memory: dS^T is stored once, read back transposed
//     (ldmatrix .trans) as the A operand, and each warp adds its 16 rows (times D / (BC
//     / 64) columns) of dQ_i to the float32 accumulator with atomics (several key blocks add to one dQ row). dK and dV
//     are added the same way at the end, so that GQA groups and broadcast operands sum;
//  4. convert the accumulators to q's type.
// P and dS are rounded to bf16/f16 for the products (as FlashAttention does); D, the
// statistics and every sum are float32.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <utility>

#include "attention/attention_backward_cuda_kernel.h"
#include "attention/attention_cuda_mma.cuh"
#include "kernels/cuda/cuda_runtime.h"
#include "qkv/error.h"

namespace qkv::attention::cuda_kernel {

namespace {

// The main kernel's key tile BC (a template parameter: 64 or 128 keys per block) has
// BC / 16 warps, each owning an m16 tile of keys. dQ_i splits over them as kBr / 16 = 4
// m16 tiles of rows times BC / 64 groups of columns.
constexpr int kBr = kBackwardQueryTile;  // query rows per step
constexpr float kLog2e = 1.4426950408889634f;
// The dS tile [BC, kBr] is swizzled like the others: 8 chunks of 16 bytes a row.
static_assert(kBr == 64, "8 chunks per dS row; 4 m16 tiles of dQ rows");

template <int BC>
constexpr int kThreadsOf = BC * 2;  // BC / 16 warps

// ---- one batch entry ----------------------------------------------------------------

// Element offsets of batch entry `entry` (row-major over f.batch, heads last) in every
// operand; k, v and their gradients divide the head index by the GQA group.
struct Offsets {
  int64_t q = 0, k = 0, v = 0, out = 0, lse = 0, dout = 0, mask = 0, dq = 0, dk = 0, dv = 0;
};

__device__ __forceinline__ Offsets offsets_of(const FlashBackwardParams& p, int64_t entry) {
  const FlashParams& f = p.f;
  Offsets o;
  int64_t rest = entry;
  for (int d = f.batch_ndim - 1; d >= 0; --d) {
    const int64_t index = rest % f.batch[d];
    rest /= f.batch[d];
    const int64_t kv_index = d == f.batch_ndim - 1 ? index / f.gqa_group : index;
    o.q += index * f.q_batch_stride[d];
    o.k += kv_index * f.k_batch_stride[d];
    o.v += kv_index * f.v_batch_stride[d];
    o.out += index * f.out_batch_stride[d];
    o.lse += index * f.lse_batch_stride[d];
    o.dout += index * p.dout_batch_stride[d];
    o.mask += index * f.mask_batch_stride[d];
    o.dq += index * p.dq_batch_stride[d];
    o.dk += kv_index * p.dk_batch_stride[d];
    o.dv += kv_index * p.dv_batch_stride[d];
  }
  return o;
}

// The mask's value at element offset `at`, in base-2 units to add (bool False: -inf).
template <class T>
__device__ __forceinline__ float mask_log2(const FlashParams& f, int64_t at) {
  const char* m = static_cast<const char*>(f.mask);
  switch (f.mask_kind) {
    case MaskKind::boolean: return m[at] != 0 ? 0.0f : -INFINITY;
    case MaskKind::f32: return reinterpret_cast<const float*>(m)[at] * kLog2e;
    case MaskKind::same_as_q: return static_cast<float>(reinterpret_cast<const T*>(m)[at]) * kLog2e;
    case MaskKind::none: break;
  }
  return 0.0f;
}

// ---- 2. preprocess ------------------------------------------------------------------

constexpr int kPreThreads = 128;
constexpr int kRowThreads = 8;              // threads per query row
constexpr int kPreRows = kBackwardPreRows;  // rows per block (divides kBr)
static_assert(kPreRows * kRowThreads == kPreThreads && kBr % kPreRows == 0, "the grid covers whole query tiles");

// delta[entry, i] = dO_i . O_i in float32 (of the forward's rounded O, as FlashAttention),
// lse2[entry, i] = lse_i log2 e; rows past Lq: 0 and +inf. Grid: lq_padded / kPreRows
// blocks per entry, times the entries.
template <class T, int D>
__global__ void __launch_bounds__(kPreThreads) backward_preprocess(const __grid_constant__ FlashBackwardParams p) {
  const FlashParams& f = p.f;
  const int64_t row_blocks = p.lq_padded / kPreRows, entry = blockIdx.x / row_blocks;
  const int64_t row = blockIdx.x % row_blocks * kPreRows + threadIdx.x / kRowThreads;
  const Offsets at = offsets_of(p, entry);
  float acc = 0.0f, lse2 = INFINITY;
  if (row < f.lq) {
    const T* o = static_cast<const T*>(f.out) + at.out + row * f.out_row;
    const T* g = static_cast<const T*>(p.dout) + at.dout + row * p.dout_row;
#pragma unroll
    for (int c = threadIdx.x % kRowThreads; c < D / 8; c += kRowThreads) {  // 16-byte chunks
      const uint4 ov = *reinterpret_cast<const uint4*>(o + c * 8);
      const uint4 gv = *reinterpret_cast<const uint4*>(g + c * 8);
      const T* oe = reinterpret_cast<const T*>(&ov);
      const T* ge = reinterpret_cast<const T*>(&gv);
#pragma unroll
      for (int x = 0; x < 8; ++x) acc += static_cast<float>(oe[x]) * static_cast<float>(ge[x]);
    }
    const float l = f.lse[at.lse + row * f.lse_row];
    lse2 = l == -INFINITY ? INFINITY : l * kLog2e;
  }
  // The row's kRowThreads threads are consecutive lanes; every lane of the warp takes part.
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  acc += __shfl_xor_sync(0xffffffffu, acc, 4);
  if (threadIdx.x % kRowThreads == 0) {
    p.delta[entry * p.lq_padded + row] = acc;
    p.lse2[entry * p.lq_padded + row] = lse2;
  }
}

// ---- 3. the main kernel: tile products ------------------------------------------------

// Columns of dQ_i per warp: D split over the BC / 64 warps that share an m16 tile of rows.
template <int D, int BC>
constexpr int kDqColumns = D / (BC / 64);

// The warp's m16 tile of dQ rows (0-3) and its group of kDqColumns columns (0, or 0-1 with
// 8 warps): warp % 4 and warp / 4, spelled so that 4 warps pay nothing for them.
template <int BC>
__device__ __forceinline__ int dq_rows(int warp) {
  return BC == 64 ? warp : warp % 4;
}
template <int BC>
__device__ __forceinline__ int dq_group(int warp) {
  return BC == 64 ? 0 : warp / 4;
}

// c = dS K for the warp's 16 rows of the step (rows warp % 4 * 16 + 0..15) and its
// kDqColumns columns (from warp / 4 * kDqColumns), dS[i][j] = sds[j][i] (the stored
// dS^T, [BC, kBr]) and K the [BC, D] key tile. A[m][k] = sds[k][m]: ldmatrix .trans of
// the stored matrices of keys 0-7 / 0-7 / 8-15 / 8-15, query chunks 0 / 1 / 0 / 1 gives
// a0 (rows 0-7, k 0-7), a1 (rows 8-15), a2 (k 8-15), a3. B[k][n] = K[k][n]: as
// mma_ab_packed, from column chunk 2 (step0 + dp).
template <class T, int D, int BC>
__device__ __forceinline__ void query_gradient(const T* sds, const T* sk, float (&c)[kDqColumns<D, BC> / 8][4]) {
  constexpr int kCols = kDqColumns<D, BC>;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int rows = dq_rows<BC>(warp), step0 = dq_group<BC>(warp) * kCols / 16;
#pragma unroll
  for (int t = 0; t < kCols / 8; ++t) c[t][0] = c[t][1] = c[t][2] = c[t][3] = 0.0f;
#pragma unroll
  for (int kk = 0; kk < BC / 16; ++kk) {
    uint32_t a[4];
    const int key = kk * 16 + (lane % 8) + 8 * (lane / 16);
    ldmatrix_x4_trans(a, fragment_address<kBr>(smem_address(sds), key, rows, (lane / 8) % 2));
#pragma unroll
    for (int dp = 0; dp < kCols / 16; ++dp) {
      uint32_t b[4];
      const int row = kk * 16 + (lane % 8) + 8 * ((lane / 8) % 2);
      ldmatrix_x4_trans(b, fragment_address<D>(smem_address(sk), row, step0 + dp, lane / 16));
      mma_16816<T>(c[2 * dp], a, b[0], b[1]);
      mma_16816<T>(c[2 * dp + 1], a, b[2], b[3]);
    }
  }
}

// ---- 3. the main kernel: one step ------------------------------------------------------

// The block's shared-memory tiles; q, dout, lse2 and delta point at the step's stage.
template <class T>
struct Tiles {
  const T* k;          // [BC, D] the block's keys
  const T* v;          // [BC, D]
  const T* q;          // [kBr, D] the step's query rows (zeros past Lq)
  const T* dout;       // [kBr, D]
  T* ds;               // [BC, kBr] dS^T of the step
  const float* lse2;   // [kBr] lse_i log2 e (+inf past Lq)
  const float* delta;  // [kBr] D_i
};

// P^T in place of S^T: exp2(S^T scale log2 e + mask - lse_i log2 e), 0 for the keys a
// row must not see: past Lk, right of the diagonal (causal: key j > row i), masked out.
// Only steps that cross the key end or the diagonal, or have a mask, pay for the tests,
// in 32-bit tile-relative integers (clamped). Element e of c[n]: key warp * 16 + lane / 4
// + 8 (e / 2) of the block, query row n * 8 + 2 (lane % 4) + e % 2 of the step.
template <class T, int BC>
__device__ __forceinline__ void probabilities(const FlashParams& f, int64_t mask_base, int64_t n0, int64_t i0,
                                              const float* slse2, float (&s)[kBr / 8][4]) {
  const int lane = threadIdx.x % 32, key0 = threadIdx.x / 32 * 16;
  const bool masked = n0 + BC > f.lk || (f.causal && n0 + BC - 1 > i0) || f.mask_kind != MaskKind::none;
  constexpr int64_t kFar = 1 << 30;
  // Key jr of the block is visible to row ir of the step when jr < key_limit and jr - ir <= diagonal.
  const int key_limit = static_cast<int>(min(f.lk - n0, kFar));
  const int diagonal = f.causal ? static_cast<int>(max(min(i0 - n0, kFar), -kFar)) : static_cast<int>(kFar);
#pragma unroll
  for (int n = 0; n < kBr / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int jr = key0 + lane / 4 + 8 * (e / 2);
      const int ir = n * 8 + 2 * (lane % 4) + (e % 2);
      float x = s[n][e] * f.scale_log2;
      if (masked) {
        if (jr >= key_limit || jr - ir > diagonal) {
          x = -INFINITY;
        } else if (f.mask_kind != MaskKind::none && i0 + ir < f.lq) {
          x += mask_log2<T>(f, mask_base + (i0 + ir) * f.mask_row + (n0 + jr) * f.mask_col);
        }
      }
      // -inf - lse2 and x - (+inf) are -inf: weight 0 (a row past Lq or without keys).
      s[n][e] = exp2_approx(x - slse2[ir]);
    }
  }
}

// dS^T = P^T o (dP^T - D_i) in place of dP^T (the softmax's gradient; D_i per column).
__device__ __forceinline__ void softmax_gradient(const float (&s)[kBr / 8][4], const float* sdelta,
                                                 float (&dp)[kBr / 8][4]) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int n = 0; n < kBr / 8; ++n) {
#pragma unroll
    for (int e = 0; e < 4; ++e) dp[n][e] = s[n][e] * (dp[n][e] - sdelta[n * 8 + 2 * (lane % 4) + (e % 2)]);
  }
}

// The warp's packed dS^T (pack_rows' layout: a[kk][x] = rows lane / 4 + 8 (x % 2), columns
// 16 kk + 8 (x / 2) + 2 (lane % 4) + 0..1) into the swizzled [BC, kBr] tile.
template <class T>
__device__ __forceinline__ void store_ds(const uint32_t (&a)[kBr / 16][4], T* sds) {
  const int lane = threadIdx.x % 32, row0 = threadIdx.x / 32 * 16;
#pragma unroll
  for (int kk = 0; kk < kBr / 16; ++kk) {
#pragma unroll
    for (int x = 0; x < 4; ++x) {
      const int row = row0 + lane / 4 + 8 * (x % 2), chunk = 2 * kk + x / 2;
      *reinterpret_cast<uint32_t*>(sds + swizzle<kBr>(row, chunk) + 2 * (lane % 4)) = a[kk][x];
    }
  }
}

// p[0] += a, p[1] += b in global memory, results unused: one 8-byte red.global.add.v2.f32
// on sm_90 (p is 8-byte aligned: D and every stride of the accumulators are even), two
// float32 reductions before.
__device__ __forceinline__ void red_add2(float* p, float a, float b) {
#if __CUDA_ARCH__ >= 900
  asm volatile("red.global.add.v2.f32 [%0], {%1, %2};\n" ::"l"(p), "f"(a), "f"(b));  // nothing here reads it
#else
  atomicAdd(p, a);
  atomicAdd(p + 1, b);
#endif
}

// acc[row0 + r, :] += scale c[r, :] for the 16 rows r of an m16 accumulator tile (this
// thread's: row0 + lane / 4 and + 8) below `limit` and its 8 NT columns (acc points at
// the first), rows `stride` apart: red.global.add (float32; pairs on sm_90), since other
// blocks add to the same rows.
template <int NT>
__device__ __forceinline__ void add_rows(float* acc, int64_t stride, int64_t row0, int64_t limit,
                                         const float (&c)[NT][4], float scale) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int64_t row = row0 + lane / 4 + 8 * r;
    if (row >= limit) continue;
    float* out = acc + row * stride + 2 * (lane % 4);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      red_add2(out + 8 * t, c[t][2 * r] * scale, c[t][2 * r + 1] * scale);
    }
  }
}

// One query step i of the block's keys: dV += P^T dO, dK += dS^T Q (scaled at the end),
// dQ_i += scale dS K into the accumulator `dq` (the entry's rows).
template <class T, int D, int BC>
__device__ __forceinline__ void step(const FlashBackwardParams& p, const Tiles<T>& t, int64_t mask_base, int64_t n0,
                                     int64_t i0, float* dq, float (&dk)[1][D / 8][4], float (&dv)[1][D / 8][4]) {
  // One m-tile of 16 keys per warp (the [1] of the products' m-tile dimension).
  const int row0 = threadIdx.x / 32 * 16;
  uint32_t pk[1][kBr / 16][4];
  float s[1][kBr / 8][4];
  mma_abt<T, D, 1, kBr>(t.k, row0, t.q, s);  // S^T = K Q^T
  probabilities<T, BC>(p.f, mask_base, n0, i0, t.lse2, s[0]);
  pack_rows<T, 1, kBr>(s, pk);
  mma_ab_packed<T, D, 1, kBr>(pk, t.dout, dv);  // dV += P^T dO
  {
    float dp[1][kBr / 8][4];
    mma_abt<T, D, 1, kBr>(t.v, row0, t.dout, dp);  // dP^T = V dO^T
    softmax_gradient(s[0], t.delta, dp[0]);
    pack_rows<T, 1, kBr>(dp, pk);
  }
  mma_ab_packed<T, D, 1, kBr>(pk, t.q, dk);  // dK += dS^T Q
  store_ds<T>(pk[0], t.ds);
  __syncthreads();  // every warp's dS^T is in the tile
  constexpr int kCols = kDqColumns<D, BC>;
  float dqi[kCols / 8][4];
  query_gradient<T, D, BC>(t.ds, t.k, dqi);  // the warp's 16 rows of dS K
  const int warp = threadIdx.x / 32;
  add_rows<kCols / 8>(dq + dq_group<BC>(warp) * kCols, p.dq_row, i0 + dq_rows<BC>(warp) * 16, p.f.lq, dqi, p.scale);
}

// Step `i`'s operands into stage `stage`: Q_i and dO_i (zeros past Lq), lse2 and D.
template <class T, int D, int BC>
__device__ __forceinline__ void load_step(const FlashBackwardParams& p, const T* q, const T* dout, const float* lse2,
                                          const float* delta, T* sq, T* sdo, float* sstats, int i) {
  const int64_t i0 = int64_t{i} * kBr;
  load_tile<kBr, D, kThreadsOf<BC>>(sq, q, p.f.q_row, i0, p.f.lq);
  load_tile<kBr, D, kThreadsOf<BC>>(sdo, dout, p.dout_row, i0, p.f.lq);
  // sstats: [lse2 (kBr), D (kBr)] of the stage, 16-byte chunks (the scratch is padded to whole steps).
  constexpr int kChunks = kBr / 4;
  if (threadIdx.x < 2 * kChunks) {
    const int c = threadIdx.x % kChunks;
    const float* src = (threadIdx.x < kChunks ? lse2 : delta) + i0 + 4 * c;
    cp_async_16(sstats + (threadIdx.x < kChunks ? 0 : kBr) + 4 * c, src, true);
  }
}

// Grid: the key blocks of BC keys of the batch entries (grid_slot: entry by entry, or,
// causal, key block 0 — which sees the most rows — of every entry first, then block 1,
// ...: longest first over groups of f.order_group entries). Shared memory:
// K, V, then two stages of (Q_i, dO_i), the dS^T tile and two stages of (lse2, D).
template <class T, int D, int BC>
__global__ void __launch_bounds__(kThreadsOf<BC>, 128 / BC)
    flash_backward(const __grid_constant__ FlashBackwardParams p) {
  static_assert(BC == 64 || BC == 128, "64 or 128 keys per block");
  extern __shared__ __align__(128) unsigned char smem[];
  const FlashParams& f = p.f;
  const GridSlot slot = grid_slot((f.lk + BC - 1) / BC, f.entries, f.order_group);
  const int64_t entry = slot.entry, n0 = slot.rank * BC;
  // The steps that see these keys: all, or (causal: key j is seen by rows i >= j) from the one holding row n0.
  const int first = f.causal ? static_cast<int>(n0 / kBr) : 0;
  const int steps = static_cast<int>((f.lq + kBr - 1) / kBr);
  if (first >= steps) return;  // causal with Lk > Lq: no row sees these keys, dK = dV = 0
  T* sk = reinterpret_cast<T*>(smem);
  T* sv = sk + BC * D;
  T* sq = sv + BC * D;        // [2][kBr, D]
  T* sdo = sq + 2 * kBr * D;  // [2][kBr, D]
  T* sds = sdo + 2 * kBr * D;
  float* sstats = reinterpret_cast<float*>(sds + BC * kBr);  // [2][2 kBr]
  const Offsets at = offsets_of(p, entry);
  const T* q = static_cast<const T*>(f.q) + at.q;
  const T* dout = static_cast<const T*>(p.dout) + at.dout;
  const float* lse2 = p.lse2 + entry * p.lq_padded;
  const float* delta = p.delta + entry * p.lq_padded;
  load_tile<BC, D, kThreadsOf<BC>>(sk, static_cast<const T*>(f.k) + at.k, f.k_row, n0, f.lk);
  load_tile<BC, D, kThreadsOf<BC>>(sv, static_cast<const T*>(f.v) + at.v, f.v_row, n0, f.lk);
  load_step<T, D, BC>(p, q, dout, lse2, delta, sq, sdo, sstats, first);
  cp_async_commit();
  float dk[1][D / 8][4], dv[1][D / 8][4];  // the warp's 16 keys (one m-tile)
#pragma unroll
  for (int t = 0; t < D / 8; ++t) {
    dk[0][t][0] = dk[0][t][1] = dk[0][t][2] = dk[0][t][3] = 0.0f;
    dv[0][t][0] = dv[0][t][1] = dv[0][t][2] = dv[0][t][3] = 0.0f;
  }
  for (int i = first; i < steps; ++i) {
    const int stage = (i - first) & 1;
    if (i + 1 < steps) {  // the next step's loads fly while this one computes
      const int next = stage ^ 1;
      load_step<T, D, BC>(p, q, dout, lse2, delta, sq + next * kBr * D, sdo + next * kBr * D, sstats + next * 2 * kBr,
                          i + 1);
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const Tiles<T> t{sk,
                     sv,
                     sq + stage * kBr * D,
                     sdo + stage * kBr * D,
                     sds,
                     sstats + stage * 2 * kBr,
                     sstats + stage * 2 * kBr + kBr};
    step<T, D, BC>(p, t, at.mask, n0, int64_t{i} * kBr, p.dq_acc + at.dq, dk, dv);
    __syncthreads();  // every warp is done with this stage and the dS^T tile before they are refilled
  }
  const int64_t key0 = n0 + threadIdx.x / 32 * 16;  // the warp's keys
  add_rows<D / 8>(p.dk_acc + at.dk, p.dk_row, key0, f.lk, dk[0], p.scale);
  add_rows<D / 8>(p.dv_acc + at.dv, p.dv_row, key0, f.lk, dv[0], 1.0f);
}

// ---- 4. conversion and the launch ---------------------------------------------------------

template <class T>
__global__ void to_type(const float* __restrict__ src, T* __restrict__ dst, int64_t n) {
  const int64_t stride = int64_t{gridDim.x} * blockDim.x;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = T(src[i]);
}

template <class T>
void convert(const float* src, void* dst, int64_t n, cudaStream_t stream, const char* op) {
  if (n == 0) return;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((n + 255) / 256, 8192));
  to_type<T><<<blocks, 256, 0, stream>>>(src, static_cast<T*>(dst), n);
  kernels::cuda::check(cudaGetLastError(), op, "the backward's conversion kernel's launch");
}

// Shared memory of a main-kernel block: K, V, two stages of Q and dO, dS^T, two
// stages of the row statistics.
template <class T, int D, int BC>
constexpr int main_smem_bytes() {
  return (2 * BC * D + 4 * kBr * D + BC * kBr) * static_cast<int>(sizeof(T)) +
         4 * kBr * static_cast<int>(sizeof(float));
}

template <class T, int D, int BC>
void launch_main(const FlashBackwardParams& p, int64_t entries, cudaStream_t stream, const char* op) {
  using kernels::cuda::check;
  constexpr int kSmem = main_smem_bytes<T, D, BC>();
  auto* kernel = flash_backward<T, D, BC>;
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSmem), op,
        "cudaFuncSetAttribute (dynamic shared memory)");
  // All of L1 as shared memory: two blocks of 64 keys (2 x 105 KB at D = 128) share an
  // SM; one of 128 keys takes 145 KB.
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared),
        op, "cudaFuncSetAttribute (shared memory carveout)");
  const auto grid = static_cast<unsigned>((p.f.lk + BC - 1) / BC * entries);  // checked by the host
  kernel<<<grid, kThreadsOf<BC>, kSmem, stream>>>(p);
  check(cudaGetLastError(), op, "the FlashAttention backward kernel's launch");
}

// Keys per block of the main kernel: 128 (8 warps), measured 5-11% faster than 64 on
// an H100 at D = 128 (docs/cuda.md); QKV_CUDA_BWD_BC=64 or 128 (read once) for tuning.
int key_tile_keys() {
  static const int keys = kernels::cuda::env_int("QKV_CUDA_BWD_BC", 128) == 64 ? 64 : 128;
  return keys;
}

// The key tile for this GPU: key_tile_keys(), or 64 where a block may not have the
// 128-key tile's shared memory (145 KB at D = 128: sm_86/sm_89 GPUs allow 99 KB a
// block); a ValueError where neither fits.
template <class T, int D>
int key_tile_for_device(const char* op) {
  int device = 0, most = 0;
  kernels::cuda::check(cudaGetDevice(&device), op, "cudaGetDevice");
  kernels::cuda::check(cudaDeviceGetAttribute(&most, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), op,
                       "cudaDeviceGetAttribute (shared memory per block)");
  if (key_tile_keys() == 128 && main_smem_bytes<T, D, 128>() <= most) return 128;
  if (main_smem_bytes<T, D, 64>() <= most) return 64;
  fail<ValueError>(op, ": the backward kernel at head dim ", D, " needs ", main_smem_bytes<T, D, 64>(),
                   " bytes of shared memory a block; cuda:", device, " allows ", most);
}

template <class T, int D>
void launch_typed(const FlashBackwardParams& p, cudaStream_t stream, const char* op) {
  using kernels::cuda::check;
  const FlashParams& f = p.f;
  const int key_tile = key_tile_for_device<T, D>(op);  // before anything is queued
  const std::pair<float*, int64_t> accumulators[] = {
      {p.dq_acc, p.dq_numel}, {p.dk_acc, p.dk_numel}, {p.dv_acc, p.dv_numel}};
  for (const auto& [acc, n] : accumulators) {
    if (n > 0) check(cudaMemsetAsync(acc, 0, static_cast<size_t>(n) * sizeof(float), stream), op, "cudaMemsetAsync");
  }
  FlashBackwardParams g = p;
  g.f.entries = 1;
  for (int d = 0; d < f.batch_ndim; ++d) g.f.entries *= f.batch[d];
  // Causal: longest first over the whole grid (QKV_CUDA_BWD_GROUP=N for groups of N).
  g.f.order_group = f.causal ? order_group(g.f.entries, "QKV_CUDA_BWD_GROUP") : 0;
  const int64_t entries = g.f.entries;
  if (entries > 0 && f.lq > 0 && f.lk > 0) {
    // (the host checked that both grids fit in 2^31 - 1 blocks)
    const auto pre = static_cast<unsigned>(p.lq_padded / kPreRows * entries);
    backward_preprocess<T, D><<<pre, kPreThreads, 0, stream>>>(g);
    check(cudaGetLastError(), op, "the backward preprocess kernel's launch");
    key_tile == 128 ? launch_main<T, D, 128>(g, entries, stream, op) : launch_main<T, D, 64>(g, entries, stream, op);
  }
  convert<T>(p.dq_acc, p.dq, p.dq_numel, stream, op);
  convert<T>(p.dk_acc, p.dk, p.dk_numel, stream, op);
  convert<T>(p.dv_acc, p.dv, p.dv_numel, stream, op);
}

}  // namespace

void launch_flash_backward(const FlashBackwardParams& p, void* stream_handle, const char* op) {
  const auto stream = static_cast<cudaStream_t>(stream_handle);
  const bool bf16 = p.f.type == ElementType::bf16;
  if (p.f.head_dim == 64) {
    bf16 ? launch_typed<__nv_bfloat16, 64>(p, stream, op) : launch_typed<__half, 64>(p, stream, op);
  } else {
    bf16 ? launch_typed<__nv_bfloat16, 128>(p, stream, op) : launch_typed<__half, 128>(p, stream, op);
  }
}

}  // namespace qkv::attention::cuda_kernel
