// The agreement step of every qkv::dist operation (dist/internal.h): CallSignature, agree_on_call
// and refuse_call (qkv/dist/communicator.h).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <exception>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "dist/internal.h"
#include "qkv/error.h"

namespace qkv::dist {

CallSignature& CallSignature::add(const char* name, Kind kind, std::initializer_list<int64_t> values) {
  const size_t begin = values_.size();
  values_.insert(values_.end(), values);
  fields_.push_back({name, kind, begin, values_.size()});
  return *this;
}

CallSignature& CallSignature::value(const char* name, int64_t v) { return add(name, Kind::value, {v}); }

CallSignature& CallSignature::share(int64_t v) {
  if (shared_.size() == kSharedValues) throw std::logic_error("CallSignature::share: more than kSharedValues");
  shared_.push_back(v);
  return *this;
}

CallSignature& CallSignature::real(const char* name, double v) {
  return add(name, Kind::real, {std::bit_cast<int64_t>(v)});
}

CallSignature& CallSignature::tensor(const char* name, const Tensor& t, int64_t any_dim) {
  add(name, Kind::tensor, {static_cast<int64_t>(t.dtype())});
  for (int64_t d = 0; d < t.dim(); ++d) values_.push_back(d == any_dim ? kAnySize : t.size(d));
  fields_.back().end = values_.size();
  return *this;
}

CallSignature& CallSignature::tensor(const char* name, const std::optional<Tensor>& t) {
  return t ? tensor(name, *t) : add(name, Kind::none, {});
}

CallSignature& CallSignature::sample(const char* name, const Tensor& t) {
  tensor(name, t);
  uint64_t h = 0;
  if (t.device().is_cpu() && t.numel() > 0) {
    constexpr int64_t kSamples = 64;
    const int64_t n = t.numel(), count = std::min(n, kSamples);
    std::vector<int64_t> index(static_cast<size_t>(t.dim()));
    for (int64_t i = 0; i < count; ++i) {
      int64_t flat = count == 1 ? 0 : i * (n - 1) / (count - 1);
      for (int64_t d = t.dim() - 1; d >= 0; --d) {
        index[static_cast<size_t>(d)] = flat % t.size(d);
        flat /= t.size(d);
      }
      h = (h ^ std::bit_cast<uint64_t>(t.item(index))) * 1099511628211ULL;
    }
  }
  fields_.back().kind = Kind::sample;
  values_.push_back(static_cast<int64_t>(h));
  fields_.back().end = values_.size();
  return *this;
}

int64_t CallSignature::fingerprint() const {
  uint64_t h = 14695981039346656037ULL;  // FNV-1a, 8 bytes per value
  auto mix = [&h](int64_t v) {
    for (int b = 0; b < 64; b += 8) {
      h ^= (static_cast<uint64_t>(v) >> b) & 0xffU;
      h *= 1099511628211ULL;
    }
  };
  for (const Field& f : fields_) {
    mix(static_cast<int64_t>(f.kind));
    mix(static_cast<int64_t>(f.end - f.begin));
    for (size_t i = f.begin; i < f.end; ++i) mix(values_[i]);
  }
  return static_cast<int64_t>(h >> 1);  // >= 0: negative values are agree_on_call's "refused"
}

std::vector<std::string> CallSignature::fields() const {
  std::vector<std::string> out;
  for (const Field& f : fields_) {
    std::ostringstream s;
    s << f.name << ' ';
    if (f.kind == Kind::value) s << values_[f.begin];
    if (f.kind == Kind::real) s << std::bit_cast<double>(values_[f.begin]);
    if (f.kind == Kind::none) s << "none";
    if (f.kind == Kind::tensor || f.kind == Kind::sample) {
      const size_t end = f.kind == Kind::sample ? f.end - 1 : f.end;  // a sample's hash comes last
      s << '[';
      for (size_t i = f.begin + 1; i < end; ++i) {
        s << (i > f.begin + 1 ? ", " : "");
        if (values_[i] == kAnySize)
          s << '*';
        else
          s << values_[i];
      }
      s << "] " << dtype_name(static_cast<DType>(values_[f.begin]));
      if (f.kind == Kind::sample) s << " (sampled values #" << std::hex << values_[end] << std::dec << ')';
    }
    out.push_back(s.str());
  }
  return out;
}

namespace {

// Every rank's `text`, by rank (collective; agree_on_call's failure path only).
std::vector<std::string> gather_texts(const Communicator& comm, const std::string& text) {
  const std::vector<int8_t> bytes(text.begin(), text.end());
  const int64_t n = static_cast<int64_t>(bytes.size());
  const std::vector<int64_t> lengths = comm.all_gather_values(n);
  const std::vector<int8_t> all = comm.all_gather(Tensor::from_vector(bytes, {n}), 0).to_vector<int8_t>();
  std::vector<std::string> out;
  size_t at = 0;
  for (const int64_t len : lengths) {
    out.emplace_back(all.begin() + static_cast<std::ptrdiff_t>(at),
                     all.begin() + static_cast<std::ptrdiff_t>(at + static_cast<size_t>(len)));
    at += static_cast<size_t>(len);
  }
  return out;
}

// A refusal as text: one letter for the class its peers throw, then the message (at most 2 KiB).
std::string refusal_text(const std::exception_ptr& e) {
  char kind = 'C';  // any other failure: a CommunicationError on the peers
  std::string what = "an exception that is not a std::exception";
  try {
    std::rethrow_exception(e);
  } catch (const ShapeError& x) {
    kind = 'S', what = x.what();
  } catch (const DTypeError& x) {
    kind = 'D', what = x.what();
  } catch (const ValueError& x) {
    kind = 'V', what = x.what();
  } catch (const IndexError& x) {
    kind = 'I', what = x.what();
  } catch (const DeviceError& x) {
    kind = 'X', what = x.what();
  } catch (const std::exception& x) {
    what = x.what();
  } catch (...) {
  }
  constexpr size_t kMax = 2048;
  if (what.size() > kMax) what = what.substr(0, kMax) + " ...";
  return kind + what;
}

[[noreturn]] void fail_as(char kind, const std::string& message) {
  switch (kind) {
    case 'S': throw ShapeError(message);
    case 'D': throw DTypeError(message);
    case 'V': throw ValueError(message);
    case 'I': throw IndexError(message);
    case 'X': throw DeviceError(message);
    default: throw CommunicationError(message);
  }
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

// The failure path of agree_on_call, on a rank that did not refuse: some rank refused, or the
// ranks' signatures differ. `texts`: every rank's refusal ('R' + refusal_text) or fields ('F' +
// one per line).
[[noreturn]] void fail_disagreement(const char* op, const Communicator& comm, const std::vector<int64_t>& all,
                                    const std::vector<std::string>& texts) {
  const int me = comm.rank(), p = comm.size();
  std::vector<int> refused;
  for (int r = 0; r < p; ++r) {
    if (texts[static_cast<size_t>(r)].rfind("R", 0) == 0) refused.push_back(r);
  }
  if (!refused.empty()) {
    const std::string& first = texts[static_cast<size_t>(refused[0])];
    std::ostringstream who;
    for (size_t i = 0; i < refused.size(); ++i) who << (i ? ", " : "") << refused[i];
    fail_as(first[1], detail::concat(op, ": rank", refused.size() > 1 ? "s " : " ", who.str(), " of ", p,
                                     " refused the call, so rank ", me, " stops too; rank ", refused[0],
                                     " said: ", first.substr(2)));
  }
  // The ranks whose call differs from rank 0's (or, on those, rank 0 is the other side).
  int other = all[0] != all[static_cast<size_t>(me)] ? 0 : -1;
  for (int r = 0; other < 0 && r < p; ++r) {
    if (all[static_cast<size_t>(r)] != all[static_cast<size_t>(me)]) other = r;
  }
  const std::vector<std::string> a = split_lines(texts[static_cast<size_t>(other)].substr(1));
  const std::vector<std::string> b = split_lines(texts[static_cast<size_t>(me)].substr(1));
  std::ostringstream theirs, mine;
  for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
    const std::string x = i < a.size() ? a[i] : "-", y = i < b.size() ? b[i] : "-";
    if (x == y) continue;
    theirs << (theirs.tellp() > 0 ? ", " : "") << x;
    mine << (mine.tellp() > 0 ? ", " : "") << y;
  }
  fail<ValueError>(op, ": rank ", other, " and rank ", me, " of ", p,
                   " were called differently (every rank must make the same call: options, masks, the inputs' "
                   "dtypes and sizes outside the sequence axis, the layer's configuration): rank ",
                   other, " has ", theirs.str(), "; rank ", me, " has ", mine.str());
}

// Every rank's `record` (all of one length on every rank), by rank: one all-gather.
std::vector<int64_t> all_gather_records(const Communicator& comm, const std::vector<int64_t>& record) {
  const std::string what = detail::concat("all_gather_values on rank ", comm.rank());
  const auto n = static_cast<int64_t>(record.size());
  const Tensor in = Tensor::from_vector(record, {n});
  const Tensor out = Tensor::empty({comm.size() * n}, DType::i64);
  MPI_Request req = MPI_REQUEST_NULL;
  check_mpi(MPI_Iallgather(in.raw_data(), static_cast<int>(n), MPI_INT64_T, out.raw_data(), static_cast<int>(n),
                           MPI_INT64_T, comm.handle(), &req),
            what);
  Request(req, what, {in, out}).wait();
  return out.to_vector<int64_t>();
}

}  // namespace

SharedValues agree_on_call(const char* op, const Communicator& comm, const std::function<CallSignature()>& checks) {
  constexpr int64_t kRefused = -1;
  std::exception_ptr refused;
  std::optional<CallSignature> sig;
  try {
    sig = checks();
  } catch (...) {  // any exception (std::bad_alloc too): the others must not wait for this rank
    refused = std::current_exception();
  }
  // The operation's name counts too: ranks in different operations (ring_attention on one,
  // ulysses_attention or ring_attention_backward on another) would otherwise agree on equal
  // fields and pair up their later transfers wrongly.
  int64_t mine = kRefused;
  if (sig) {
    auto h = static_cast<uint64_t>(sig->fingerprint());
    for (const char* c = op; *c != '\0'; ++c) h = (h ^ static_cast<unsigned char>(*c)) * 1099511628211ULL;
    mine = static_cast<int64_t>(h >> 1);
  }
  // One record per rank, of one length on every rank whatever the operation (ranks in different
  // operations must reach the comparison below, not mismatch their counts): the fingerprint, then
  // the shared values.
  constexpr size_t kRecord = 1 + CallSignature::kSharedValues;
  std::vector<int64_t> record(kRecord, 0);
  record[0] = mine;
  if (sig) std::copy(sig->shared().begin(), sig->shared().end(), record.begin() + 1);
  const std::vector<int64_t> flat = all_gather_records(comm, record);
  std::vector<int64_t> all;
  SharedValues shared;
  for (size_t r = 0; r < static_cast<size_t>(comm.size()); ++r) {
    all.push_back(flat[r * kRecord]);
    for (size_t i = 0; i < shared.size(); ++i) shared[i].push_back(flat[r * kRecord + 1 + i]);
  }
  if (std::all_of(all.begin(), all.end(), [mine](int64_t f) { return f == mine; }) && !refused) return shared;
  // The failure path: every rank sees the same `all`, so every rank is here. The texts say why.
  std::string text = refused ? "R" : "Foperation ";  // appended to, not concatenated: GCC 12's -Wrestrict
  text += refused ? refusal_text(refused) : op + std::string("\n");  // misfires on "R" + std::string here
  if (sig) {
    for (const std::string& f : sig->fields()) text += f + "\n";
  }
  if (refused) {
    try {
      (void)gather_texts(comm, text);
    } catch (const Error&) {  // this rank's own error matters more than a failure to explain it
    }
    std::rethrow_exception(refused);
  }
  fail_disagreement(op, comm, all, gather_texts(comm, text));
}

void refuse_call(const char* op, const Communicator& comm, std::exception_ptr error) {
  agree_on_call(op, comm, [&]() -> CallSignature { std::rethrow_exception(error); });
  std::rethrow_exception(error);  // not reached: agree_on_call rethrows it
}

}  // namespace qkv::dist
