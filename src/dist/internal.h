// Helpers shared by qkv::dist's sources.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "qkv/dist/communicator.h"
#include "qkv/dist/shard.h"
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

// What every rank of a call must agree on, as named fields: the options, the sizes outside the
// sequence axis, the layer's configuration. When the ranks agree only its fingerprint travels
// (agree_on_call: one all-gather of a few int64 per call); its fields, as text, only when they do not,
// so that the error says what differs. Names must outlive the signature (string literals, or the
// keys of a state_dict the caller holds).
class CallSignature {
 public:
  CallSignature& value(const char* name, int64_t v);
  CallSignature& real(const char* name, double v);  // compared bit for bit
  // dtype and sizes; the size of dim `any_dim` (>= 0: the sequence axis) may differ between ranks.
  CallSignature& tensor(const char* name, const Tensor& t, int64_t any_dim = -1);
  CallSignature& tensor(const char* name, const std::optional<Tensor>& t);  // absent: "name none"
  // t's dtype and sizes and a hash of at most 64 of its values, evenly spaced (CPU tensors; a
  // tensor elsewhere: its sizes only): a cheap check that ranks hold the same weights (another
  // checkpoint or seed differs there), not a proof (one changed value can slip between samples).
  CallSignature& sample(const char* name, const Tensor& t);
  int64_t fingerprint() const;              // >= 0 (FNV-1a over the fields)
  std::vector<std::string> fields() const;  // "is_causal 1", "q [2, 4, *, 16] f32", "attn_mask none"

  // A value every rank receives from every rank with the agreement (agree_on_call's result),
  // not compared: ring's and Ulysses' sequence lengths, which took two more all-gathers after it.
  // At most kSharedValues per call.
  static constexpr size_t kSharedValues = 2;
  CallSignature& share(int64_t v);
  const std::vector<int64_t>& shared() const { return shared_; }

 private:
  static constexpr int64_t kAnySize = INT64_MIN;  // a size that may differ between ranks ("*")
  enum class Kind { value, real, tensor, none, sample };
  struct Field {
    const char* name;
    Kind kind;
    size_t begin, end;  // its values in values_
  };
  CallSignature& add(const char* name, Kind kind, std::initializer_list<int64_t> values);
  std::vector<Field> fields_;
  std::vector<int64_t> values_;
  std::vector<int64_t> shared_;
};

// agree_on_call's result: shared[i][r] is rank r's i-th CallSignature::share value (0 where it
// shared fewer).
using SharedValues = std::array<std::vector<int64_t>, CallSignature::kSharedValues>;

// scaled_dot_product_attention's own shape rules (heads and GQA, head dims, K/V lengths, the
// mask's leading dims) checked on a one-query, one-key problem of q, k, v's other sizes, so that
// every rank refuses a bad call, not only the ranks whose work reaches the kernel (a rank
// without queries or heads used to wait QKV_DIST_TIMEOUT while the others failed). ShapeError
// naming `op`, the shapes and the kernel's reason.
void check_kernel_shapes(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, std::optional<double> scale,
                         bool enable_gqa, const std::optional<Tensor>& attn_mask);

// Every rank's shard length of one sequence (`lengths[r]`, gathered) against what `layout` gives
// it; a ShapeError naming the first rank that differs (`what`: "queries", "keys"). Every rank
// checks every rank's length, so that all fail together.
void check_shard_lengths(const char* op, const char* what, const std::vector<int64_t>& lengths, SequenceLayout layout);

// Ring's and Ulysses' options (RingAttentionOptions, UlyssesAttentionOptions) into `sig`:
// is_causal, layout, enable_gqa, scale, matmul precision (the mask: the callers, by its shape).
template <class Options>
void add_options(CallSignature& sig, const Options& o) {
  sig.value("is_causal", o.is_causal)
      .value("layout", static_cast<int64_t>(o.layout))
      .value("enable_gqa", o.enable_gqa)
      .real("scale", o.scale.value_or(0.0))
      .value("scale given", o.scale.has_value())
      .value("matmul_precision", static_cast<int64_t>(o.matmul_precision));
}

// Collective (every rank calls it, first thing in every qkv::dist operation): runs this rank's
// argument checks, `checks`, which return the call's signature, and all-gathers the signatures'
// fingerprints (one record of 1 + kSharedValues int64 per rank, whatever the operation: the
// fingerprint and the values the signature shares; the whole cost when the ranks agree) and returns
// the shared values, by rank. A check that throws on
// one rank makes every other rank fail at once with an error naming that rank and quoting its
// error (instead of waiting QKV_DIST_TIMEOUT for a peer that never posts): the same class for an
// argument error (ShapeError, DTypeError, ValueError, IndexError, DeviceError), a CommunicationError for any
// other failure; the refusing rank throws its own error. Ranks called with different options or
// shapes fail with a ValueError naming the fields that differ, instead of computing with
// mismatched options or overrunning a receive. Only on failure is a second all-gather (the
// errors' and signatures' text) made. refuse_call (communicator.h) is this with a throwing check.
SharedValues agree_on_call(const char* op, const Communicator& comm, const std::function<CallSignature()>& checks);

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
