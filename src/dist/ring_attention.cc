// Ring attention over MPI (qkv/dist/ring_attention.h).
#include "qkv/dist/ring_attention.h"

#include <limits>
#include <string>
#include <vector>

#include "dist/internal.h"
#include "dist/ring_plan.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

// The running output of one local query chunk: out [..., Hq, l, Dv], lse [..., Hq, l].
struct Accumulator {
  QueryChunk query;
  Tensor out, lse;
};

// Attention of every local query chunk against rank `src`'s K/V block, folded into `acc`.
// Between kernel calls the transfers in flight are tested: MPI moves a large message only
// inside an MPI call on the receiving side (Open MPI's shared-memory rendezvous, and most
// network transports without a progress thread), so each test lets the next block advance.
void attend(const RingPlan& plan, const Tensor& q, const Tensor& k, const Tensor& v, int src,
            std::vector<Accumulator>& acc, std::vector<Request>& transfers) {
  for (Accumulator& a : acc) {
    for (const KeyChunk& kc : plan.key_chunks(src)) {
      const Pair kind = plan.pair(a.query.chunk, kc.chunk);
      if (kind == Pair::skip) continue;
      for (Request& t : transfers) t.test();
      const int64_t k0 = kc.block_start, k1 = k0 + kc.chunk.length;
      const Tensor qa = q.slice(-2, a.query.local_start, a.query.local_start + a.query.chunk.length);
      AttentionResult r = scaled_dot_product_attention(qa, k.slice(-2, k0, k1), v.slice(-2, k0, k1),
                                                       plan.block_options(a.query, kc, kind));
      merge_partial(a.out, a.lse, r.output.contiguous(), r.logsumexp->contiguous());
    }
  }
}

AttentionResult assemble(const Tensor& q, const Tensor& v, std::vector<Accumulator>& acc, bool with_lse) {
  AttentionResult result;
  if (acc.size() == 1) {
    result.output = acc[0].out;
    if (with_lse) result.logsumexp = acc[0].lse;
    return result;
  }
  result.output = Tensor::empty(with_last2(q, q.size(-2), v.size(-1)));
  Shape ls = q.shape();
  ls.pop_back();
  Tensor lse = Tensor::empty(ls);
  for (const Accumulator& a : acc) {
    const int64_t r0 = a.query.local_start, r1 = r0 + a.query.chunk.length;
    result.output.slice(-2, r0, r1).copy_from(a.out);
    lse.slice(-1, r0, r1).copy_from(a.lse);
  }
  if (with_lse) result.logsumexp = lse;
  return result;
}

AttentionResult run_ring(const Tensor& q, const Tensor& k, const Tensor& v, const Communicator& comm,
                         const RingAttentionOptions& options) {
  const RingPlan plan = make_ring_plan("ring_attention", q, k, v, comm, options);
  const int p = comm.size(), rank = comm.rank();
  std::vector<Accumulator> acc;
  for (const QueryChunk& c : plan.queries) {
    Shape ls = q.shape();  // [..., Hq, l]
    ls.pop_back();
    ls.back() = c.chunk.length;
    acc.push_back({c, Tensor::zeros(with_last2(q, c.chunk.length, v.size(-1))),
                   Tensor::full(ls, -std::numeric_limits<double>::infinity())});
  }
  Tensor cur_k = k.contiguous(), cur_v = v.contiguous();
  for (int s = 0; s < p; ++s) {
    const int src = (rank - s + p) % p;  // whose K/V block this rank holds at step s
    std::vector<Request> transfers;
    Tensor next_k, next_v;
    if (s + 1 < p) {  // the next block is in flight while this one is computed on
      const int64_t n = plan.kv_lengths[static_cast<size_t>((src - 1 + p) % p)];
      next_k = Tensor::empty(with_last2(k, n, k.size(-1)));
      next_v = Tensor::empty(with_last2(v, n, v.size(-1)));
      transfers.push_back(comm.irecv(next_k, (rank - 1 + p) % p, 2 * s));
      transfers.push_back(comm.irecv(next_v, (rank - 1 + p) % p, 2 * s + 1));
      transfers.push_back(comm.isend(cur_k, (rank + 1) % p, 2 * s));
      transfers.push_back(comm.isend(cur_v, (rank + 1) % p, 2 * s + 1));
    }
    attend(plan, q, cur_k, cur_v, src, acc, transfers);
    wait_all(transfers);
    cur_k = next_k;
    cur_v = next_v;
  }
  return assemble(q, v, acc, options.return_logsumexp);
}

}  // namespace

AttentionResult ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const Communicator& comm,
                               const RingAttentionOptions& options) {
  return naming_failures("ring_attention", comm, q, [&] { return run_ring(q, k, v, comm, options); });
}

}  // namespace qkv::dist
