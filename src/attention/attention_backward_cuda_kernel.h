// The CUDA FlashAttention-2 backward kernels' parameters (attention_backward_cuda_kernel.cu),
// filled by the host side (attention_backward_cuda.cc) from a checked attention::Problem.
// Plain data: no CUDA headers, so C++ code fills it.
#pragma once

#include <cstdint>

#include "attention/attention_cuda_kernel.h"

namespace qkv::attention::cuda_kernel {

// One backward call: the forward's geometry and operands (`f`: q, k, v, the mask,
// out = the forward's output O, lse = its natural-log logsumexp, both read), dO, and
// the float32 accumulators of the gradients. The accumulators are contiguous buffers in
// the gradients' (the user's q, k, v) shapes; their strides below are those of their views
// expanded to the problem's batch (0 along a broadcast dim, so that every entry that read
// an element adds into it). The launch zeroes them and writes dq, dk, dv in q's type.
struct FlashBackwardParams {
  FlashParams f;  // f.out: O [batch..., Lq, Dv]; f.lse: [batch..., Lq] (rows f.lse_row apart)

  const void* dout = nullptr;  // dO [batch..., Lq, Dv], rows dout_row apart
  int64_t dout_batch_stride[kMaxBatchDims] = {};
  int64_t dout_row = 0;

  float* dq_acc = nullptr;  // [q's shape] float32: scale dS K summed
  float* dk_acc = nullptr;  // [k's shape]: scale dS^T Q summed over the entries sharing a k row
  float* dv_acc = nullptr;  // [v's shape]: P^T dO summed likewise
  int64_t dq_batch_stride[kMaxBatchDims] = {};
  int64_t dk_batch_stride[kMaxBatchDims] = {};  // of k's own (undivided) batch dims, as f.k_batch_stride
  int64_t dv_batch_stride[kMaxBatchDims] = {};
  int64_t dq_row = 0, dk_row = 0, dv_row = 0;
  int64_t dq_numel = 0, dk_numel = 0, dv_numel = 0;

  void* dq = nullptr;  // the results in q's type, contiguous, *_numel elements each
  void* dk = nullptr;
  void* dv = nullptr;

  // Scratch, [entries, lq_padded] float32 each (lq_padded: Lq rounded up to the query
  // tile, kBackwardQueryTile): D_i = dO_i . O_i (0 past Lq) and lse_i log2 e (+inf past Lq
  // and for a row without a visible key, so that its P is exp2(-inf) = 0).
  float* delta = nullptr;
  float* lse2 = nullptr;
  int64_t lq_padded = 0;

  float scale = 0;  // the softmax scale (f.scale_log2 is scale log2 e)
};

constexpr int kBackwardQueryTile = 64;  // query rows per step of the backward's main loop
// Keys per block of the main kernel at its smaller tile (the default is 128): the grid check's.
constexpr int kBackwardKeyTile = 64;
constexpr int kBackwardPreRows = 16;  // query rows per block of the preprocess

// Queues zeroing, the preprocess, the main kernel and the conversion on `stream` (a
// cudaStream_t) of the current device. DeviceError naming `op` when a launch fails.
void launch_flash_backward(const FlashBackwardParams& params, void* stream, const char* op);

}  // namespace qkv::attention::cuda_kernel
