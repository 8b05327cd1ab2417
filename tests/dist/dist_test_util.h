// Helpers of the qkv::dist tests.
#pragma once

#include <cstdint>
#include <string>

#include "nn/fixtures.h"  // relative_error: max |got - want| / max |want|, and the torch fixtures
#include "qkv/dist/communicator.h"
#include "qkv/dist/shard.h"
#include "qkv/error.h"
#include "qkv/tensor.h"

namespace qkv::dist::testing {

using qkv::nn::testing::relative_error;

// MPI_COMM_WORLD of the job (mpi_main.cc initialised MPI).
inline Communicator world() { return Communicator::world(); }

// One ring / Ulysses problem: q [batch, hq, lq, d], k [batch, hk, lk, d], v [batch, hk, lk, dv],
// sharded along the sequence (dim -2) in `layout`; GQA where hq != hk.
struct AttentionCase {
  int64_t batch, hq, hk, lq, lk, d, dv;
  bool causal;
  SequenceLayout layout;
};

// "B2 H4/2 L37/37 D16/16 causal zigzag", for SCOPED_TRACE.
inline std::string describe(const AttentionCase& c) {
  return detail::concat("B", c.batch, " H", c.hq, "/", c.hk, " L", c.lq, "/", c.lk, " D", c.d, "/", c.dv,
                        c.causal ? " causal " : " ", sequence_layout_name(c.layout));
}

// This rank's shard of a whole-sequence tensor [..., L, X] (its rows along dim -2) in c's layout.
inline Tensor shard(const Tensor& t, const AttentionCase& c, const Communicator& comm) {
  return shard_sequence(t, -2, comm.rank(), comm.size(), c.layout);
}

}  // namespace qkv::dist::testing
