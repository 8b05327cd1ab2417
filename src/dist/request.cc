// MpiSession, Request and the deadline every wait of qkv::dist polls against.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>

#include "dist/internal.h"
#include "qkv/dist/communicator.h"
#include "qkv/error.h"

namespace qkv::dist {

MpiSession::MpiSession(int* argc, char*** argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
    fail<CommunicationError>("MpiSession: MPI_Init_thread failed");
  }
  owns_ = true;
}

MpiSession::~MpiSession() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

double default_timeout_seconds() {
  // Read on each call (cheap beside a transfer) so that tests may change it.
  const char* s = std::getenv("QKV_DIST_TIMEOUT");
  if (s == nullptr || *s == '\0') return 300.0;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || *end != '\0' || !(v > 0.0)) {
    fail<ValueError>("QKV_DIST_TIMEOUT must be a positive number of seconds, got '", s, "'");
  }
  return v;
}

void check_mpi(int rc, const std::string& what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int n = 0;
  MPI_Error_string(rc, text, &n);
  fail<CommunicationError>(what, " failed: ", std::string(text, static_cast<size_t>(n)));
}

Request::Request(MPI_Request request, std::string what, std::vector<Tensor> keep_alive, int64_t expect_bytes)
    : request_(request), expect_bytes_(expect_bytes), what_(std::move(what)), keep_alive_(std::move(keep_alive)) {}

Request::Request(Request&& other) noexcept
    : request_(std::exchange(other.request_, MPI_REQUEST_NULL)),
      expect_bytes_(other.expect_bytes_),
      what_(std::move(other.what_)),
      keep_alive_(std::move(other.keep_alive_)) {}

Request& Request::operator=(Request&& other) noexcept {
  if (this != &other) {
    settle();
    request_ = std::exchange(other.request_, MPI_REQUEST_NULL);
    expect_bytes_ = other.expect_bytes_;
    what_ = std::move(other.what_);
    keep_alive_ = std::move(other.keep_alive_);
  }
  return *this;
}

Request::~Request() { settle(); }

void Request::settle() noexcept {
  // A request still pending when it is dropped (an exception left its scope) is waited for
  // up to the deadline, never longer: a dead peer must not turn an error into a hang.
  try {
    if (request_ != MPI_REQUEST_NULL && !poll(default_timeout_seconds())) abandon();
  } catch (...) {
    abandon();
  }
}

void Request::abandon() noexcept {
  // MPI may still write into the buffers of a request given up on, so they are never freed
  // (a process with a failed transfer is about to report it and end).
  static auto* abandoned = new std::vector<Tensor>;  // leaked on purpose
  for (Tensor& t : keep_alive_) abandoned->push_back(std::move(t));
  keep_alive_.clear();
  request_ = MPI_REQUEST_NULL;
}

bool Request::test() {
  if (request_ == MPI_REQUEST_NULL) return true;
  int done = 0;
  MPI_Status status;
  check_mpi(MPI_Test(&request_, &done, &status), what_);
  if (!done) return false;
  keep_alive_.clear();
  // A longer message is MPI's truncation error above; a shorter one completes quietly.
  int received = 0;
  if (expect_bytes_ >= 0 && MPI_Get_count(&status, MPI_BYTE, &received) == MPI_SUCCESS && received != expect_bytes_) {
    fail<CommunicationError>(what_, ": received ", received, " bytes, expected ", expect_bytes_,
                             " (the sender's tensor has another shape or dtype)");
  }
  return true;
}

bool Request::poll(double limit) {
  const auto start = std::chrono::steady_clock::now();
  // Spin briefly (a ring step's partner is usually there), then sleep with a growing pause
  // so that waiting ranks leave the cores to ranks still computing.
  auto pause = std::chrono::microseconds(0);
  for (int spins = 0; !test(); ++spins) {
    const std::chrono::duration<double> waited = std::chrono::steady_clock::now() - start;
    if (waited.count() > limit) return false;
    if (spins > 64) {
      pause = std::min(std::chrono::microseconds(1000), pause + std::chrono::microseconds(20));
      std::this_thread::sleep_for(pause);
    }
  }
  return true;
}

void Request::wait(double timeout_seconds) {
  const double limit = timeout_seconds > 0.0 ? timeout_seconds : default_timeout_seconds();
  if (poll(limit)) return;
  abandon();
  fail<CommunicationError>(what_, ": no completion after ", limit,
                           " s (QKV_DIST_TIMEOUT); a peer rank died or never posted its side");
}

void wait_all(std::vector<Request>& requests, double timeout_seconds) {
  for (Request& r : requests) r.wait(timeout_seconds);
}

}  // namespace qkv::dist
