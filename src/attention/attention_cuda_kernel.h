// The CUDA FlashAttention-2 forward kernel's parameters (attention_cuda_kernel.cu),
// filled by the host side (attention_cuda.cc) from a checked attention::Problem or a
// checked variable-length call. Plain data: no CUDA headers, so C++ code fills it.
#pragma once

#include <cstdint>

namespace qkv::attention::cuda_kernel {

constexpr int kMaxBatchDims = 4;  // leading dims of q, k, v (heads last) the kernel decodes

enum class MaskKind : int32_t { none, boolean, f32, same_as_q };
enum class ElementType : int32_t { bf16, f16 };

// One launch: grid (query tiles x batch entries, 1, sequences). A batch entry is one
// multi-index over `batch` (heads last); a sequence is one of a varlen batch's
// (cu_seqlens), else there is one. Offsets count elements; the last dim of q, k, v
// and the output is contiguous and every row starts on 16 bytes.
struct FlashParams {
  const void* q = nullptr;  // [batch..., Lq, D] rows q_row apart
  const void* k = nullptr;  // [batch'..., Lk, D] (k/v heads = q heads / gqa_group)
  const void* v = nullptr;  // [batch'..., Lk, D]
  void* out = nullptr;      // [batch..., Lq, D] in q's type
  float* lse = nullptr;     // [batch..., Lq] natural-log logsumexp; null: not written
  const void* mask = nullptr;
  MaskKind mask_kind = MaskKind::none;
  ElementType type = ElementType::bf16;
  int32_t head_dim = 0;  // 64 or 128 (Dk == Dv)

  int32_t batch_ndim = 0;
  int64_t batch[kMaxBatchDims] = {};
  int64_t q_batch_stride[kMaxBatchDims] = {};
  int64_t k_batch_stride[kMaxBatchDims] = {};  // of k's own (undivided) batch dims
  int64_t v_batch_stride[kMaxBatchDims] = {};
  int64_t out_batch_stride[kMaxBatchDims] = {};
  int64_t lse_batch_stride[kMaxBatchDims] = {};
  int64_t mask_batch_stride[kMaxBatchDims] = {};
  int64_t gqa_group = 1;  // q heads per k/v head (divides the last batch index for k, v)

  int64_t q_row = 0, k_row = 0, v_row = 0, out_row = 0, lse_row = 1;  // strides between rows
  int64_t mask_row = 0, mask_col = 0;

  // Lengths, or per sequence from cu_seqlens (int32 [sequences + 1] on the device:
  // sequence s is rows cu[s] .. cu[s+1] of q / k, out and lse).
  int64_t lq = 0, lk = 0;
  const int32_t* cu_seqlens_q = nullptr;
  const int32_t* cu_seqlens_k = nullptr;
  int64_t max_lq = 0;  // the longest sequence (sizes the grid)
  int64_t sequences = 1;

  float scale_log2 = 0;  // scale * log2(e): scores are kept in base 2
  bool causal = false;   // key j attends to query i when j <= i (top-left), per sequence

  // Set by the launches: the grid's x runs over m_blocks query tiles (the backward: key
  // blocks) times `entries` batch entries; order_group > 0 (causal) orders them heaviest
  // first within groups of order_group entries, else (0) entry by entry in order.
  int64_t m_blocks = 0, entries = 0, order_group = 0;
};

// Entries per heaviest-first group of a causal grid (FlashParams::order_group): all of
// `entries`, unless the environment variable `knob` (QKV_CUDA_FLASH_GROUP for the
// forward, QKV_CUDA_BWD_GROUP for the backward) is set to N > 0, for measuring.
int64_t order_group(int64_t entries, const char* knob);

// Queues the kernel on `stream` (a cudaStream_t) of the current device. DeviceError
// naming `op` when the launch fails.
void launch_flash_forward(const FlashParams& params, void* stream, const char* op);

}  // namespace qkv::attention::cuda_kernel
