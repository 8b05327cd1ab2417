// LevelDB table writer, as leveldb/table/{table_builder,block_builder,format}.cc and
// TensorFlow's copy (tensorflow/core/lib/io/table_builder.cc) build one: entries with
// shared-prefix keys, restart points, block trailers with masked crc32c, an index of
// shortest separators and the footer. No compression, no filter block (what TF's
// BundleWriter asks for).
#include <stdexcept>

#include "io/keras_tf/tf_internal.h"

namespace qkv::io::detail {
namespace {

constexpr int kRestartInterval = 16;  // data blocks (Options::block_restart_interval)
constexpr uint64_t kTableMagic = 0xdb4775248b80fb57ull;
constexpr size_t kHandlesSize = 40;  // two block handles of at most 20 bytes each

void put_fixed32(std::string& out, uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
}

class BlockBuilder {
 public:
  explicit BlockBuilder(int restart_interval) : interval_(restart_interval) {}
  bool empty() const { return buffer_.empty(); }
  // BlockBuilder::CurrentSizeEstimate: entries, restart array and its count.
  size_t size_estimate() const { return buffer_.size() + restarts_.size() * 4 + 4; }
  void add(const std::string& key, std::string_view value) {
    size_t shared = 0;
    if (counter_ < interval_) {
      while (shared < last_key_.size() && shared < key.size() && last_key_[shared] == key[shared]) ++shared;
    } else {
      restarts_.push_back(static_cast<uint32_t>(buffer_.size()));
      counter_ = 0;
    }
    put_varint(buffer_, shared);
    put_varint(buffer_, key.size() - shared);
    put_varint(buffer_, value.size());
    buffer_.append(key, shared);
    buffer_.append(value);
    last_key_ = key;
    ++counter_;
  }
  std::string finish() {
    std::string out = std::move(buffer_);
    for (uint32_t r : restarts_) put_fixed32(out, r);
    put_fixed32(out, static_cast<uint32_t>(restarts_.size()));
    buffer_.clear();
    restarts_ = {0};
    counter_ = 0;
    last_key_.clear();
    return out;
  }

 private:
  int interval_;
  std::string buffer_, last_key_;
  std::vector<uint32_t> restarts_ = {0};
  int counter_ = 0;
};

struct Handle {
  uint64_t offset = 0, size = 0;
  std::string encode() const {
    std::string out;
    put_varint(out, offset);
    put_varint(out, size);
    return out;
  }
};

// Appends `contents` and its trailer (type 0, masked crc32c of contents + type).
Handle write_block(std::string& file, const std::string& contents) {
  const Handle h{file.size(), contents.size()};
  file += contents;
  const char type = 0;
  const auto* data = reinterpret_cast<const std::byte*>(contents.data());
  const uint32_t crc =
      crc32c_extend(crc32c_extend(0, data, contents.size()), reinterpret_cast<const std::byte*>(&type), 1);
  file.push_back(type);
  put_fixed32(file, crc32c_mask(crc));
  return h;
}

// BytewiseComparator::FindShortestSeparator: a short key in [start, limit).
std::string shortest_separator(std::string start, const std::string& limit) {
  const size_t n = std::min(start.size(), limit.size());
  size_t diff = 0;
  while (diff < n && start[diff] == limit[diff]) ++diff;
  if (diff < n) {
    const auto byte = static_cast<uint8_t>(start[diff]);
    if (byte < 0xff && byte + 1 < static_cast<uint8_t>(limit[diff])) {
      start[diff] = static_cast<char>(byte + 1);
      start.resize(diff + 1);
    }
  }
  return start;
}

// BytewiseComparator::FindShortSuccessor: a short key >= `key`.
std::string short_successor(std::string key) {
  for (size_t i = 0; i < key.size(); ++i) {
    if (static_cast<uint8_t>(key[i]) != 0xff) {
      key[i] = static_cast<char>(static_cast<uint8_t>(key[i]) + 1);
      key.resize(i + 1);
      break;
    }
  }
  return key;
}

}  // namespace

std::string build_leveldb_table(const std::vector<std::pair<std::string, std::string>>& entries, size_t block_size) {
  std::string file;
  BlockBuilder data(kRestartInterval), index(1);
  std::string last_key;
  bool pending_index = false;
  Handle pending;
  for (size_t i = 0; i < entries.size(); ++i) {
    const auto& [key, value] = entries[i];
    if (i > 0 && !(last_key < key)) throw std::logic_error("build_leveldb_table: keys not strictly increasing");
    if (pending_index) {
      index.add(shortest_separator(last_key, key), pending.encode());
      pending_index = false;
    }
    data.add(key, value);
    last_key = key;
    if (data.size_estimate() >= block_size) {
      pending = write_block(file, data.finish());
      pending_index = true;
    }
  }
  if (!data.empty()) {
    pending = write_block(file, data.finish());
    pending_index = true;
  }
  const Handle meta = write_block(file, BlockBuilder(kRestartInterval).finish());
  if (pending_index) index.add(short_successor(last_key), pending.encode());
  const Handle idx = write_block(file, index.finish());
  std::string footer = meta.encode() + idx.encode();
  footer.resize(kHandlesSize, '\0');
  put_fixed32(footer, static_cast<uint32_t>(kTableMagic));
  put_fixed32(footer, static_cast<uint32_t>(kTableMagic >> 32));
  return file + footer;
}

}  // namespace qkv::io::detail
