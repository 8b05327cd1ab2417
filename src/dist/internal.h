// Helpers shared by qkv::dist's sources.
#pragma once

#include <bit>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "qkv/dist/communicator.h"
#include "qkv/error.h"
#include "qkv/tensor.h"

namespace qkv::dist {

// Throws CommunicationError "<what> failed: <MPI's error string>" unless rc is MPI_SUCCESS.
void check_mpi(int rc, const std::string& what);

// Folds one partial attention result into a running one (rows of queries):
//   lse = log(exp(lse) + exp(lse_part)),  out = out * exp(lse_old - lse) + part * exp(lse_part - lse)
// out/part [..., L, Dv] f32, lse/lse_part [..., L] f32 (contiguous; out and lse updated in
// place). Rows whose partial has lse_part = -inf (no key allowed) leave out unchanged.
void merge_partial(const Tensor& out, const Tensor& lse, const Tensor& part, const Tensor& lse_part);

// A fingerprint of what every rank of a call must agree on (options, shapes outside the
// sequence axis), mixed into one int64 (FNV-1a over the values).
int64_t call_fingerprint(const std::vector<int64_t>& values);

// scaled_dot_product_attention's own shape rules (heads and GQA, head dims, K/V lengths, the
// mask's leading dims) checked on a one-query, one-key problem of q, k, v's other sizes, so that
// every rank refuses a bad call, not only the ranks whose work reaches the kernel (a rank
// without queries or heads used to wait QKV_DIST_TIMEOUT while the others failed). ShapeError
// naming `op`, the shapes and the kernel's reason.
void check_kernel_shapes(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, std::optional<double> scale,
                         bool enable_gqa, const std::optional<Tensor>& attn_mask);

// The values of ring's and Ulysses' options (RingAttentionOptions, UlyssesAttentionOptions)
// for call_fingerprint: is_causal, layout, enable_gqa, scale, matmul precision, a mask or not.
template <class Options>
std::vector<int64_t> options_values(const Options& o) {
  return {o.is_causal,
          static_cast<int64_t>(o.layout),
          o.enable_gqa,
          o.scale.has_value(),
          std::bit_cast<int64_t>(o.scale.value_or(0.0)),
          static_cast<int64_t>(o.matmul_precision),
          o.attn_mask.has_value()};
}

// Collective (every rank calls it): runs this rank's argument checks, `checks`, which return
// the call's fingerprint, and all-gathers the fingerprints. A check that throws on one rank
// makes every other rank fail at once naming that rank (instead of waiting QKV_DIST_TIMEOUT
// for a peer that never posts), and ranks called with different options or shapes fail with
// a ValueError instead of computing with mismatched options or overrunning a receive.
void agree_on_call(const char* op, const Communicator& comm, const std::function<int64_t()>& checks);

// fn(), with a CommunicationError from inside it renamed after the operation the user called:
// "ring_attention (rank 0 of 2, q [1, 8, 512, 64]): all_gather_values on rank 0: no completion ...".
template <class Fn>
auto naming_failures(const char* op, const Communicator& comm, const Tensor& q, Fn&& fn) {
  try {
    return fn();
  } catch (const CommunicationError& e) {
    fail<CommunicationError>(op, " (rank ", comm.rank(), " of ", comm.size(), ", q ", shape_str(q.shape()),
                             "): ", e.what());
  }
}

}  // namespace qkv::dist
