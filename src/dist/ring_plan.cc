// RingPlan: the chunks and pairs of ring attention (dist/ring_plan.h).
#include "dist/ring_plan.h"

#include <string>

#include "dist/internal.h"
#include "qkv/device.h"
#include "qkv/error.h"

namespace qkv::dist {

Shape with_last2(const Tensor& like, int64_t rows, int64_t cols) {
  Shape s = like.shape();
  s[s.size() - 2] = rows;
  s[s.size() - 1] = cols;
  return s;
}

std::vector<KeyChunk> RingPlan::key_chunks(int src) const {
  std::vector<KeyChunk> out;
  int64_t at = 0;
  for (const Chunk& c : sequence_chunks(lk, src, size, options->layout)) {
    out.push_back({c, at});
    at += c.length;
  }
  return out;
}

Pair RingPlan::pair(const Chunk& q, const Chunk& k) const {
  if (q.length == 0 || k.length == 0) return Pair::skip;
  if (!options->is_causal) return Pair::full;
  if (k.start + k.length - 1 <= q.start) return Pair::full;  // every key at or before the first query
  if (k.start > q.start + q.length - 1) return Pair::skip;   // every key after the last query
  if (k.start == q.start && k.length == q.length) return Pair::causal;
  fail<ValueError>("ring_attention: query chunk [", q.start, ", ", q.start + q.length, ") and key chunk [", k.start,
                   ", ", k.start + k.length, ") overlap unevenly; causal needs equal query and key lengths");
}

AttentionOptions RingPlan::block_options(const QueryChunk& q, const KeyChunk& k, Pair kind) const {
  AttentionOptions o;
  o.is_causal = kind == Pair::causal;
  o.scale = options->scale;
  o.enable_gqa = options->enable_gqa;
  o.return_logsumexp = true;
  o.matmul_precision = options->matmul_precision;
  if (options->attn_mask) {
    Tensor m = *options->attn_mask;
    if (m.size(-2) != 1) m = m.slice(-2, q.local_start, q.local_start + q.chunk.length);
    if (m.size(-1) != 1) m = m.slice(-1, k.chunk.start, k.chunk.start + k.chunk.length);
    o.attn_mask = m;
  }
  return o;
}

namespace {

void check_inputs(const char* op, const Tensor& q, const Tensor& k, const Tensor& v,
                  const RingAttentionOptions& options) {
  require_cpu(op, {&q, &k, &v, options.attn_mask ? &*options.attn_mask : nullptr});  // MPI moves host memory
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->dtype() != DType::f32) {
      fail<DTypeError>(op, ": q, k and v must be float32, got q ", dtype_name(q.dtype()), ", k ", dtype_name(k.dtype()),
                       ", v ", dtype_name(v.dtype()));
    }
    if (t->dim() < 2) fail<ShapeError>(op, ": q, k, v need [..., L, D], got ", shape_str(t->shape()));
  }
  // As scaled_dot_product_attention (and PyTorch) refuse; checked here, on every rank, because
  // only the ranks whose pairs reach the kernel's causal case would see its error.
  if (options.attn_mask && options.is_causal) {
    fail<ValueError>(op,
                     ": attn_mask and is_causal cannot both be set (as in PyTorch); fold the causal mask into "
                     "attn_mask instead");
  }
  if (options.attn_mask && options.attn_mask->dim() < 2) {
    fail<ShapeError>(op, ": attn_mask must be [..., Lq_local, Lk], got ", shape_str(options.attn_mask->shape()));
  }
  check_kernel_shapes(op, q, k, v, options.scale, options.enable_gqa, options.attn_mask);
  // The mask is sliced per (query chunk, key chunk) pair, which would silently take the first
  // rows of a whole-sequence mask: its rows must be this rank's queries (or 1, broadcast).
  if (options.attn_mask && options.attn_mask->size(-2) != 1 && options.attn_mask->size(-2) != q.size(-2)) {
    fail<ShapeError>(op, ": attn_mask must be [..., Lq_local, Lk] (this rank's query rows against every key), got ",
                     shape_str(options.attn_mask->shape()), " for q ", shape_str(q.shape()));
  }
}

// What every rank must agree on: the options and every size but the sequence axis.
CallSignature signature(const Tensor& q, const Tensor& k, const Tensor& v, const RingAttentionOptions& options) {
  CallSignature sig;
  add_options(sig, options);
  sig.tensor("q", q, q.dim() - 2).tensor("k", k, k.dim() - 2).tensor("v", v, v.dim() - 2);
  if (options.attn_mask)
    sig.tensor("attn_mask", *options.attn_mask, options.attn_mask->dim() - 2);
  else
    sig.tensor("attn_mask", std::nullopt);
  return sig;
}

}  // namespace

void check_shard_lengths(const char* op, const char* what, const std::vector<int64_t>& lengths, SequenceLayout layout) {
  const int p = static_cast<int>(lengths.size());
  int64_t length = 0;
  for (const int64_t n : lengths) length += n;
  for (int r = 0; r < p; ++r) {
    int64_t want = 0;
    for (const Chunk& c : sequence_chunks(length, r, p, layout)) want += c.length;
    if (lengths[static_cast<size_t>(r)] != want) {
      fail<ShapeError>(op, ": rank ", r, " holds ", lengths[static_cast<size_t>(r)], " ", what, "; the ",
                       sequence_layout_name(layout), " layout of ", length, " over ", p, " ranks gives it ", want,
                       " (shard_sequence cuts it)");
    }
  }
}

RingPlan make_ring_plan(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const Communicator& comm,
                        const RingAttentionOptions& options, const std::function<void()>& more_checks) {
  const SharedValues lengths = agree_on_call(op, comm, [&] {
    check_inputs(op, q, k, v, options);
    if (more_checks) more_checks();
    return signature(q, k, v, options).share(q.size(-2)).share(k.size(-2));  // every rank's lengths
  });
  RingPlan plan;
  plan.size = comm.size();
  plan.options = &options;
  plan.kv_lengths = lengths[1];
  const std::vector<int64_t>& q_lengths = lengths[0];
  for (int64_t n : q_lengths) plan.lq += n;
  for (int64_t n : plan.kv_lengths) plan.lk += n;
  if (options.is_causal && plan.lq != plan.lk) {
    fail<ShapeError>(op, ": causal needs as many queries as keys, got ", plan.lq, " and ", plan.lk);
  }
  // Every rank checks every rank's lengths, so that all fail together (a rank whose own length
  // fits would otherwise wait in the ring for one that failed alone).
  check_shard_lengths(op, "queries", q_lengths, options.layout);
  check_shard_lengths(op, "keys", plan.kv_lengths, options.layout);
  int64_t local = 0;
  for (const Chunk& c : sequence_chunks(plan.lq, comm.rank(), plan.size, options.layout)) {
    plan.queries.push_back({c, local});
    local += c.length;
  }
  // Every rank has the same mask columns (agree_on_call): all fail here together.
  if (options.attn_mask && options.attn_mask->size(-1) != 1 && options.attn_mask->size(-1) != plan.lk) {
    fail<ShapeError>(op, ": attn_mask must be [..., Lq_local, Lk = ", plan.lk,
                     "] (this rank's query rows against every key), got ", shape_str(options.attn_mask->shape()));
  }
  return plan;
}

}  // namespace qkv::dist
