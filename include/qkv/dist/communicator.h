// qkv::dist::Communicator: tensors between processes over MPI (docs/distributed.md).
//
// Every transfer of qkv's distributed attention goes through this class; it is a thin,
// checked layer over an MPI communicator (Open MPI here), never a transport of its own.
// Contiguous tensors are sent and received in place (no copies); others are packed once
// through the copy engine. Every wait polls with a deadline (QKV_DIST_TIMEOUT seconds,
// default 300), so a peer that died or never posts its side ends in a CommunicationError
// naming the operation, the ranks and the shapes instead of a hang; MPI errors are
// returned (MPI_ERRORS_RETURN) and thrown the same way.
#pragma once

// Only MPI's C API: without these, Open MPI's and MPICH's mpi.h pull in the C++ bindings
// (removed from the standard in MPI-3), which then need their own library at link time.
#ifndef OMPI_SKIP_MPICXX
#define OMPI_SKIP_MPICXX 1
#endif
#ifndef MPICH_SKIP_MPICXX
#define MPICH_SKIP_MPICXX 1
#endif
#include <mpi.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::dist {

// MPI_Init_thread(MPI_THREAD_FUNNELED) for the scope's lifetime (MPI_Finalize at the end)
// when MPI is not initialised yet; a no-op otherwise (mpi4py, or the caller, owns MPI).
// Only the thread that initialised MPI may use a Communicator (qkv's worker threads never do).
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;

 private:
  bool owns_ = false;
};

// Seconds a wait may take before it fails (QKV_DIST_TIMEOUT; default 300).
double default_timeout_seconds();

// One pending non-blocking operation. wait() or test() must see it complete before the
// tensors it reads or writes are touched. The destructor of a pending request waits for it
// up to the deadline (and never throws); a request that times out is abandoned and its
// buffers are never freed, so MPI cannot write into freed memory and a dead peer cannot
// turn an error into a hang.
class Request {
 public:
  Request() = default;
  // expect_bytes >= 0: a receive, whose completed message must be exactly that long.
  Request(MPI_Request request, std::string what, std::vector<Tensor> keep_alive, int64_t expect_bytes = -1);
  Request(Request&& other) noexcept;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  // Blocks until done; CommunicationError after `timeout_seconds` (default above).
  void wait(double timeout_seconds = -1.0);
  // True when done (and then the request is released).
  bool test();
  bool pending() const { return request_ != MPI_REQUEST_NULL; }

 private:
  bool poll(double limit_seconds);  // true when done within the limit
  void settle() noexcept;           // before the request is dropped (destructor, assignment)
  void abandon() noexcept;          // gives the request up; its buffers are never freed

  MPI_Request request_ = MPI_REQUEST_NULL;
  int64_t expect_bytes_ = -1;       // receives: the buffer's size (a shorter message is an error too)
  std::string what_;                // "ring_attention: irecv of [1, 8, 512, 64] f32 from rank 1"
  std::vector<Tensor> keep_alive_;  // the buffers MPI reads or writes until completion
};

// Waits for every request (in order), each with the same deadline.
void wait_all(std::vector<Request>& requests, double timeout_seconds = -1.0);

class Communicator {
 public:
  // MPI_COMM_WORLD (MPI must be initialised: MpiSession, mpi4py, or the caller).
  static Communicator world();
  // Borrows `comm` (not freed here): an mpi4py communicator's handle, for instance.
  // Both set MPI_ERRORS_RETURN on the communicator (MPI's default aborts the job on any
  // error; qkv turns errors into CommunicationError), which stays set for the caller too.
  static Communicator borrow(MPI_Comm comm);

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm handle() const;

  // Ranks with the same color form a new communicator, ordered by key (MPI_Comm_split).
  // Collective; a rank that never calls it is a CommunicationError after the deadline.
  Communicator split(int color, int key) const;

  // Point to point. `tensor` of recv must be contiguous and writable, with the sender's
  // shape and dtype (a size mismatch is a CommunicationError naming both).
  void send(const Tensor& tensor, int dest, int tag = 0) const;
  void recv(const Tensor& into, int source, int tag = 0) const;
  Request isend(const Tensor& tensor, int dest, int tag = 0) const;
  Request irecv(const Tensor& into, int source, int tag = 0) const;

  // The collectives below check each rank's tensor before their first exchange and send a
  // refusal through it: a tensor refused on one rank is a CommunicationError on the others at
  // once ("rank 1 refused its tensor"), not a wait for QKV_DIST_TIMEOUT.
  // In place sum over ranks (f32, f64, i32, i64); the same element count and dtype on every rank.
  void all_reduce_sum(const Tensor& tensor) const;
  // Every rank's tensor concatenated along `dim` (the other dimensions equal; sizes along
  // `dim` may differ between ranks). A new contiguous tensor.
  Tensor all_gather(const Tensor& tensor, int64_t dim = 0) const;
  // parts[r] goes to rank r; returns what each rank sent here, received[r] shaped
  // recv_shapes[r] (the caller knows them; a byte-count mismatch is a CommunicationError).
  std::vector<Tensor> all_to_all(const std::vector<Tensor>& parts, const std::vector<Shape>& recv_shapes) const;
  // Every rank's int64 value, by rank.
  std::vector<int64_t> all_gather_values(int64_t value) const;
  void barrier() const;

 private:
  struct Handle;
  explicit Communicator(std::shared_ptr<Handle> handle);
  std::shared_ptr<Handle> handle_;
  int rank_ = 0;
  int size_ = 1;
};

// Every qkv::dist operation (ring, Ulysses, TensorParallelAttention's factories, forward and
// backward) starts with one collective agreement step: each rank checks its own arguments and
// the ranks all-gather a fingerprint of the call (one int64 each), so that a rank refusing its
// arguments makes every rank fail at once, naming it and quoting its error, and ranks called
// differently fail naming what differs (docs/distributed.md).
//
// refuse_call is that step for a rank that cannot make the call the others make (its arguments
// failed before the call: the Python bindings use it when converting them fails): it takes part
// as a refusal, so the others' call of `op` fails at once naming this rank and quoting `error`;
// then it rethrows `error` here. `op` names the operation in the messages
// ("ring_attention", "TensorParallelAttention.forward", ...).
[[noreturn]] void refuse_call(const char* op, const Communicator& comm, std::exception_ptr error);

}  // namespace qkv::dist
