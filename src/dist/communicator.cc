// Communicator: tensors over MPI (qkv/dist/communicator.h).
#include "qkv/dist/communicator.h"

#include <algorithm>
#include <array>
#include <climits>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "dist/internal.h"
#include "qkv/device.h"
#include "qkv/error.h"

namespace qkv::dist {

struct Communicator::Handle {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;
  ~Handle() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned && !finalized && comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
  }
};

namespace {

void require_initialized(const char* op) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) fail<CommunicationError>(op, ": MPI is not initialised (qkv::dist::MpiSession, or mpi4py)");
}

// Bytes as an MPI count (int): one message of 2 GiB or more is refused, not truncated.
int byte_count(size_t nbytes, const std::string& what) {
  if (nbytes > static_cast<size_t>(INT_MAX)) {
    fail<CommunicationError>(what, ": ", nbytes, " bytes exceed one MPI message's int count; split the tensor");
  }
  return static_cast<int>(nbytes);
}

// Host arrays that a non-blocking operation reads or writes live in tensors, which its
// Request keeps alive (and never frees if it is abandoned).
template <class T>
Tensor host_array(const std::vector<T>& values) {
  return Tensor::from_vector(values, {static_cast<int64_t>(values.size())});
}

std::string describe(const Tensor& t) { return shape_str(t.shape()) + " " + std::string(dtype_name(t.dtype())); }

}  // namespace

Communicator::Communicator(std::shared_ptr<Handle> handle) : handle_(std::move(handle)) {
  check_mpi(MPI_Comm_set_errhandler(handle_->comm, MPI_ERRORS_RETURN), "Communicator: MPI_Comm_set_errhandler");
  check_mpi(MPI_Comm_rank(handle_->comm, &rank_), "Communicator: MPI_Comm_rank");
  check_mpi(MPI_Comm_size(handle_->comm, &size_), "Communicator: MPI_Comm_size");
}

Communicator Communicator::world() {
  require_initialized("Communicator::world");
  auto h = std::make_shared<Handle>();
  h->comm = MPI_COMM_WORLD;
  return Communicator(std::move(h));
}

Communicator Communicator::borrow(MPI_Comm comm) {
  require_initialized("Communicator::borrow");
  if (comm == MPI_COMM_NULL) fail<ValueError>("Communicator::borrow: MPI_COMM_NULL");
  auto h = std::make_shared<Handle>();
  h->comm = comm;
  return Communicator(std::move(h));
}

MPI_Comm Communicator::handle() const { return handle_->comm; }

Communicator Communicator::split(int color, int key) const {
  // MPI_Comm_split blocks with no deadline, so a rank that never calls split used to hang the
  // others for good. An all-gather first (whose wait polls QKV_DIST_TIMEOUT) makes that a
  // CommunicationError; once every rank has arrived, the split itself does not wait long.
  try {
    (void)all_gather_values(color);
  } catch (const CommunicationError& e) {
    fail<CommunicationError>("Communicator::split (rank ", rank_, " of ", size_, "): ", e.what());
  }
  auto h = std::make_shared<Handle>();
  check_mpi(MPI_Comm_split(handle_->comm, color, key, &h->comm), "Communicator::split");
  h->owned = true;
  return Communicator(std::move(h));
}

void Communicator::send(const Tensor& tensor, int dest, int tag) const { isend(tensor, dest, tag).wait(); }

void Communicator::recv(const Tensor& into, int source, int tag) const { irecv(into, source, tag).wait(); }

Request Communicator::isend(const Tensor& tensor, int dest, int tag) const {
  const std::string what = detail::concat("isend of ", describe(tensor), " from rank ", rank_, " to rank ", dest);
  require_cpu(what, {&tensor});          // MPI reads host memory (no CUDA-aware transport here)
  const Tensor c = tensor.contiguous();  // a view of `tensor` when it is contiguous
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Isend(c.raw_data(), byte_count(c.nbytes(), what), MPI_BYTE, dest, tag, handle_->comm, &r), what);
  return Request(r, what, {c});
}

Request Communicator::irecv(const Tensor& into, int source, int tag) const {
  const std::string what = detail::concat("irecv of ", describe(into), " on rank ", rank_, " from rank ", source);
  require_cpu(what, {&into});
  if (!into.is_contiguous()) fail<ValueError>(what, ": the receiving tensor must be contiguous");
  if (into.is_read_only()) fail<ValueError>(what, ": the receiving tensor is read-only");
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Irecv(into.raw_data(), byte_count(into.nbytes(), what), MPI_BYTE, source, tag, handle_->comm, &r),
            what);
  return Request(r, what, {into}, static_cast<int64_t>(into.nbytes()));
}

void Communicator::all_reduce_sum(const Tensor& tensor) const {
  const std::string what = detail::concat("all_reduce_sum of ", describe(tensor), " on rank ", rank_);
  // Each rank checks its tensor, then the ranks exchange (element count, dtype), -1 for a refusal:
  // a tensor refused on one rank is an error on every rank (not a wait for the refusing one), and
  // another count or dtype is an error instead of MPI reading past a shorter buffer or summing
  // one rank's float64 bytes as another's float32.
  MPI_Datatype type = MPI_DATATYPE_NULL;
  std::exception_ptr refused;
  try {
    require_cpu(what, {&tensor});
    switch (tensor.dtype()) {
      case DType::f32: type = MPI_FLOAT; break;
      case DType::f64: type = MPI_DOUBLE; break;
      case DType::i32: type = MPI_INT32_T; break;
      case DType::i64: type = MPI_INT64_T; break;
      default: fail<DTypeError>(what, ": sums f32, f64, i32 and i64 tensors");
    }
    if (!tensor.is_contiguous()) fail<ValueError>(what, ": the tensor must be contiguous (it is summed in place)");
    if (tensor.is_read_only()) fail<ValueError>(what, ": the tensor is read-only (it is summed in place)");
  } catch (const Error&) {
    refused = std::current_exception();
  }
  // The count and the dtype in one int64: the dtype in the low 8 bits, which hold any DType (its
  // underlying type is uint8_t); a count fits the other 55 (the allocation limit keeps it far below).
  static_assert(std::is_same_v<std::underlying_type_t<DType>, uint8_t>, "the dtype needs more bits here");
  const int64_t mine = refused ? -1 : tensor.numel() * 256 + static_cast<int64_t>(tensor.dtype());
  const std::vector<int64_t> all = all_gather_values(mine);
  if (refused) std::rethrow_exception(refused);
  for (int r = 0; r < size_; ++r) {
    const int64_t theirs = all[static_cast<size_t>(r)];
    if (theirs == -1) fail<CommunicationError>(what, ": rank ", r, " refused its tensor (its error says why)");
    if (theirs != mine) {
      fail<CommunicationError>(what, ": rank ", r, " has ", theirs / 256, " elements of ",
                               dtype_name(static_cast<DType>(theirs % 256)), ", this rank ", tensor.numel(), " of ",
                               dtype_name(tensor.dtype()));
    }
  }
  MPI_Request req = MPI_REQUEST_NULL;
  const int n = byte_count(static_cast<size_t>(tensor.numel()), what);
  check_mpi(MPI_Iallreduce(MPI_IN_PLACE, tensor.raw_data(), n, type, MPI_SUM, handle_->comm, &req), what);
  Request(req, what, {tensor}).wait();
}

std::vector<int64_t> Communicator::all_gather_values(int64_t value) const {
  const std::string what = detail::concat("all_gather_values on rank ", rank_);
  const Tensor in = host_array(std::vector<int64_t>{value});
  const Tensor out = Tensor::empty({size_}, DType::i64);
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(in.raw_data(), 1, MPI_INT64_T, out.raw_data(), 1, MPI_INT64_T, handle_->comm, &req), what);
  Request(req, what, {in, out}).wait();
  return out.to_vector<int64_t>();
}

namespace {

// The shape and dtype of a tensor as int64 values for one all-gather: [dim, dtype, sizes...].
constexpr size_t kMaxDims = 8;
using ShapeRecord = std::array<int64_t, kMaxDims + 2>;

ShapeRecord shape_record(const Tensor& t, const std::string& what) {
  if (t.dim() > static_cast<int64_t>(kMaxDims)) fail<ValueError>(what, ": at most ", kMaxDims, " dimensions");
  ShapeRecord r{};
  r[0] = t.dim();
  r[1] = static_cast<int64_t>(t.dtype());
  for (int64_t d = 0; d < t.dim(); ++d) r[static_cast<size_t>(d) + 2] = t.size(d);
  return r;
}

std::string record_str(const ShapeRecord& r) {
  const Shape shape(r.begin() + 2, r.begin() + 2 + r[0]);
  return shape_str(shape) + " " + std::string(dtype_name(static_cast<DType>(r[1])));
}

// A contiguous tensor of `shape` over bytes [at, at + its size) of `buffer` (kept alive).
Tensor view_in(const Tensor& buffer, size_t at, const Shape& shape, DType dtype) {
  auto* base = static_cast<std::byte*>(buffer.raw_data()) + at;
  return Tensor::from_blob(base, shape, dtype, {}, std::shared_ptr<void>(buffer.storage(), nullptr));
}

}  // namespace

Tensor Communicator::all_gather(const Tensor& tensor, int64_t dim) const {
  const std::string what = detail::concat("all_gather of ", describe(tensor), " along dim ", dim, " on rank ", rank_);
  // A refusal here (its record's dim -1) is an error on every rank, not a wait for this one.
  const int64_t axis = dim < 0 ? dim + tensor.dim() : dim;
  std::exception_ptr refused;
  ShapeRecord mine{};
  try {
    require_cpu(what, {&tensor});
    if (axis < 0 || axis >= tensor.dim()) fail<IndexError>(what, ": dim out of range");
    mine = shape_record(tensor, what);
  } catch (const Error&) {
    refused = std::current_exception();
    mine[0] = -1;
  }
  const Tensor mine_t = host_array(std::vector<int64_t>(mine.begin(), mine.end()));
  const Tensor all_t = Tensor::empty({size_ * static_cast<int64_t>(mine.size())}, DType::i64);
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(mine_t.raw_data(), static_cast<int>(mine.size()), MPI_INT64_T, all_t.raw_data(),
                           static_cast<int>(mine.size()), MPI_INT64_T, handle_->comm, &req),
            what);
  Request(req, what, {mine_t, all_t}).wait();
  if (refused) std::rethrow_exception(refused);
  std::vector<ShapeRecord> all(static_cast<size_t>(size_));
  const std::vector<int64_t> flat = all_t.to_vector<int64_t>();
  for (size_t r = 0; r < all.size(); ++r)
    std::copy_n(flat.begin() + static_cast<std::ptrdiff_t>(r * mine.size()), mine.size(), all[r].begin());
  Shape out_shape = tensor.shape();
  out_shape[static_cast<size_t>(axis)] = 0;
  std::vector<int> counts(static_cast<size_t>(size_)), displs(static_cast<size_t>(size_));
  size_t bytes = 0;
  for (int r = 0; r < size_; ++r) {
    ShapeRecord other = all[static_cast<size_t>(r)];
    if (other[0] == -1) fail<CommunicationError>(what, ": rank ", r, " refused its tensor (its error says why)");
    const int64_t n = other[static_cast<size_t>(axis) + 2];
    other[static_cast<size_t>(axis) + 2] = mine[static_cast<size_t>(axis) + 2];
    if (other != mine) {
      fail<CommunicationError>(what, ": rank ", r, " has ", record_str(all[static_cast<size_t>(r)]), "; only dim ",
                               axis, " may differ");
    }
    out_shape[static_cast<size_t>(axis)] += n;
    Shape rs = tensor.shape();
    rs[static_cast<size_t>(axis)] = n;
    const size_t rb = static_cast<size_t>(shape_numel(rs)) * tensor.itemsize();
    displs[static_cast<size_t>(r)] = byte_count(bytes, what);
    counts[static_cast<size_t>(r)] = byte_count(rb, what);
    bytes += rb;
  }
  byte_count(bytes, what);
  Tensor out = Tensor::empty(out_shape, tensor.dtype());
  // Along dim 0 the ranks' blocks, one after another, are the concatenation itself.
  const Tensor staging = axis == 0 ? out : Tensor::empty({static_cast<int64_t>(bytes)}, DType::i8);
  const Tensor c = tensor.contiguous();
  const Tensor counts_t = host_array(counts), displs_t = host_array(displs);
  check_mpi(MPI_Iallgatherv(c.raw_data(), byte_count(c.nbytes(), what), MPI_BYTE, staging.raw_data(),
                            counts_t.data<int32_t>(), displs_t.data<int32_t>(), MPI_BYTE, handle_->comm, &req),
            what);
  Request(req, what, {c, staging, counts_t, displs_t}).wait();
  if (axis != 0) {
    int64_t at = 0;
    for (int r = 0; r < size_; ++r) {
      Shape rs = tensor.shape();
      const int64_t n = all[static_cast<size_t>(r)][static_cast<size_t>(axis) + 2];
      rs[static_cast<size_t>(axis)] = n;
      out.slice(axis, at, at + n)
          .copy_from(view_in(staging, static_cast<size_t>(displs[static_cast<size_t>(r)]), rs, tensor.dtype()));
      at += n;
    }
  }
  return out;
}

std::vector<Tensor> Communicator::all_to_all(const std::vector<Tensor>& parts,
                                             const std::vector<Shape>& recv_shapes) const {
  const std::string what = detail::concat("all_to_all on rank ", rank_, " of ", size_);
  const size_t p = static_cast<size_t>(size_);
  std::vector<int> scount(p), sdispl(p), rcount(p), rdispl(p);
  std::vector<int64_t> sent(p), expected(p);
  size_t sbytes = 0, rbytes = 0;
  DType dtype = DType::f32;
  std::exception_ptr refused;  // announced as -1 bytes to every rank: an error there, not a wait
  try {
    if (parts.size() != p || recv_shapes.size() != p) {
      fail<ValueError>(what, ": needs one part and one receive shape per rank, got ", parts.size(), " and ",
                       recv_shapes.size());
    }
    require_cpu(what, parts);
    dtype = parts[0].dtype();
    for (size_t r = 0; r < p; ++r) {
      if (parts[r].dtype() != dtype)
        fail<DTypeError>(what, ": part ", r, " is ", describe(parts[r]), ", part 0 ", describe(parts[0]));
      sent[r] = static_cast<int64_t>(parts[r].nbytes());
      expected[r] = shape_numel(recv_shapes[r]) * static_cast<int64_t>(itemsize(dtype));
      sdispl[r] = byte_count(sbytes, what);
      scount[r] = byte_count(static_cast<size_t>(sent[r]), what);
      rdispl[r] = byte_count(rbytes, what);
      rcount[r] = byte_count(static_cast<size_t>(expected[r]), what);
      sbytes += static_cast<size_t>(sent[r]);
      rbytes += static_cast<size_t>(expected[r]);
    }
  } catch (const Error&) {
    refused = std::current_exception();
    sent.assign(p, -1);
  }
  // Each rank tells each other how many bytes it sends, so a shape disagreement is an error
  // naming both ranks rather than a truncated or overrun buffer.
  MPI_Request req = MPI_REQUEST_NULL;
  const Tensor sent_t = host_array(sent), announced_t = Tensor::empty({size_}, DType::i64);
  check_mpi(
      MPI_Ialltoall(sent_t.raw_data(), 1, MPI_INT64_T, announced_t.raw_data(), 1, MPI_INT64_T, handle_->comm, &req),
      what);
  Request(req, what, {sent_t, announced_t}).wait();
  if (refused) std::rethrow_exception(refused);
  const std::vector<int64_t> announced = announced_t.to_vector<int64_t>();
  for (size_t r = 0; r < p; ++r) {
    if (announced[r] == -1) fail<CommunicationError>(what, ": rank ", r, " refused its parts (its error says why)");
    if (announced[r] != expected[r]) {
      fail<CommunicationError>(what, ": rank ", r, " sends ", announced[r], " bytes, this rank expects ",
                               shape_str(recv_shapes[r]), " ", dtype_name(dtype), " (", expected[r], " bytes)");
    }
  }
  const Tensor send = Tensor::empty({static_cast<int64_t>(sbytes)}, DType::i8);
  const Tensor recv = Tensor::empty({static_cast<int64_t>(rbytes)}, DType::i8);
  for (size_t r = 0; r < p; ++r)
    view_in(send, static_cast<size_t>(sdispl[r]), parts[r].shape(), dtype).copy_from(parts[r]);
  const Tensor sc = host_array(scount), sd = host_array(sdispl), rc = host_array(rcount), rd = host_array(rdispl);
  check_mpi(MPI_Ialltoallv(send.raw_data(), sc.data<int32_t>(), sd.data<int32_t>(), MPI_BYTE, recv.raw_data(),
                           rc.data<int32_t>(), rd.data<int32_t>(), MPI_BYTE, handle_->comm, &req),
            what);
  Request(req, what, {send, recv, sc, sd, rc, rd}).wait();
  std::vector<Tensor> out;
  out.reserve(p);
  for (size_t r = 0; r < p; ++r) out.push_back(view_in(recv, static_cast<size_t>(rdispl[r]), recv_shapes[r], dtype));
  return out;
}

void Communicator::barrier() const {
  const std::string what = detail::concat("barrier on rank ", rank_);
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibarrier(handle_->comm, &req), what);
  Request(req, what, {}).wait();
}

}  // namespace qkv::dist
