// qkv_dist_failure MODE: a two-rank ring attention in which rank 1 fails, for
// peer_failure.cmake to check that the job ends with an error instead of hanging.
//   dies:   rank 1 is killed (SIGKILL) before it posts its side; mpiexec ends the job.
//   silent: rank 1 stays alive but never posts its side; rank 0's wait runs past
//           QKV_DIST_TIMEOUT and fails with a CommunicationError, which aborts the job.
//   silent_split: as silent, rank 0 in Communicator::split (MPI_Comm_split has no deadline of
//           its own: rank 0 used to wait for good).
//   refuses: rank 1's tensor-parallel weights do not fit (q_proj.weight one column too wide);
//           every rank must fail at once, rank 0 naming rank 1 and quoting its error (it used to
//           build its layer and wait QKV_DIST_TIMEOUT in forward's first collective). Each rank
//           prints its error and exits 3.

#include <chrono>
#include <csignal>
#include <cstdio>
#include <map>
#include <string>
#include <thread>

#include "qkv/dist/ring_attention.h"
#include "qkv/dist/tensor_parallel_mha.h"
#include "qkv/error.h"

int main(int argc, char** argv) {
  qkv::dist::MpiSession mpi(&argc, &argv);
  const std::string mode = argc > 1 ? argv[1] : "";
  const qkv::dist::Communicator comm = qkv::dist::Communicator::world();
  if (comm.size() < 2 || (mode != "dies" && mode != "silent" && mode != "silent_split" && mode != "refuses")) {
    std::fprintf(stderr, "usage: mpiexec -np 2 qkv_dist_failure dies|silent|silent_split|refuses\n");
    return 2;
  }
  if (mode == "refuses") {
    using qkv::Tensor;
    const int64_t e = 8, wide = comm.rank() == 1 ? e + 1 : e;
    const std::map<std::string, Tensor> sd{{"q_proj.weight", Tensor::randn({e, wide}, 1)},
                                           {"k_proj.weight", Tensor::randn({e, e}, 2)},
                                           {"v_proj.weight", Tensor::randn({e, e}, 3)},
                                           {"o_proj.weight", Tensor::randn({e, e}, 4)}};
    try {
      const auto layer = qkv::dist::TensorParallelAttention::from_projections({e, 2, 2, 4, false}, sd, comm);
      (void)layer.forward(Tensor::randn({3, 1, e}, 5), Tensor::randn({3, 1, e}, 6), Tensor::randn({3, 1, e}, 7));
    } catch (const qkv::Error& err) {
      std::fprintf(stderr, "rank %d: %s\n", comm.rank(), err.what());
      return 3;
    }
    std::fprintf(stderr, "rank %d: TensorParallelAttention returned although rank 1 refused\n", comm.rank());
    return 1;
  }
  const qkv::Tensor q = qkv::Tensor::randn({1, 2, 256, 16}, 1);
  if (comm.rank() == 1) {
    if (mode == "dies") std::raise(SIGKILL);
    std::this_thread::sleep_for(std::chrono::seconds(60));  // alive, silent
    return 0;
  }
  try {
    if (mode == "silent_split")
      (void)comm.split(0, 0);
    else
      (void)qkv::dist::ring_attention(q, q, q, comm);
  } catch (const qkv::Error& e) {
    std::fprintf(stderr, "rank %d: %s\n", comm.rank(), e.what());
    MPI_Abort(MPI_COMM_WORLD, 3);
  }
  std::fprintf(stderr, "rank %d: %s returned without its peer\n", comm.rank(), mode.c_str());
  return 1;
}
