// Backward of ring attention over MPI (qkv/dist/ring_attention.h).
//
// Each rank keeps its queries and their output, logsumexp and output gradient; the K/V
// blocks go around the ring as in the forward, now each with its dK/dV accumulators. With
// the forward's global output O and logsumexp, a block's share of the gradient is the
// fused backward kernel on that block alone (P_ij = exp(s_ij - lse_i) and D_i = dO_i . O_i
// are the whole row's), so dq sums over blocks here and dk/dv sum over the ranks they pass;
// after P steps every accumulator is back with the rank that owns its block.
#include <string>
#include <vector>

#include "dist/internal.h"
#include "dist/ring_plan.h"
#include "nn/heads.h"
#include "qkv/attention_backward.h"
#include "qkv/device.h"
#include "qkv/dist/ring_attention.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

// dst (a view) += src, both f32 of one shape.
void accumulate(const Tensor& dst, const Tensor& src) { dst.copy_from(nn::detail::add_broadcast(dst, src)); }

struct Saved {
  const Tensor& q;
  const Tensor& out;       // [..., Hq, Lq_r, Dv]
  const Tensor& grad_out;  // [..., Hq, Lq_r, Dv]
  const Tensor& lse;       // [..., Hq, Lq_r]
};

// This rank's queries against rank `src`'s K/V block: dq += ..., dk/dv (the block's) += ...
void backward_block(const RingPlan& plan, const Saved& s, const Tensor& k, const Tensor& v, int src, const Tensor& dq,
                    const Tensor& dk, const Tensor& dv) {
  for (const QueryChunk& qc : plan.queries) {
    const int64_t q0 = qc.local_start, q1 = q0 + qc.chunk.length;
    for (const KeyChunk& kc : plan.key_chunks(src)) {
      const Pair kind = plan.pair(qc.chunk, kc.chunk);
      if (kind == Pair::skip) continue;
      const int64_t k0 = kc.block_start, k1 = k0 + kc.chunk.length;
      const AttentionGradients g = scaled_dot_product_attention_backward(
          s.q.slice(-2, q0, q1), k.slice(-2, k0, k1), v.slice(-2, k0, k1), s.out.slice(-2, q0, q1),
          s.grad_out.slice(-2, q0, q1), s.lse.slice(-1, q0, q1), plan.block_options(qc, kc, kind));
      accumulate(dq.slice(-2, q0, q1), g.dq);
      accumulate(dk.slice(-2, k0, k1), g.dk);
      accumulate(dv.slice(-2, k0, k1), g.dv);
    }
  }
}

void check_saved(const Tensor& q, const Tensor& v, const Tensor& out, const Tensor& grad_out, const Tensor& lse) {
  require_cpu("ring_attention_backward", {&out, &grad_out, &lse});
  Shape ls = q.shape();
  ls.pop_back();
  const Shape os = with_last2(q, q.size(-2), v.size(-1));
  if (out.dtype() != DType::f32 || grad_out.dtype() != DType::f32 || lse.dtype() != DType::f32) {
    fail<DTypeError>("ring_attention_backward: out, grad_out and logsumexp must be float32, got ",
                     dtype_name(out.dtype()), ", ", dtype_name(grad_out.dtype()), ", ", dtype_name(lse.dtype()));
  }
  if (out.shape() != os || grad_out.shape() != os || lse.shape() != ls) {
    fail<ShapeError>("ring_attention_backward: out ", shape_str(out.shape()), ", grad_out ",
                     shape_str(grad_out.shape()), ", logsumexp ", shape_str(lse.shape()), " for q ",
                     shape_str(q.shape()), " and v ", shape_str(v.shape()), ": want ", shape_str(os), ", ",
                     shape_str(os), ", ", shape_str(ls));
  }
}

AttentionGradients run_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Saved& saved,
                                const Communicator& comm, const RingAttentionOptions& options) {
  const RingPlan plan = make_ring_plan("ring_attention_backward", q, k, v, comm, options,
                                       [&] { check_saved(q, v, saved.out, saved.grad_out, saved.lse); });
  const int p = comm.size(), rank = comm.rank(), next = (rank + 1) % p, prev = (rank - 1 + p) % p;
  AttentionGradients g{Tensor::zeros(q.shape()), Tensor(), Tensor()};
  Tensor cur_k = k.contiguous(), cur_v = v.contiguous();
  Tensor cur_dk = Tensor::zeros(k.shape()), cur_dv = Tensor::zeros(v.shape());
  for (int s = 0; s < p; ++s) {
    const int src = (rank - s + p) % p;  // whose block (and accumulators) this rank holds
    const int64_t n = plan.kv_lengths[static_cast<size_t>((src - 1 + p) % p)];
    std::vector<Request> transfers;
    Tensor next_k, next_v;
    if (s + 1 < p) {  // the next K/V block travels while this one is computed on
      next_k = Tensor::empty(with_last2(k, n, k.size(-1)));
      next_v = Tensor::empty(with_last2(v, n, v.size(-1)));
      transfers.push_back(comm.irecv(next_k, prev, 4 * s));
      transfers.push_back(comm.irecv(next_v, prev, 4 * s + 1));
      transfers.push_back(comm.isend(cur_k, next, 4 * s));
      transfers.push_back(comm.isend(cur_v, next, 4 * s + 1));
    }
    backward_block(plan, saved, cur_k, cur_v, src, g.dq, cur_dk, cur_dv);
    if (p > 1) {  // the accumulators follow their block; after step P-1 they are home
      Tensor next_dk = Tensor::empty(with_last2(k, n, k.size(-1)));
      Tensor next_dv = Tensor::empty(with_last2(v, n, v.size(-1)));
      transfers.push_back(comm.irecv(next_dk, prev, 4 * s + 2));
      transfers.push_back(comm.irecv(next_dv, prev, 4 * s + 3));
      transfers.push_back(comm.isend(cur_dk, next, 4 * s + 2));
      transfers.push_back(comm.isend(cur_dv, next, 4 * s + 3));
      wait_all(transfers);
      cur_dk = next_dk;
      cur_dv = next_dv;
    }
    cur_k = next_k;
    cur_v = next_v;
  }
  g.dk = cur_dk;
  g.dv = cur_dv;
  return g;
}

}  // namespace

AttentionGradients ring_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                           const Tensor& grad_out, const Tensor& logsumexp, const Communicator& comm,
                                           const RingAttentionOptions& options) {
  const Saved saved{q, out, grad_out, logsumexp};
  return naming_failures("ring_attention_backward", comm, q,
                         [&] { return run_backward(q, k, v, saved, comm, options); });
}

}  // namespace qkv::dist
