// Host side of the CUDA attention backward: what it supports (the forward kernel's
// options but dropout; the saved tensors' dtypes), the operands' layout (16-byte rows,
// else a contiguous copy on the device, as the forward), the float32 accumulators and
// scratch on the device, and the launch parameters (attention_backward_cuda_kernel.h).
#include "attention/attention_backward_cuda.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>

#include "attention/attention_backward_cuda_kernel.h"
#include "attention/attention_cuda.h"
#include "kernels/cuda/cuda_runtime.h"
#include "qkv/allocator.h"
#include "qkv/cuda.h"

namespace qkv::attention {

namespace {

using cuda_kernel::FlashBackwardParams;

// The kernel reads out and grad_out as q's type and the logsumexp as float32 (what the
// GPU forward returns).
void check_saved_dtypes(const Problem& p, const Tensor& out, const Tensor& grad_out, const Tensor& lse) {
  const std::string dev = p.device.to_string();
  for (const auto& [t, name] : {std::pair{&out, "out"}, std::pair{&grad_out, "grad_out"}}) {
    if (t->dtype() != p.q_in.dtype()) {
      fail<DTypeError>(p.op, ": the kernel on ", dev, " takes ", name, " in q's dtype (", dtype_name(p.q_in.dtype()),
                       "), got ", dtype_name(t->dtype()), " (", name, " ", shape_str(t->shape()), ")");
    }
  }
  if (lse.dtype() != DType::f32) {
    fail<DTypeError>(p.op, ": the kernel on ", dev, " takes a float32 logsumexp (the GPU forward's), got ",
                     dtype_name(lse.dtype()), " (logsumexp ", shape_str(lse.shape()), ")");
  }
}

// Both launches put every (block, batch entry) pair on the grid's x: at most 2^31 - 1.
void check_grid(const Problem& p, int64_t lq_padded) {
  const int64_t most = std::numeric_limits<int32_t>::max();
  const int64_t key_blocks = (p.lk + cuda_kernel::kBackwardKeyTile - 1) / cuda_kernel::kBackwardKeyTile;
  const int64_t row_blocks = lq_padded / cuda_kernel::kBackwardPreRows;
  for (const int64_t blocks : {key_blocks, row_blocks}) {
    if (p.batch_size > 0 && blocks > most / p.batch_size) {
      fail<ValueError>(p.op, ": the kernel on ", p.device.to_string(), " takes at most ", most,
                       " blocks; batch entries ", p.batch_size, ", Lq ", p.lq, ", Lk ", p.lk, " need more");
    }
  }
}

// The batch strides (the dims before the last two) and the row stride of `t`.
void strides_of(const Tensor& t, int64_t (&batch)[cuda_kernel::kMaxBatchDims], int64_t& row) {
  for (int64_t d = 0; d + 2 < t.dim(); ++d) batch[d] = t.stride(d);
  row = t.stride(-2);
}

}  // namespace

AttentionGradients flash_attention_backward_cuda(const Problem& given, const Tensor& out, const Tensor& grad_out,
                                                 const Tensor& logsumexp, const AttentionOptions& options) {
  if (!served_by_backend(given.device)) fail_no_kernel(given.op, given.device);
  check_supported(given.op, options, given.q_in, given.k_in, given.v_in, given.dk, given.dv);
  check_saved_dtypes(given, out, grad_out, logsumexp);
  // The mask and the logsumexp are read element by element through their strides: any layout will do.
  const Problem p = with_operands(given, kernel_layout(given.q_in), kernel_layout(given.k_in),
                                  kernel_layout(given.v_in), given.mask_in);
  const Tensor o = kernel_layout(out), dout = kernel_layout(grad_out);  // [batch..., Lq, Dv]
  FlashBackwardParams b;
  b.f = params_of(p, options.is_causal, o, &logsumexp);  // f.out = O, f.lse = the saved logsumexp
  b.f.lse_row = logsumexp.stride(-1);
  b.lq_padded =
      (p.lq + cuda_kernel::kBackwardQueryTile - 1) / cuda_kernel::kBackwardQueryTile * cuda_kernel::kBackwardQueryTile;
  check_grid(p, b.lq_padded);
  const Device dev = p.device;
  const DType dt = p.q_in.dtype();
  AttentionGradients g{Tensor::empty(p.q_in.shape(), dt, dev), Tensor::empty(p.k_in.shape(), dt, dev),
                       Tensor::empty(p.v_in.shape(), dt, dev)};
  // float32 accumulators in the gradients' shapes, seen through the operands' expansion to
  // the batch: a broadcast dim's stride 0 (and GQA's shared k/v head) makes every entry
  // that read a row add into that row.
  const Tensor acc_q = Tensor::empty(p.q_in.shape(), DType::f32, dev);
  const Tensor acc_k = Tensor::empty(p.k_in.shape(), DType::f32, dev);
  const Tensor acc_v = Tensor::empty(p.v_in.shape(), DType::f32, dev);
  // No entries (a batch dim of 0; GQA with no q heads, whose k/v keep Hk heads that no entry
  // reads and that cannot expand to 0): no kernel reads these strides, and the gradients are
  // the zeroed accumulators converted.
  if (p.batch_size > 0) {
    strides_of(acc_q.expand(p.q.shape()), b.dq_batch_stride, b.dq_row);
    strides_of(acc_k.expand(p.k.shape()), b.dk_batch_stride, b.dk_row);
    strides_of(acc_v.expand(p.v.shape()), b.dv_batch_stride, b.dv_row);
  }
  strides_of(dout, b.dout_batch_stride, b.dout_row);
  b.dout = dout.raw_data();
  b.dq_acc = acc_q.data<float>();
  b.dk_acc = acc_k.data<float>();
  b.dv_acc = acc_v.data<float>();
  b.dq_numel = acc_q.numel();
  b.dk_numel = acc_k.numel();
  b.dv_numel = acc_v.numel();
  b.dq = g.dq.raw_data();
  b.dk = g.dk.raw_data();
  b.dv = g.dv.raw_data();
  const Tensor scratch = Tensor::empty({2, p.batch_size, b.lq_padded}, DType::f32, dev);  // D, lse log2 e
  b.delta = scratch.data<float>();
  b.lse2 = b.delta + p.batch_size * b.lq_padded;
  b.scale = static_cast<float>(p.scale);
  const kernels::cuda::DeviceGuard guard(dev.index);
  cuda_kernel::launch_flash_backward(b, cuda::current_stream(), p.op);
  // The accumulators, the scratch and any copies are freed on return while the kernels may
  // still run: device memory goes back in the order of the stream they run on (or cudaFree
  // waits for the device), so nothing reuses it before they are done.
  return g;
}

}  // namespace qkv::attention
