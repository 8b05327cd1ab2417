// Ulysses attention over MPI (qkv/dist/ulysses_attention.h).
#include "qkv/dist/ulysses_attention.h"

#include <functional>
#include <string>
#include <vector>

#include "dist/internal.h"
#include "qkv/attention_backward.h"
#include "qkv/device.h"
#include "qkv/einops.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

// First head of each rank's share, and one past the last ([P + 1] bounds).
std::vector<int64_t> head_bounds(int64_t heads, int size) {
  std::vector<int64_t> bounds{0};
  for (int64_t n : split_sizes(heads, size)) bounds.push_back(bounds.back() + n);
  return bounds;
}

// x [B, H, L_r, D] (sequence shard) -> [B, H_mine, L, D] (heads share, whole sequence).
// `bounds`: each rank's heads of x; `lengths`: each rank's L_r.
Tensor to_heads(const Tensor& x, const std::vector<int64_t>& bounds, const std::vector<int64_t>& lengths,
                const Communicator& comm, SequenceLayout layout) {
  const int p = comm.size(), rank = comm.rank();
  std::vector<Tensor> parts;
  std::vector<Shape> recv;
  const int64_t mine = bounds[static_cast<size_t>(rank) + 1] - bounds[static_cast<size_t>(rank)];
  for (int r = 0; r < p; ++r) {
    parts.push_back(x.slice(1, bounds[static_cast<size_t>(r)], bounds[static_cast<size_t>(r) + 1]));
    recv.push_back({x.size(0), mine, lengths[static_cast<size_t>(r)], x.size(3)});
  }
  return unshard_sequence(comm.all_to_all(parts, recv), 2, layout);
}

// o [B, H_mine, L, Dv] -> [B, H, L_r, Dv]: the inverse of to_heads.
Tensor to_sequence(const Tensor& o, const std::vector<int64_t>& bounds, const Communicator& comm, SequenceLayout layout,
                   int64_t local_length) {
  const int p = comm.size();
  std::vector<Tensor> parts;
  std::vector<Shape> recv;
  for (int r = 0; r < p; ++r) {
    parts.push_back(shard_sequence(o, 2, r, p, layout));
    recv.push_back(
        {o.size(0), bounds[static_cast<size_t>(r) + 1] - bounds[static_cast<size_t>(r)], local_length, o.size(3)});
  }
  const std::vector<Tensor> got = comm.all_to_all(parts, recv);
  Tensor out = Tensor::empty({o.size(0), bounds.back(), local_length, o.size(3)});
  for (int r = 0; r < p; ++r) {
    out.slice(1, bounds[static_cast<size_t>(r)], bounds[static_cast<size_t>(r) + 1])
        .copy_from(got[static_cast<size_t>(r)]);
  }
  return out;
}

// k [B, Hk, L, D] -> [B, Hk * g, L, D], each key/value head repeated g times (GQA's grouping).
Tensor repeat_heads(const Tensor& k, int64_t g) {
  const Shape s = k.shape();
  return k.unsqueeze(2).expand({s[0], s[1], g, s[2], s[3]}).reshape({s[0], s[1] * g, s[2], s[3]});
}

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const UlyssesAttentionOptions& options) {
  require_cpu("ulysses_attention", {&q, &k, &v, options.attn_mask ? &*options.attn_mask : nullptr});  // host memory
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->dtype() != DType::f32) {  // a DTypeError, as ring attention and tensor parallelism raise
      fail<DTypeError>("ulysses_attention: q, k and v must be float32, got q ", dtype_name(q.dtype()), ", k ",
                       dtype_name(k.dtype()), ", v ", dtype_name(v.dtype()));
    }
  }
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->dim() != 4) {
      fail<ShapeError>("ulysses_attention: q, k, v must be [B, H, L_local, D], got q ", shape_str(q.shape()), ", k ",
                       shape_str(k.shape()), ", v ", shape_str(v.shape()));
    }
  }
  // As scaled_dot_product_attention refuses; here on every rank (a rank without heads runs no kernel).
  if (options.attn_mask && options.is_causal) {
    fail<ValueError>(
        "ulysses_attention: attn_mask and is_causal cannot both be set (as in PyTorch); fold the causal "
        "mask into attn_mask instead");
  }
  const int64_t hq = q.size(1), hk = k.size(1);
  if (hq != hk && !(options.enable_gqa && hk > 0 && hq % hk == 0)) {
    fail<ShapeError>("ulysses_attention: q has ", hq, " heads and k ", hk,
                     (options.enable_gqa ? "; GQA needs Hq a multiple of Hk" : "; pass enable_gqa for GQA"));
  }
  check_kernel_shapes("ulysses_attention", q, k, v, options.scale, options.enable_gqa, options.attn_mask);
}

// check_inputs (and the backward's `more_checks`) on every rank at once, which must also agree
// on the options and every size but the sequence axis (agree_on_call); returns every rank's query
// and key lengths, gathered with the agreement.
SharedValues agree_on_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                             const Communicator& comm, const UlyssesAttentionOptions& options,
                             const std::function<void()>& more_checks = {}) {
  return agree_on_call(op, comm, [&] {
    check_inputs(q, k, v, options);
    if (more_checks) more_checks();
    CallSignature sig;
    add_options(sig, options);
    sig.tensor("q", q, 2).tensor("k", k, 2).tensor("v", v, 2);
    sig.share(q.size(2)).share(k.size(2));
    return sig.tensor("attn_mask", options.attn_mask);  // the whole sequence's mask: the same on every rank
  });
}

// Who holds which heads, and every rank's sequence lengths.
struct UlyssesPlan {
  bool replicate = false;  // Hk < P with GQA: K/V repeated to Hq first
  int64_t group = 1;       // query heads per key/value head after that
  std::vector<int64_t> q_bounds, kv_bounds, q_lengths, kv_lengths;
};

// `lengths`: agree_on_inputs' result.
UlyssesPlan plan_of(const char* op, const Tensor& q, const Tensor& k, const Communicator& comm, SequenceLayout layout,
                    const SharedValues& lengths) {
  UlyssesPlan plan;
  const int64_t g = q.size(1) / k.size(1);
  // Key/value heads are split when every rank gets one; else replicated to Hq (group 1).
  plan.replicate = g > 1 && k.size(1) < comm.size();
  plan.group = plan.replicate ? 1 : g;
  plan.kv_bounds = head_bounds(plan.replicate ? q.size(1) : k.size(1), comm.size());
  for (int64_t b : plan.kv_bounds) plan.q_bounds.push_back(b * plan.group);
  plan.q_lengths = lengths[0];
  plan.kv_lengths = lengths[1];
  // Every rank checks every rank's lengths (all fail together): a shard the layout does not give
  // used to pass the first all-to-all and fail in the second on only some ranks.
  check_shard_lengths(op, "queries", plan.q_lengths, layout);
  check_shard_lengths(op, "keys", plan.kv_lengths, layout);
  return plan;
}

// This rank's heads over the whole sequence: q [B, hq, Lq, D], k/v [B, hk, Lk, D].
struct Heads {
  Tensor q, k, v;
};

Heads heads_of(const Tensor& q, const Tensor& k, const Tensor& v, const UlyssesPlan& plan, const Communicator& comm,
               SequenceLayout layout) {
  const int64_t g = q.size(1) / k.size(1);
  return {to_heads(q, plan.q_bounds, plan.q_lengths, comm, layout),
          to_heads(plan.replicate ? repeat_heads(k, g) : k, plan.kv_bounds, plan.kv_lengths, comm, layout),
          to_heads(plan.replicate ? repeat_heads(v, g) : v, plan.kv_bounds, plan.kv_lengths, comm, layout)};
}

AttentionOptions local_options(const UlyssesAttentionOptions& options, const UlyssesPlan& plan, int rank, int64_t hq) {
  AttentionOptions o;
  o.is_causal = options.is_causal;
  o.scale = options.scale;
  o.enable_gqa = plan.group > 1;
  o.matmul_precision = options.matmul_precision;
  if (options.attn_mask) {
    Tensor m = *options.attn_mask;  // per-head masks follow the heads of this rank
    if (m.dim() >= 3 && m.size(-3) == hq) {
      m = m.slice(-3, plan.q_bounds[static_cast<size_t>(rank)], plan.q_bounds[static_cast<size_t>(rank) + 1]);
    }
    o.attn_mask = m;
  }
  return o;
}

Tensor run_ulysses(const Tensor& q, const Tensor& k, const Tensor& v, const Communicator& comm,
                   const UlyssesAttentionOptions& options) {
  const SharedValues lengths = agree_on_inputs("ulysses_attention", q, k, v, comm, options);
  const UlyssesPlan plan = plan_of("ulysses_attention", q, k, comm, options.layout, lengths);
  const Heads h = heads_of(q, k, v, plan, comm, options.layout);
  Tensor oh = Tensor::zeros({q.size(0), h.q.size(1), h.q.size(2), v.size(3)});  // [B, hq, Lq, Dv]
  if (h.q.size(1) > 0) {
    oh = scaled_dot_product_attention(h.q, h.k, h.v, local_options(options, plan, comm.rank(), q.size(1))).output;
  }
  return to_sequence(oh.contiguous(), plan.q_bounds, comm, options.layout, q.size(2));
}

AttentionGradients run_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
                                const Communicator& comm, const UlyssesAttentionOptions& options) {
  const SharedValues lengths = agree_on_inputs("ulysses_attention_backward", q, k, v, comm, options, [&] {
    const Shape out_shape{q.size(0), q.size(1), q.size(2), v.size(3)};
    require_cpu("ulysses_attention_backward", {&grad_out});
    if (grad_out.dtype() != DType::f32) {
      fail<DTypeError>("ulysses_attention_backward: grad_out is ", dtype_name(grad_out.dtype()),
                       ", the output float32");
    }
    if (grad_out.shape() != out_shape) {
      fail<ShapeError>("ulysses_attention_backward: grad_out is ", shape_str(grad_out.shape()), ", the output ",
                       shape_str(out_shape));
    }
  });
  const UlyssesPlan plan = plan_of("ulysses_attention_backward", q, k, comm, options.layout, lengths);
  const Heads h = heads_of(q, k, v, plan, comm, options.layout);
  const Tensor dout = to_heads(grad_out, plan.q_bounds, plan.q_lengths, comm, options.layout);
  AttentionGradients local{Tensor::zeros(h.q.shape()), Tensor::zeros(h.k.shape()), Tensor::zeros(h.v.shape())};
  if (h.q.size(1) > 0) {  // the forward on this rank's heads again, for its output and logsumexp
    AttentionOptions o = local_options(options, plan, comm.rank(), q.size(1));
    o.return_logsumexp = true;
    const AttentionResult f = scaled_dot_product_attention(h.q, h.k, h.v, o);
    local = scaled_dot_product_attention_backward(h.q, h.k, h.v, f.output, dout, *f.logsumexp, o);
  }
  AttentionGradients g;
  g.dq = to_sequence(local.dq.contiguous(), plan.q_bounds, comm, options.layout, q.size(2));
  g.dk = to_sequence(local.dk.contiguous(), plan.kv_bounds, comm, options.layout, k.size(2));
  g.dv = to_sequence(local.dv.contiguous(), plan.kv_bounds, comm, options.layout, k.size(2));
  if (plan.replicate) {  // the repeated heads' gradients sum into their key/value head
    const einops::AxisLengths g_axis{{"g", q.size(1) / k.size(1)}};
    g.dk = einops::reduce(g.dk, "b (h g) l d -> b h l d", einops::Reduction::sum, g_axis);
    g.dv = einops::reduce(g.dv, "b (h g) l d -> b h l d", einops::Reduction::sum, g_axis);
  }
  return g;
}

}  // namespace

Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Communicator& comm,
                         const UlyssesAttentionOptions& options) {
  return naming_failures("ulysses_attention", comm, q, [&] { return run_ulysses(q, k, v, comm, options); });
}

AttentionGradients ulysses_attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& grad_out,
                                              const Communicator& comm, const UlyssesAttentionOptions& options) {
  return naming_failures("ulysses_attention_backward", comm, q,
                         [&] { return run_backward(q, k, v, grad_out, comm, options); });
}

}  // namespace qkv::dist
