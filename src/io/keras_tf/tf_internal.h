// Pieces of the TensorFlow checkpoint reader (not public API): crc32c, a protobuf
// wire-format reader, and a LevelDB table reader. Every reader checks bounds and
// throws FormatError through the Context it is given.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/io_internal.h"
#include "qkv/io_tf.h"

namespace qkv::io::detail {

// ---- crc32c (Castagnoli), as LevelDB and TensorFlow use it ----------------------------
uint32_t crc32c_extend(uint32_t crc, const std::byte* data, size_t n);
inline uint32_t crc32c(std::span<const std::byte> bytes) { return crc32c_extend(0, bytes.data(), bytes.size()); }
// LevelDB/TF store crcs "masked" so that a crc of data holding crcs is not degenerate.
inline uint32_t crc32c_mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }
// Fuzz builds (FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION, set by the QKV_FUZZ CMake option)
// compute checksums but do not enforce them, so that mutated inputs reach the parsers
// behind them instead of stopping at the first crc32c. Every other build enforces them.
#ifdef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION
inline constexpr bool kEnforceChecksums = false;
#else
inline constexpr bool kEnforceChecksums = true;
#endif
inline uint32_t crc32c_unmask(uint32_t masked) {
  const uint32_t rot = masked - 0xa282ead8u;
  return (rot >> 17) | (rot << 15);
}

// ---- protobuf wire format -----------------------------------------------------------
// Reads one message's fields in order. Unknown fields are skipped by the caller
// calling skip(); groups (wire types 3/4) are rejected. `what` names the message.
class ProtoReader {
 public:
  ProtoReader(std::span<const std::byte> bytes, const Context& ctx, std::string what)
      : bytes_(bytes), ctx_(ctx), what_(std::move(what)) {}
  bool done() const { return pos_ >= bytes_.size(); }
  // The next field's number and wire type (0 varint, 1 fixed64, 2 bytes, 5 fixed32).
  std::pair<uint32_t, uint32_t> next_tag();
  uint64_t varint();
  int64_t int64() { return static_cast<int64_t>(varint()); }
  // int32 fields are varints of the sign-extended value; out of range is an error.
  int32_t int32();
  uint32_t fixed32();
  uint64_t fixed64();
  std::span<const std::byte> bytes();
  std::string_view string() {
    const auto b = bytes();
    return {reinterpret_cast<const char*>(b.data()), b.size()};
  }
  void skip(uint32_t wire_type);
  // Checks that field `field` has wire type `expected` (an error otherwise).
  void expect(uint32_t field, uint32_t wire_type, uint32_t expected);

 private:
  std::span<const std::byte> bytes_;
  size_t pos_ = 0;
  const Context& ctx_;
  std::string what_;
};

// A varint at `pos` of `bytes`, advancing pos; nullopt-like false when malformed.
bool read_varint(std::span<const std::byte> bytes, size_t& pos, uint64_t& value);

// Writes one message's fields in the order called, as protobuf's C++ serializer
// does when fields are set in field-number order. Proto3 defaults are the
// caller's to skip. Bytes are kept in a std::string (what the table writer takes).
class ProtoWriter {
 public:
  void varint(uint32_t field, uint64_t value);
  void fixed32(uint32_t field, uint32_t value);
  void bytes(uint32_t field, std::string_view value);
  void message(uint32_t field, const ProtoWriter& m) { bytes(field, m.str()); }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
};
void put_varint(std::string& out, uint64_t value);

// ---- LevelDB table (the format of a TF checkpoint's .index file) -----------------------
struct TableEntry {
  std::string key;
  std::span<const std::byte> value;  // points into the table's bytes
};
// Every key/value of the table in key order: the footer's magic, each block's 5-byte
// trailer (compression 0 only, masked crc32c checked), prefix-compressed entries with
// restart points, and strictly increasing keys are all checked.
std::vector<TableEntry> read_leveldb_table(std::span<const std::byte> table, const Context& ctx);

// A LevelDB table of `entries` (keys strictly increasing, else std::logic_error) as
// LevelDB's TableBuilder writes it with TensorFlow's options: uncompressed data blocks
// of about `block_size` bytes with a restart point every 16 keys, an empty metaindex
// block, an index block of shortest separators (a restart at every entry), each
// block followed by type 0 and its masked crc32c, and the 48-byte footer.
std::string build_leveldb_table(const std::vector<std::pair<std::string, std::string>>& entries,
                                size_t block_size = 262144);

}  // namespace qkv::io::detail

namespace qkv::io::detail {
// Names the entries of a checkpoint listing from its _CHECKPOINTABLE_OBJECT_GRAPH
// (a serialized TrackableObjectGraph): each variable gets its full_name, and is
// marked optimizer state when it is a slot variable or is reachable from the root
// only through an edge named "optimizer". Entries the graph does not mention
// are named from their keys.
void name_from_object_graph(std::string_view graph, std::vector<TensorInfo>& entries, const Context& ctx);
// Without an object graph: names are keys without "/.ATTRIBUTES/VARIABLE_VALUE";
// keys under "optimizer/" or holding "/.OPTIMIZER_SLOT/" are optimizer state.
void name_from_keys(std::vector<TensorInfo>& entries);
// The serialized TrackableObjectGraph for checkpoint keys naming object attributes
// ("a/_b/kernel/.ATTRIBUTES/VARIABLE_VALUE"): a node per escaped path component
// (".S" is '/', ".." is '.', as TF escapes local names), each attribute carrying its
// full name (`full_names`, else the path). Keys without "/.ATTRIBUTES/" are left out;
// "" when no key has one.
std::string build_object_graph(const std::vector<std::string>& keys,
                               const std::map<std::string, std::string>& full_names);
}  // namespace qkv::io::detail
