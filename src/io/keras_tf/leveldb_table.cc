// LevelDB table reader (the format of a TensorFlow checkpoint's .index file,
// tensorflow/core/lib/io/format.cc and table.cc): footer, block handles, block
// trailers with masked crc32c, prefix-compressed entries and restart points.
#include <algorithm>
#include <cstdio>

#include "io/keras_tf/tf_internal.h"

namespace qkv::io::detail {
namespace {

constexpr size_t kFooterSize = 48;  // two padded block handles (40 bytes) + 8-byte magic
constexpr size_t kTrailerSize = 5;  // compression type byte + masked crc32c
constexpr uint64_t kTableMagic = 0xdb4775248b80fb57ull;
// Prefix compression lets n entries of a few bytes each spell keys of 1, 2, .., n bytes:
// n^2 / 2 bytes of keys from about 5 n bytes of table (a 100 KB index made 1.9 GB). The keys
// read may total at most this many times the table's bytes; TensorFlow's own indexes hold
// 0.4-0.9 times (tests/fixtures), LevelDB's writer at most ~16 (a full key every 16).
constexpr uint64_t kMaxKeyBytesPerTableByte = 64;

struct BlockHandle {
  uint64_t offset = 0, size = 0;
};

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

uint32_t load_le32(const std::byte* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

BlockHandle decode_handle(std::span<const std::byte> bytes, size_t& pos, const Context& ctx, const char* what) {
  BlockHandle h;
  if (!read_varint(bytes, pos, h.offset) || !read_varint(bytes, pos, h.size)) {
    fail_at(ctx, "malformed ", what, " block handle");
  }
  return h;
}

// The contents of the block at `h`, after checking it lies inside the table (before
// the footer), its trailer's compression type is 0 and its crc32c matches.
std::span<const std::byte> read_block(std::span<const std::byte> table, BlockHandle h, const Context& ctx,
                                      const char* what) {
  const uint64_t limit = table.size() - kFooterSize;
  if (h.offset > limit || h.size > limit - h.offset || kTrailerSize > limit - h.offset - h.size) {
    fail_at(ctx, what, " block at offset ", h.offset, " of ", h.size, " bytes (+5 trailer) runs past the ", limit,
            " bytes before the footer");
  }
  const auto contents = table.subspan(static_cast<size_t>(h.offset), static_cast<size_t>(h.size));
  const std::byte* trailer = contents.data() + contents.size();
  const auto type = static_cast<unsigned>(trailer[0]);
  const uint32_t actual = crc32c_extend(crc32c(contents), trailer, 1);
  const uint32_t stored = crc32c_unmask(load_le32(trailer + 1));
  if (kEnforceChecksums && actual != stored) {
    fail_at(ctx, what, " block at offset ", h.offset, " has crc32c ", hex32(actual), " but the trailer says ",
            hex32(stored));
  }
  if (type != 0) {
    fail_at(ctx, what, " block at offset ", h.offset, " is compressed (type ", type, type == 1 ? ", snappy" : "",
            "); TensorFlow writes checkpoint indexes uncompressed and qkv reads only those");
  }
  return contents;
}

// Entries of one block in order, keys made whole from their shared prefixes; their
// lengths are taken from `key_budget` (bytes the table's keys may still take).
std::vector<TableEntry> parse_block(std::span<const std::byte> block, uint64_t offset, uint64_t& key_budget,
                                    const Context& ctx, const char* what) {
  auto bad = [&](auto&&... args) { fail_at(ctx, what, " block at offset ", offset, ": ", args...); };
  if (block.size() < 4) bad("only ", block.size(), " bytes, too short for the restart count");
  const uint32_t num_restarts = load_le32(block.data() + block.size() - 4);
  if (num_restarts == 0 || num_restarts > (block.size() - 4) / 4) bad("invalid restart count ", num_restarts);
  const size_t end = block.size() - 4 - size_t{num_restarts} * 4;
  std::vector<TableEntry> entries;
  std::vector<std::pair<size_t, uint64_t>> starts;  // entry offset, its shared length
  std::string key;
  for (size_t pos = 0; pos < end;) {
    const size_t start = pos;
    uint64_t shared = 0, non_shared = 0, value_len = 0;
    const auto head = block.first(end);
    if (!read_varint(head, pos, shared) || !read_varint(head, pos, non_shared) || !read_varint(head, pos, value_len)) {
      bad("malformed entry header at byte ", start);
    }
    if (shared > key.size()) bad("entry at byte ", start, " shares ", shared, " bytes of a ", key.size(), "-byte key");
    if (non_shared > end - pos || value_len > end - pos - non_shared) {
      bad("entry at byte ", start, " (", non_shared, " key + ", value_len, " value bytes) runs past the entries");
    }
    if (shared + non_shared > key_budget) {
      bad("entry at byte ", start, " makes the table's keys pass ", kMaxKeyBytesPerTableByte,
          " times the table's size (prefix-compressed keys this long are not a TensorFlow index)");
    }
    key_budget -= shared + non_shared;
    key.resize(static_cast<size_t>(shared));
    key.append(reinterpret_cast<const char*>(block.data() + pos), static_cast<size_t>(non_shared));
    pos += static_cast<size_t>(non_shared);
    entries.push_back({key, block.subspan(pos, static_cast<size_t>(value_len))});
    pos += static_cast<size_t>(value_len);
    starts.emplace_back(start, shared);
  }
  for (uint32_t i = 0; i < num_restarts; ++i) {
    const uint32_t r = load_le32(block.data() + end + size_t{i} * 4);
    const auto it = std::lower_bound(starts.begin(), starts.end(), std::pair<size_t, uint64_t>{r, 0});
    const bool empty_ok = starts.empty() && r == 0;
    if (!empty_ok && (it == starts.end() || it->first != r || it->second != 0)) {
      bad("restart point ", i, " (byte ", r, ") is not the start of an entry with an unshared key");
    }
  }
  return entries;
}

}  // namespace

std::vector<TableEntry> read_leveldb_table(std::span<const std::byte> table, const Context& ctx) {
  if (table.size() < kFooterSize) {
    fail_at(ctx, "file of ", table.size(), " bytes is too short for a table footer (48 bytes)");
  }
  const auto footer = table.last(kFooterSize);
  const uint64_t magic =
      static_cast<uint64_t>(load_le32(footer.data() + 40)) | static_cast<uint64_t>(load_le32(footer.data() + 44)) << 32;
  if (magic != kTableMagic) fail_at(ctx, "not a LevelDB table (bad magic number in the footer)");
  size_t pos = 0;
  const auto handles = footer.first(40);
  const BlockHandle meta = decode_handle(handles, pos, ctx, "metaindex");
  const BlockHandle index = decode_handle(handles, pos, ctx, "index");
  (void)read_block(table, meta, ctx, "metaindex");  // checked, unused (TF writes no filters)
  uint64_t key_budget = kMaxKeyBytesPerTableByte * table.size();
  const auto index_entries =
      parse_block(read_block(table, index, ctx, "index"), index.offset, key_budget, ctx, "index");
  std::vector<TableEntry> out;
  for (const TableEntry& ie : index_entries) {
    size_t hp = 0;
    const BlockHandle h = decode_handle(ie.value, hp, ctx, "data");
    if (hp != ie.value.size()) fail_at(ctx, "index entry ", quote_name(ie.key), " has trailing bytes after its handle");
    for (TableEntry& e : parse_block(read_block(table, h, ctx, "data"), h.offset, key_budget, ctx, "data")) {
      if (!out.empty() && !(out.back().key < e.key)) {
        fail_at(ctx, "keys out of order: ", quote_name(e.key), " after ", quote_name(out.back().key));
      }
      if (ie.key < e.key) {
        fail_at(ctx, "key ", quote_name(e.key), " is past its index entry ", quote_name(ie.key));
      }
      out.push_back(std::move(e));
    }
  }
  return out;
}

}  // namespace qkv::io::detail
