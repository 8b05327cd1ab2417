// Ring attention over MPI (qkv/dist/ring_attention.h).
#include "qkv/dist/ring_attention.h"

#include <limits>
#include <string>
#include <vector>

#include "dist/internal.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

// What a (query chunk, key chunk) pair of a causal sequence runs.
enum class Pair { skip, full, causal };

Pair pair_kind(const Chunk& q, const Chunk& k, bool causal) {
  if (q.length == 0 || k.length == 0) return Pair::skip;
  if (!causal) return Pair::full;
  if (k.start + k.length - 1 <= q.start) return Pair::full;  // every key at or before the first query
  if (k.start > q.start + q.length - 1) return Pair::skip;   // every key after the last query
  if (k.start == q.start && k.length == q.length) return Pair::causal;
  fail<ValueError>("ring_attention: query chunk [", q.start, ", ", q.start + q.length, ") and key chunk [", k.start,
                   ", ", k.start + k.length, ") overlap unevenly; causal needs equal query and key lengths");
}

Shape with_last2(const Tensor& like, int64_t rows, int64_t cols) {
  Shape s = like.shape();
  s[s.size() - 2] = rows;
  s[s.size() - 1] = cols;
  return s;
}

// The running output of one local query chunk: out [..., Hq, l, Dv], lse [..., Hq, l].
struct Accumulator {
  Chunk chunk;
  int64_t local_start = 0;  // first row in this rank's shard
  Tensor out, lse;
};

struct Ring {
  const Communicator& comm;
  const RingAttentionOptions& options;
  const Tensor& q;                  // [..., Hq, Lq_r, D]
  std::vector<Accumulator> acc;     // one per local query chunk
  std::vector<int64_t> kv_lengths;  // per rank
  int64_t lk = 0;                   // every rank's keys

  // Attention of every local query chunk against rank `src`'s K/V block, folded in.
  void attend(const Tensor& k, const Tensor& v, int src) {
    const std::vector<Chunk> kchunks = sequence_chunks(lk, src, comm.size(), options.layout);
    for (Accumulator& a : acc) {
      int64_t kat = 0;
      for (const Chunk& kc : kchunks) {
        const Pair kind = pair_kind(a.chunk, kc, options.is_causal);
        if (kind != Pair::skip) fold(a, k.slice(-2, kat, kat + kc.length), v.slice(-2, kat, kat + kc.length), kc, kind);
        kat += kc.length;
      }
    }
  }

  void fold(Accumulator& a, const Tensor& k, const Tensor& v, const Chunk& kc, Pair kind) const {
    AttentionOptions o;
    o.is_causal = kind == Pair::causal;
    o.scale = options.scale;
    o.enable_gqa = options.enable_gqa;
    o.return_logsumexp = true;
    o.matmul_precision = options.matmul_precision;
    if (options.attn_mask) {
      Tensor m = *options.attn_mask;
      if (m.size(-2) != 1) m = m.slice(-2, a.local_start, a.local_start + a.chunk.length);
      if (m.size(-1) != 1) m = m.slice(-1, kc.start, kc.start + kc.length);
      o.attn_mask = m;
    }
    const Tensor qa = q.slice(-2, a.local_start, a.local_start + a.chunk.length);
    AttentionResult r = scaled_dot_product_attention(qa, k, v, o);
    merge_partial(a.out, a.lse, r.output.contiguous(), r.logsumexp->contiguous());
  }
};

void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v, const RingAttentionOptions& options, int size) {
  for (const Tensor* t : {&q, &k, &v}) {
    if (t->dtype() != DType::f32) {
      fail<DTypeError>("ring_attention: q, k and v must be float32, got q ", dtype_name(q.dtype()), ", k ",
                       dtype_name(k.dtype()), ", v ", dtype_name(v.dtype()));
    }
    if (t->dim() < 2) fail<ShapeError>("ring_attention: q, k, v need [..., L, D], got ", shape_str(t->shape()));
  }
  if (options.attn_mask && options.attn_mask->dim() < 2) {
    fail<ShapeError>("ring_attention: attn_mask must be [..., Lq_local, Lk], got ",
                     shape_str(options.attn_mask->shape()));
  }
  if (size < 1) fail<ValueError>("ring_attention: communicator of size ", size);
}

AttentionResult run_ring(const Tensor& q, const Tensor& k, const Tensor& v, const Communicator& comm,
                         const RingAttentionOptions& options) {
  const int p = comm.size(), rank = comm.rank();
  check_inputs(q, k, v, options, p);
  Ring ring{comm, options, q, {}, comm.all_gather_values(k.size(-2)), 0};
  int64_t lq = 0;
  for (int64_t n : comm.all_gather_values(q.size(-2))) lq += n;
  for (int64_t n : ring.kv_lengths) ring.lk += n;
  if (options.is_causal && lq != ring.lk) {
    fail<ShapeError>("ring_attention: causal needs as many queries as keys, got ", lq, " and ", ring.lk);
  }
  for (int r = 0; r < p; ++r) {
    int64_t want = 0;
    for (const Chunk& c : sequence_chunks(ring.lk, r, p, options.layout)) want += c.length;
    if (ring.kv_lengths[static_cast<size_t>(r)] != want) {
      fail<ShapeError>("ring_attention: rank ", r, " holds ", ring.kv_lengths[static_cast<size_t>(r)], " keys; the ",
                       sequence_layout_name(options.layout), " layout of ", ring.lk, " over ", p, " ranks gives it ",
                       want);
    }
  }
  int64_t local = 0;
  for (const Chunk& c : sequence_chunks(lq, rank, p, options.layout)) {
    Accumulator a{c, local, Tensor::zeros(with_last2(q, c.length, v.size(-1))), Tensor()};
    Shape ls = q.shape();
    ls.back() = c.length;
    ls.erase(ls.end() - 2);
    a.lse = Tensor::full(ls, -std::numeric_limits<double>::infinity());
    ring.acc.push_back(std::move(a));
    local += c.length;
  }
  if (local != q.size(-2)) {
    fail<ShapeError>("ring_attention: this rank (", rank, ") holds ", q.size(-2), " queries; the ",
                     sequence_layout_name(options.layout), " layout of ", lq, " gives it ", local);
  }
  Tensor cur_k = k.contiguous(), cur_v = v.contiguous();
  for (int s = 0; s < p; ++s) {
    const int src = (rank - s + p) % p;  // whose K/V block this rank holds at step s
    std::vector<Request> transfers;
    Tensor next_k, next_v;
    if (s + 1 < p) {
      const int64_t n = ring.kv_lengths[static_cast<size_t>((src - 1 + p) % p)];
      next_k = Tensor::empty(with_last2(k, n, k.size(-1)));
      next_v = Tensor::empty(with_last2(v, n, v.size(-1)));
      transfers.push_back(comm.irecv(next_k, (rank - 1 + p) % p, 2 * s));
      transfers.push_back(comm.irecv(next_v, (rank - 1 + p) % p, 2 * s + 1));
      transfers.push_back(comm.isend(cur_k, (rank + 1) % p, 2 * s));
      transfers.push_back(comm.isend(cur_v, (rank + 1) % p, 2 * s + 1));
    }
    ring.attend(cur_k, cur_v, src);
    wait_all(transfers);
    cur_k = next_k;
    cur_v = next_v;
  }
  AttentionResult result;
  if (ring.acc.size() == 1) {
    result.output = ring.acc[0].out;
    if (options.return_logsumexp) result.logsumexp = ring.acc[0].lse;
    return result;
  }
  result.output = Tensor::empty(with_last2(q, q.size(-2), v.size(-1)));
  Shape ls = q.shape();
  ls.pop_back();
  Tensor lse = Tensor::empty(ls);
  for (const Accumulator& a : ring.acc) {
    result.output.slice(-2, a.local_start, a.local_start + a.chunk.length).copy_from(a.out);
    lse.slice(-1, a.local_start, a.local_start + a.chunk.length).copy_from(a.lse);
  }
  if (options.return_logsumexp) result.logsumexp = lse;
  return result;
}

}  // namespace

AttentionResult ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Communicator& comm,
                               const RingAttentionOptions& options) {
  return naming_failures("ring_attention", comm, q, [&] { return run_ring(q, k, v, comm, options); });
}

}  // namespace qkv::dist
