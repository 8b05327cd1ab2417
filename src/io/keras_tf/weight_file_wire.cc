// Layout (little-endian u64 = 8 bytes, str = u64 length + bytes):
//   u64 entry count, per entry: str key, str name, str dtype, u8 optimizer, u64 ndim, i64 dims
//   u64 tensor count, per tensor: str key, u8 DType, u64 ndim, i64 dims, u64 data offset
//   zero padding to a multiple of 64, then the data area; offsets are relative to it
//   and multiples of 64.
#include <array>
#include <cstring>

#include "io/keras_tf/weight_file_wire.h"

namespace qkv::io::detail {
namespace {

constexpr size_t kAlign = Storage::kAlignment;
constexpr std::array<std::byte, kAlign> kZeros{};
constexpr size_t kMaxDims = 64;

size_t padding(size_t n) { return (kAlign - n % kAlign) % kAlign; }

class Writer {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<std::byte>(v)); }
  void u64(uint64_t v) {
    for (size_t i = 0; i < 8; ++i) u8(static_cast<uint8_t>(v >> (8 * i)));
  }
  void str(const std::string& s) {
    u64(s.size());
    const auto* p = reinterpret_cast<const std::byte*>(s.data());
    out_.insert(out_.end(), p, p + s.size());
  }
  void shape(const Shape& shape) {
    u64(shape.size());
    for (int64_t d : shape) u64(static_cast<uint64_t>(d));
  }
  std::vector<std::byte>& bytes() { return out_; }

 private:
  std::vector<std::byte> out_;
};

class Reader {
 public:
  Reader(std::span<const std::byte> bytes, const Context& ctx) : bytes_(bytes), ctx_(ctx) {}
  uint8_t u8() {
    need(1);
    return static_cast<uint8_t>(bytes_[pos_++]);
  }
  uint64_t u64() {
    need(8);
    uint64_t v = 0;
    for (size_t i = 0; i < 8; ++i) v |= static_cast<uint64_t>(bytes_[pos_ + i]) << (8 * i);
    pos_ += 8;
    return v;
  }
  std::string str() {
    const uint64_t n = u64();
    need(n);
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  Shape shape() {
    const uint64_t ndim = u64();
    if (ndim > kMaxDims) garbled(ndim, " dims");
    Shape shape;
    for (uint64_t i = 0; i < ndim; ++i) shape.push_back(static_cast<int64_t>(u64()));
    if (!checked_numel(shape)) garbled("shape ", shape_str(shape));
    return shape;
  }
  // A count of items each at least `min_bytes` long.
  uint64_t count(size_t min_bytes) {
    const uint64_t n = u64();
    if (n > (bytes_.size() - pos_) / min_bytes) garbled("count ", n, " past the end");
    return n;
  }
  size_t pos() const { return pos_; }
  template <class... Args>
  [[noreturn]] void garbled(Args&&... args) const {
    fail_at(ctx_, "reply of the reader process is garbled: ", std::forward<Args>(args)..., " at byte ", pos_);
  }

 private:
  void need(uint64_t n) const {
    if (n > bytes_.size() - pos_) garbled("needs ", n, " bytes, ", bytes_.size() - pos_, " left");
  }
  std::span<const std::byte> bytes_;
  const Context& ctx_;
  size_t pos_ = 0;
};

struct Encoded {
  std::vector<std::byte> table;
  WeightFile file;
};

}  // namespace

IsolatedReply encode_weight_file(WeightFile file) {
  auto enc = std::make_shared<Encoded>();
  enc->file = std::move(file);
  Writer w;
  w.u64(enc->file.entries.size());
  for (const TensorInfo& e : enc->file.entries) {
    w.str(e.key);
    w.str(e.name);
    w.str(e.dtype);
    w.u8(e.optimizer ? 1 : 0);
    w.shape(e.shape);
  }
  w.u64(enc->file.tensors.size());
  uint64_t offset = 0;
  for (const auto& [key, t] : enc->file.tensors) {
    if (!t.is_contiguous()) fail<Error>("encode_weight_file: tensor ", quote_name(key), " is not contiguous");
    w.str(key);
    w.u8(static_cast<uint8_t>(t.dtype()));
    w.shape(t.shape());
    w.u64(offset);
    offset += t.nbytes() + padding(t.nbytes());
  }
  enc->table = std::move(w.bytes());
  IsolatedReply reply;
  reply.chunks.emplace_back(enc->table);
  reply.chunks.emplace_back(kZeros.data(), padding(enc->table.size()));
  for (const auto& [key, t] : enc->file.tensors) {
    reply.chunks.emplace_back(static_cast<const std::byte*>(t.raw_data()), t.nbytes());
    reply.chunks.emplace_back(kZeros.data(), padding(t.nbytes()));
  }
  reply.keep_alive = std::move(enc);
  return reply;
}

WeightFile decode_weight_file(std::shared_ptr<Storage> reply, const Context& ctx) {
  Reader r({reply->data(), reply->nbytes()}, ctx);
  WeightFile out;
  const uint64_t entries = r.count(4 * 8 + 1);
  for (uint64_t i = 0; i < entries; ++i) {
    TensorInfo e;
    e.key = r.str();
    e.name = r.str();
    e.dtype = r.str();
    e.optimizer = r.u8() != 0;
    e.shape = r.shape();
    out.entries.push_back(std::move(e));
  }
  struct Pending {
    std::string key;
    DType dtype;
    Shape shape;
    uint64_t offset;
  };
  std::vector<Pending> pending;
  const uint64_t tensors = r.count(8 + 1 + 8 + 8);
  for (uint64_t i = 0; i < tensors; ++i) {
    Pending p;
    p.key = r.str();
    const uint8_t code = r.u8();
    if (code > static_cast<uint8_t>(DType::b8)) r.garbled("dtype code ", int{code});
    p.dtype = static_cast<DType>(code);
    p.shape = r.shape();
    p.offset = r.u64();
    pending.push_back(std::move(p));
  }
  const size_t data_start = r.pos() + padding(r.pos());
  if (data_start > reply->nbytes()) r.garbled("data area at ", data_start, " past the end");
  const uint64_t data_size = reply->nbytes() - data_start;
  for (const Pending& p : pending) {
    const auto numel = static_cast<uint64_t>(checked_numel(p.shape).value_or(0));  // checked by shape()
    const size_t item = itemsize(p.dtype);
    if (p.offset % kAlign != 0 || p.offset > data_size || numel > (data_size - p.offset) / item) {
      r.garbled("tensor ", quote_name(p.key), " of ", numel, " elements at data offset ", p.offset);
    }
    const size_t at = data_start + static_cast<size_t>(p.offset);
    if (p.dtype == DType::b8) normalize_bools(reply->data() + at, static_cast<size_t>(numel));
    Tensor t = view_or_copy(reply, at, p.dtype, p.shape, contiguous_strides(p.shape));
    if (!out.tensors.emplace(p.key, std::move(t)).second) r.garbled("tensor ", quote_name(p.key), " twice");
  }
  return out;
}

}  // namespace qkv::io::detail
