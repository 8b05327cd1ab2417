// Ulysses attention over MPI (qkv/dist/ulysses_attention.h).
#include "qkv/dist/ulysses_attention.h"

#include <string>
#include <vector>

#include "dist/internal.h"
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
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->dim() != 4 || t->dtype() != DType::f32) {
      fail<ShapeError>("ulysses_attention: q, k, v must be [B, H, L_local, D] float32, got q ", shape_str(q.shape()),
                       " ", dtype_name(q.dtype()), ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()));
    }
  }
  const int64_t hq = q.size(1), hk = k.size(1);
  if (hq != hk && !(options.enable_gqa && hk > 0 && hq % hk == 0)) {
    fail<ShapeError>("ulysses_attention: q has ", hq, " heads and k ", hk,
                     (options.enable_gqa ? "; GQA needs Hq a multiple of Hk" : "; pass enable_gqa for GQA"));
  }
}

Tensor run_ulysses(const Tensor& q, const Tensor& k, const Tensor& v, const Communicator& comm,
                   const UlyssesAttentionOptions& options) {
  check_inputs(q, k, v, options);
  const int p = comm.size(), rank = comm.rank();
  const int64_t hq = q.size(1), g = hq / k.size(1);
  // Key/value heads are split when every rank gets one; else replicated to Hq (group 1).
  const bool replicate = g > 1 && k.size(1) < p;
  const Tensor kk = replicate ? repeat_heads(k, g) : k;
  const Tensor vv = replicate ? repeat_heads(v, g) : v;
  const int64_t group = replicate ? 1 : g;
  const std::vector<int64_t> kv_bounds = head_bounds(kk.size(1), p);
  std::vector<int64_t> q_bounds;
  for (int64_t b : kv_bounds) q_bounds.push_back(b * group);
  const std::vector<int64_t> q_lengths = comm.all_gather_values(q.size(2));
  const std::vector<int64_t> kv_lengths = comm.all_gather_values(k.size(2));

  const Tensor qh = to_heads(q, q_bounds, q_lengths, comm, options.layout);  // [B, Hq_mine, Lq, D]
  const Tensor kh = to_heads(kk, kv_bounds, kv_lengths, comm, options.layout);
  const Tensor vh = to_heads(vv, kv_bounds, kv_lengths, comm, options.layout);
  Tensor oh = Tensor::zeros({q.size(0), qh.size(1), qh.size(2), v.size(3)});  // [B, Hq_mine, Lq, Dv]
  if (qh.size(1) > 0) {
    AttentionOptions o;
    o.is_causal = options.is_causal;
    o.scale = options.scale;
    o.enable_gqa = group > 1;
    o.matmul_precision = options.matmul_precision;
    if (options.attn_mask) {
      Tensor m = *options.attn_mask;  // per-head masks follow the heads of this rank
      if (m.dim() >= 3 && m.size(-3) == hq)
        m = m.slice(-3, q_bounds[static_cast<size_t>(rank)], q_bounds[static_cast<size_t>(rank) + 1]);
      o.attn_mask = m;
    }
    oh = scaled_dot_product_attention(qh, kh, vh, o).output;
  }
  return to_sequence(oh.contiguous(), q_bounds, comm, options.layout, q.size(2));
}

}  // namespace

Tensor ulysses_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Communicator& comm,
                         const UlyssesAttentionOptions& options) {
  return naming_failures("ulysses_attention", comm, q, [&] { return run_ulysses(q, k, v, comm, options); });
}

}  // namespace qkv::dist
