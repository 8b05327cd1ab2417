// Helpers of the qkv::dist tests.
#pragma once

#include "nn/fixtures.h"  // relative_error: max |got - want| / max |want|, and the torch fixtures
#include "qkv/dist/communicator.h"

namespace qkv::dist::testing {

using qkv::nn::testing::relative_error;

// MPI_COMM_WORLD of the job (mpi_main.cc initialised MPI).
inline Communicator world() { return Communicator::world(); }

}  // namespace qkv::dist::testing
