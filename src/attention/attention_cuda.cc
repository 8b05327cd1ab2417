// Host side of the CUDA attention kernel: what it supports, the operands' layout
// (16-byte rows, else a contiguous copy on the device), the outputs, and the launch
// parameters (attention_cuda_kernel.h) of a checked Problem or VarlenProblem.
#include "attention/attention_cuda.h"

#include <cmath>
#include <cstdint>

#include "attention/attention_cuda_kernel.h"
#include "kernels/cuda/cuda_runtime.h"
#include "qkv/allocator.h"
#include "qkv/cuda.h"

namespace qkv::attention {

namespace {

using cuda_kernel::FlashParams;
constexpr double kLog2e = 1.4426950408889634;
constexpr int64_t kMaxGridZ = 65535;  // sequences of a varlen batch

}  // namespace

// What the kernel computes, checked once per call (errors name the op and the device).
void check_supported(const char* op, const AttentionOptions& o, const Tensor& q, const Tensor& k, const Tensor& v,
                     int64_t dk, int64_t dv) {
  const std::string dev = q.device().to_string();
  if (o.dropout_p > 0) fail<ValueError>(op, ": dropout_p > 0 has no kernel on ", dev, " (pass dropout_p=0)");
  if (o.return_weights) fail<ValueError>(op, ": return_weights has no kernel on ", dev, " (weights stay on the CPU)");
  if (o.mods.any()) fail<ValueError>(op, ": score and mask modifiers (mods) have no kernel on ", dev);
  if (q.dtype() != DType::bf16 && q.dtype() != DType::f16) {
    fail<DTypeError>(op, ": the kernel on ", dev, " takes bfloat16 or float16 q, k, v; got ", dtype_name(q.dtype()));
  }
  if (k.dtype() != q.dtype() || v.dtype() != q.dtype()) {
    fail<DTypeError>(op, ": q, k and v must share one dtype on ", dev, ", got ", dtype_name(q.dtype()), ", ",
                     dtype_name(k.dtype()), ", ", dtype_name(v.dtype()));
  }
  if (dk != dv || (dk != 64 && dk != 128)) {
    fail<ValueError>(op, ": the kernel on ", dev, " takes head dims Dk == Dv in {64, 128}, got Dk = ", dk,
                     ", Dv = ", dv, " (q ", shape_str(q.shape()), ", v ", shape_str(v.shape()), ")");
  }
}

namespace {

// Rows the kernel's 16-byte loads can read: the last dim contiguous, the storage
// offset and every other stride a multiple of 8 elements (16 bytes).
bool rows_aligned(const Tensor& t) {
  if (t.size(-1) > 1 && t.stride(-1) != 1) return false;
  if (reinterpret_cast<uintptr_t>(t.raw_data()) % 16 != 0) return false;
  for (int64_t d = 0; d + 1 < t.dim(); ++d) {
    if (t.size(d) > 1 && t.stride(d) % 8 != 0) return false;
  }
  return true;
}

}  // namespace

Tensor kernel_layout(const Tensor& t) { return rows_aligned(t) ? t : t.clone(); }

namespace {

cuda_kernel::MaskKind mask_kind_of(const Problem& p) {
  if (!p.mask) return cuda_kernel::MaskKind::none;
  const DType t = p.mask->dtype();
  if (t == DType::b8) return cuda_kernel::MaskKind::boolean;
  if (t == DType::f32) return cuda_kernel::MaskKind::f32;
  if (t == p.q.dtype()) return cuda_kernel::MaskKind::same_as_q;
  fail<DTypeError>(p.op, ": attn_mask on ", p.device.to_string(), " must be bool, float32 or q's dtype (",
                   dtype_name(p.q.dtype()), "), got ", dtype_name(t));
}

void set_common(FlashParams& f, const Tensor& q, const Tensor& k, const Tensor& v, double scale, bool causal) {
  f.q = q.raw_data();
  f.k = k.raw_data();
  f.v = v.raw_data();
  f.type = q.dtype() == DType::bf16 ? cuda_kernel::ElementType::bf16 : cuda_kernel::ElementType::f16;
  f.head_dim = static_cast<int32_t>(q.size(-1));
  f.scale_log2 = static_cast<float>(scale * kLog2e);
  f.causal = causal;
}

}  // namespace

// Launch parameters of a batched problem; `out` [batch..., Lq, Dv], `lse` [batch..., Lq].
FlashParams params_of(const Problem& p, bool causal, const Tensor& out, const Tensor* lse) {
  if (p.batch.size() > static_cast<size_t>(cuda_kernel::kMaxBatchDims)) {
    fail<ValueError>(p.op, ": the kernel on ", p.device.to_string(), " takes at most ", cuda_kernel::kMaxBatchDims,
                     " leading dims, got q ", shape_str(p.q_in.shape()));
  }
  FlashParams f;
  set_common(f, p.q, p.k, p.v, p.scale, causal);
  f.out = out.raw_data();
  f.lse = lse != nullptr ? lse->data<float>() : nullptr;
  f.batch_ndim = static_cast<int32_t>(p.batch.size());
  for (size_t d = 0; d < p.batch.size(); ++d) {
    const auto i = static_cast<int64_t>(d);
    f.batch[d] = p.batch[d];
    f.q_batch_stride[d] = p.q.stride(i);
    f.k_batch_stride[d] = p.k.stride(i);
    f.v_batch_stride[d] = p.v.stride(i);
    f.out_batch_stride[d] = out.stride(i);
    f.lse_batch_stride[d] = lse != nullptr ? lse->stride(i) : 0;
    f.mask_batch_stride[d] = p.mask ? p.mask->stride(i) : 0;
  }
  f.gqa_group = p.gqa_group;
  f.q_row = p.q.stride(-2);
  f.k_row = p.k.stride(-2);
  f.v_row = p.v.stride(-2);
  f.out_row = out.stride(-2);
  f.mask_kind = mask_kind_of(p);
  if (p.mask) {
    f.mask = p.mask->raw_data();
    f.mask_row = p.mask->stride(-2);
    f.mask_col = p.mask->stride(-1);
  }
  f.lq = f.max_lq = p.lq;
  f.lk = p.lk;
  return f;
}

namespace {

void launch(const FlashParams& f, Device device, const char* op) {
  const kernels::cuda::DeviceGuard guard(device.index);
  cuda_kernel::launch_flash_forward(f, cuda::current_stream(), op);
}

}  // namespace

AttentionResult flash_attention_cuda(const Problem& given, const AttentionOptions& options) {
  if (!served_by_backend(given.device)) fail_no_kernel(given.op, given.device);
  check_supported(given.op, options, given.q_in, given.k_in, given.v_in, given.dk, given.dv);
  // The mask is read element by element through its strides: any layout will do.
  const Problem p = with_operands(given, kernel_layout(given.q_in), kernel_layout(given.k_in),
                                  kernel_layout(given.v_in), given.mask_in);
  AttentionResult r;
  r.output = Tensor::empty(with_tail(p.batch, {p.lq, p.dv}), p.q.dtype(), p.device);  // [batch..., Lq, Dv]
  if (options.return_logsumexp) r.logsumexp = Tensor::empty(with_tail(p.batch, {p.lq}), DType::f32, p.device);
  if (p.batch_size == 0 || p.lq == 0) return r;
  const FlashParams f = params_of(p, options.is_causal, r.output, r.logsumexp ? &*r.logsumexp : nullptr);
  launch(f, p.device, p.op);
  return r;
}

AttentionResult flash_attention_varlen_cuda(const VarlenProblem& given, const AttentionOptions& options) {
  if (!served_by_backend(given.q.device())) fail_no_kernel(given.op, given.q.device());
  check_supported(given.op, options, given.q, given.k, given.v, given.dk, given.dv);
  const Tensor q = kernel_layout(given.q), k = kernel_layout(given.k), v = kernel_layout(given.v);
  const Device device = q.device();
  const int64_t tq = q.size(0);
  AttentionResult r;
  r.output = Tensor::empty({tq, given.hq, given.dv}, q.dtype(), device);                          // [Tq, Hq, Dv]
  if (options.return_logsumexp) r.logsumexp = Tensor::empty({given.hq, tq}, DType::f32, device);  // [Hq, Tq]
  const auto sequences = static_cast<int64_t>(given.cu_q.size()) - 1;
  if (sequences <= 0 || given.max_lq == 0 || given.hq == 0) return r;
  if (sequences > kMaxGridZ) {
    fail<ValueError>(given.op, ": the kernel on ", device.to_string(), " takes at most ", kMaxGridZ, " sequences, got ",
                     sequences);
  }
  // The row starts on the device, where the kernel reads them.
  const Tensor cu_q = Tensor::from_vector(given.cu_q, {sequences + 1}).to(device);
  const Tensor cu_k = Tensor::from_vector(given.cu_k, {sequences + 1}).to(device);
  FlashParams f;
  set_common(f, q, k, v, given.scale, options.is_causal);
  f.out = r.output.raw_data();
  f.lse = r.logsumexp ? r.logsumexp->data<float>() : nullptr;
  f.batch_ndim = 1;  // the heads
  f.batch[0] = given.hq;
  f.q_batch_stride[0] = q.stride(1);
  f.k_batch_stride[0] = k.stride(1);
  f.v_batch_stride[0] = v.stride(1);
  f.out_batch_stride[0] = r.output.stride(1);
  f.lse_batch_stride[0] = tq;
  f.gqa_group = given.hq / given.hk;
  f.q_row = q.stride(0);
  f.k_row = k.stride(0);
  f.v_row = v.stride(0);
  f.out_row = r.output.stride(0);
  f.cu_seqlens_q = cu_q.data<int32_t>();
  f.cu_seqlens_k = cu_k.data<int32_t>();
  f.max_lq = given.max_lq;
  f.sequences = sequences;
  launch(f, device, given.op);
  // cu_q and cu_k (and any copies kernel_layout made) are freed on return while the
  // kernel may still run: their blocks go back to the pool in the order of the stream
  // the kernel runs on (runtime.cc; plain cudaFree waits for the device), so nothing
  // reuses them before the kernel is done.
  return r;
}

}  // namespace qkv::attention
