// qkv_dist_failure MODE: a two-rank ring attention in which rank 1 fails, for
// peer_failure.cmake to check that the job ends with an error instead of hanging.
//   dies:   rank 1 is killed (SIGKILL) before it posts its side; mpiexec ends the job.
//   silent: rank 1 stays alive but never posts its side; rank 0's wait runs past
//           QKV_DIST_TIMEOUT and fails with a CommunicationError, which aborts the job.

#include <chrono>
#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

#include "qkv/dist/ring_attention.h"
#include "qkv/error.h"

int main(int argc, char** argv) {
  qkv::dist::MpiSession mpi(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  const qkv::dist::Communicator comm = qkv::dist::Communicator::world();
  if (comm.size() < 2 || (mode != "dies" && mode != "silent")) {
    std::fprintf(stderr, "usage: mpiexec -np 2 qkv_dist_failure dies|silent\n");
    return 2;
  }
  const qkv::Tensor q = qkv::Tensor::randn({1, 2, 256, 16}, 1);
  if (comm.rank() == 1) {
    if (mode == "dies") std::raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::seconds(60));  // alive, silent
    return 0;
  }
  try {
    (void)qkv::dist::ring_attention(q, q, q, comm);
  } catch (const qkv::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  std::fprintf(stderr, "rank %d: ring_attention returned without its peer\n", comm.rank());
  return 1;
}
