// A minimal protobuf wire format: a reader (varints, fixed32/64, length-delimited
// fields, skipping of unknown fields; every read is bounds-checked) and a writer.
#include <cstring>

#include "io/keras_tf/tf_internal.h"

namespace qkv::io::detail {

bool read_varint(std::span<const std::byte> bytes, size_t& pos, uint64_t& value) {
  value = 0;
  for (int shift = 0; shift < 64; shift += 7) {
    if (pos >= bytes.size()) return false;
    const auto b = static_cast<uint64_t>(bytes[pos++]);
    if (shift == 63 && (b & 0x7e) != 0) return false;  // more than 64 bits
    value |= (b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

std::pair<uint32_t, uint32_t> ProtoReader::next_tag() {
  const uint64_t tag = varint();
  const auto field = static_cast<uint64_t>(tag >> 3);
  if (field == 0 || field > 0x1fffffff) fail_at(ctx_, what_, ": invalid field number ", field);
  return {static_cast<uint32_t>(field), static_cast<uint32_t>(tag & 7)};
}

uint64_t ProtoReader::varint() {
  uint64_t v = 0;
  const size_t at = pos_;
  if (!read_varint(bytes_, pos_, v)) fail_at(ctx_, what_, ": truncated or overlong varint at byte ", at);
  return v;
}

int32_t ProtoReader::int32() {
  const auto v = static_cast<int64_t>(varint());
  if (v < INT32_MIN || v > INT32_MAX) fail_at(ctx_, what_, ": int32 field out of range: ", v);
  return static_cast<int32_t>(v);
}

uint32_t ProtoReader::fixed32() {
  if (bytes_.size() - pos_ < 4) fail_at(ctx_, what_, ": truncated fixed32 at byte ", pos_);
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint32_t>(bytes_[pos_ + static_cast<size_t>(i)]);
  pos_ += 4;
  return v;
}

uint64_t ProtoReader::fixed64() {
  if (bytes_.size() - pos_ < 8) fail_at(ctx_, what_, ": truncated fixed64 at byte ", pos_);
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint64_t>(bytes_[pos_ + static_cast<size_t>(i)]);
  pos_ += 8;
  return v;
}

std::span<const std::byte> ProtoReader::bytes() {
  const uint64_t n = varint();
  if (n > bytes_.size() - pos_) {
    fail_at(ctx_, what_, ": length-delimited field of ", n, " bytes at byte ", pos_, " runs past the end (",
            bytes_.size() - pos_, " left)");
  }
  const auto out = bytes_.subspan(pos_, static_cast<size_t>(n));
  pos_ += static_cast<size_t>(n);
  return out;
}

void ProtoReader::skip(uint32_t wire_type) {
  switch (wire_type) {
    case 0: (void)varint(); return;
    case 1: (void)fixed64(); return;
    case 2: (void)bytes(); return;
    case 5: (void)fixed32(); return;
    default: fail_at(ctx_, what_, ": unsupported wire type ", wire_type, " at byte ", pos_);
  }
}

void ProtoReader::expect(uint32_t field, uint32_t wire_type, uint32_t expected) {
  if (wire_type != expected) {
    fail_at(ctx_, what_, ": field ", field, " has wire type ", wire_type, ", expected ", expected);
  }
}

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}

void ProtoWriter::varint(uint32_t field, uint64_t value) {
  put_varint(out_, uint64_t{field} << 3);
  put_varint(out_, value);
}

void ProtoWriter::fixed32(uint32_t field, uint32_t value) {
  put_varint(out_, uint64_t{field} << 3 | 5);
  for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(value >> (8 * i)));
}

void ProtoWriter::bytes(uint32_t field, std::string_view value) {
  put_varint(out_, uint64_t{field} << 3 | 2);
  put_varint(out_, value.size());
  out_.append(value);
}

}  // namespace qkv::io::detail
