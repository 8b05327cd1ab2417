// TensorFlow checkpoint (tensor bundle) reader: tensorflow/core/util/tensor_bundle/
// tensor_bundle.{proto,cc}. The .index table maps "" to a BundleHeaderProto and
// each tensor key to a BundleEntryProto; data lies raw in PREFIX.data-*-of-*.
#include <algorithm>
#include <cstdio>
#include <optional>

#include "io/keras_tf/tf_internal.h"
#include "qkv/io_tf.h"

namespace qkv::io {
namespace detail {
namespace {

constexpr const char* kObjectGraphKey = "_CHECKPOINTABLE_OBJECT_GRAPH";
constexpr int32_t kMaxShards = 100000;
constexpr int32_t kStringDType = 7;

struct BundleEntry {
  std::string key;
  int32_t dtype = 0;  // tensorflow DataType enum
  Shape shape;
  int32_t shard_id = 0;
  int64_t offset = 0, size = 0;
  uint32_t crc32c = 0;
  bool sliced = false;
};

struct Bundle {
  int32_t num_shards = 1;
  bool big_endian = false;
  std::vector<BundleEntry> entries;
};

// TF DataType enum -> qkv dtype, and the TF name of every enum value we may meet.
std::optional<DType> qkv_dtype(int32_t tf) {
  switch (tf) {
    case 1: return DType::f32;
    case 2: return DType::f64;
    case 3: return DType::i32;
    case 6: return DType::i8;
    case 9: return DType::i64;
    case 10: return DType::b8;
    case 14: return DType::bf16;
    case 19: return DType::f16;
    default: return std::nullopt;
  }
}

std::string tf_dtype_name(int32_t tf) {
  static const char* const names[] = {"invalid",    "float32", "float64",   "int32",   "uint8",   "int16",
                                      "int8",       "string",  "complex64", "int64",   "bool",    "qint8",
                                      "quint8",     "qint32",  "bfloat16",  "qint16",  "quint16", "uint16",
                                      "complex128", "float16", "resource",  "variant", "uint32",  "uint64"};
  if (tf >= 0 && tf < static_cast<int32_t>(std::size(names))) return names[tf];
  return "dtype " + std::to_string(tf);
}

Shape parse_shape(std::span<const std::byte> bytes, const Context& ctx, const std::string& what) {
  ProtoReader r(bytes, ctx, what + " shape");
  Shape shape;
  while (!r.done()) {
    const auto [field, wt] = r.next_tag();
    if (field == 2) {  // repeated Dim dim = 2 { int64 size = 1; string name = 2; }
      r.expect(field, wt, 2);
      ProtoReader d(r.bytes(), ctx, what + " shape dim");
      int64_t size = 0;
      while (!d.done()) {
        const auto [f, w] = d.next_tag();
        if (f == 1 && w == 0)
          size = d.int64();
        else
          d.skip(w);
      }
      if (size < 0) fail_at(ctx, what, ": dim ", shape.size(), " is ", size, " (unknown dims are not allowed)");
      if (shape.size() >= 64) fail_at(ctx, what, ": more than 64 dims");
      shape.push_back(size);
    } else if (field == 3 && wt == 0) {
      if (r.varint() != 0) fail_at(ctx, what, ": shape of unknown rank");
    } else {
      r.skip(wt);
    }
  }
  if (!checked_numel(shape)) fail_at(ctx, what, ": shape ", shape_str(shape), " has too many elements");
  return shape;
}

BundleEntry parse_entry(const TableEntry& te, const Context& ctx) {
  BundleEntry e;
  e.key = te.key;
  const std::string what = "entry " + quote_name(te.key);
  ProtoReader r(te.value, ctx, what);
  while (!r.done()) {
    const auto [field, wt] = r.next_tag();
    // A table, one case per line:
    // clang-format off
    switch (field) {
      case 1: r.expect(field, wt, 0); e.dtype = r.int32(); break;
      case 2: r.expect(field, wt, 2); e.shape = parse_shape(r.bytes(), ctx, what); break;
      case 3: r.expect(field, wt, 0); e.shard_id = r.int32(); break;
      case 4: r.expect(field, wt, 0); e.offset = r.int64(); break;
      case 5: r.expect(field, wt, 0); e.size = r.int64(); break;
      case 6: r.expect(field, wt, 5); e.crc32c = r.fixed32(); break;
      case 7: r.expect(field, wt, 2); (void)r.bytes(); e.sliced = true; break;
      default: r.skip(wt);
    }
    // clang-format on
  }
  if (e.offset < 0 || e.size < 0) fail_at(ctx, what, ": negative offset ", e.offset, " or size ", e.size);
  if (e.shard_id < 0) fail_at(ctx, what, ": negative shard_id ", e.shard_id);
  return e;
}

void parse_header(std::span<const std::byte> value, Bundle& b, const Context& ctx) {
  ProtoReader r(value, ctx, "header");
  while (!r.done()) {
    const auto [field, wt] = r.next_tag();
    if (field == 1) {
      r.expect(field, wt, 0);
      b.num_shards = r.int32();
    } else if (field == 2) {
      r.expect(field, wt, 0);
      const uint64_t e = r.varint();
      if (e > 1) fail_at(ctx, "header: unknown endianness ", e);
      b.big_endian = e == 1;
    } else if (field == 3) {  // VersionDef { producer = 1; min_consumer = 2; bad_consumers = 3; }
      r.expect(field, wt, 2);
      ProtoReader v(r.bytes(), ctx, "header version");
      while (!v.done()) {
        const auto [f, w] = v.next_tag();
        if (f == 2 && w == 0) {
          const int32_t min_consumer = v.int32();
          if (min_consumer > 1)
            fail_at(ctx, "header: bundle needs a reader of version ", min_consumer, " (qkv reads 1)");
        } else {
          v.skip(w);
        }
      }
    } else {
      r.skip(wt);
    }
  }
  if (b.num_shards < 1 || b.num_shards > kMaxShards) fail_at(ctx, "header: invalid num_shards ", b.num_shards);
}

Bundle parse_index(std::span<const std::byte> index, const Context& ctx) {
  const std::vector<TableEntry> table = read_leveldb_table(index, ctx);
  if (table.empty() || !table.front().key.empty()) fail_at(ctx, "no bundle header (the entry with the empty key)");
  Bundle b;
  parse_header(table.front().value, b, ctx);
  for (size_t i = 1; i < table.size(); ++i) {
    BundleEntry e = parse_entry(table[i], ctx);
    if (e.shard_id >= b.num_shards) {
      fail_at(ctx, "entry ", quote_name(e.key), ": shard_id ", e.shard_id, " but the bundle has ", b.num_shards,
              " shard(s)");
    }
    b.entries.push_back(std::move(e));
  }
  return b;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

// The bytes of entry `e` in its shard, after the extent and crc32c checks.
std::span<const std::byte> entry_bytes(const BundleEntry& e, std::span<const std::byte> shard, const Context& ctx) {
  const auto off = static_cast<uint64_t>(e.offset), size = static_cast<uint64_t>(e.size);
  if (off > shard.size() || size > shard.size() - off) {
    fail_at(ctx, "entry ", quote_name(e.key), ": bytes [", off, ", ", off + size, ") run past the end of shard ",
            e.shard_id, " (", shard.size(), " bytes)");
  }
  const auto bytes = shard.subspan(static_cast<size_t>(off), static_cast<size_t>(size));
  if (e.dtype == kStringDType) return bytes;  // decode_strings checks the crc the way TF computes it
  const uint32_t actual = crc32c(bytes), stored = crc32c_unmask(e.crc32c);
  if (kEnforceChecksums && actual != stored) {
    fail_at(ctx, "entry ", quote_name(e.key), ": data in shard ", e.shard_id, " at offset ", off, " has crc32c ",
            hex32(actual), " but the index says ", hex32(stored));
  }
  return bytes;
}

// A DT_STRING tensor's elements: varint64 lengths, a 4-byte masked crc32c of the
// lengths (each as a little-endian uint32, as TF does), then the bytes of every string. The
// entry's crc32c covers the lengths as uint32s, the length checksum and the strings.
std::vector<std::string> decode_strings(const BundleEntry& e, std::span<const std::byte> bytes, const Context& ctx) {
  const int64_t n = checked_numel(e.shape).value_or(-1);
  const std::string what = "string entry " + quote_name(e.key);
  if (n < 0 || static_cast<uint64_t>(n) > bytes.size())
    fail_at(ctx, what, ": ", n, " elements in ", bytes.size(), " bytes");
  std::vector<uint64_t> lengths(static_cast<size_t>(n));
  size_t pos = 0;
  uint32_t crc = 0;
  for (auto& len : lengths) {
    if (!read_varint(bytes, pos, len)) fail_at(ctx, what, ": truncated length");
    std::byte le[4];  // TF checksums each length as a little-endian uint32
    for (int i = 0; i < 4; ++i) le[i] = static_cast<std::byte>(len >> (8 * i));
    crc = crc32c_extend(crc, le, 4);
  }
  if (bytes.size() - pos < 4) fail_at(ctx, what, ": truncated length checksum");
  uint32_t stored = 0;
  for (int i = 3; i >= 0; --i) stored = (stored << 8) | static_cast<uint32_t>(bytes[pos + static_cast<size_t>(i)]);
  if (kEnforceChecksums && crc32c_unmask(stored) != crc) fail_at(ctx, what, ": length checksum mismatch");
  crc = crc32c_extend(crc, bytes.data() + pos, 4);
  pos += 4;
  std::vector<std::string> out;
  for (const uint64_t len : lengths) {
    if (len > bytes.size() - pos) fail_at(ctx, what, ": string of ", len, " bytes runs past the entry");
    out.emplace_back(reinterpret_cast<const char*>(bytes.data() + pos), static_cast<size_t>(len));
    crc = crc32c_extend(crc, bytes.data() + pos, static_cast<size_t>(len));
    pos += static_cast<size_t>(len);
  }
  if (pos != bytes.size()) fail_at(ctx, what, ": ", bytes.size() - pos, " trailing bytes");
  if (kEnforceChecksums && crc != crc32c_unmask(e.crc32c)) {
    fail_at(ctx, what, ": data has crc32c ", hex32(crc), " but the index says ", hex32(crc32c_unmask(e.crc32c)));
  }
  return out;
}

// The tensor of entry `e` over `shard`, byte-swapped when the bundle is big endian.
Tensor entry_tensor(const BundleEntry& e, DType dtype, const std::shared_ptr<Storage>& shard, bool big_endian,
                    const Context& ctx) {
  const int64_t numel = checked_numel(e.shape).value_or(-1);
  const size_t item = itemsize(dtype);
  if (static_cast<uint64_t>(numel) > static_cast<uint64_t>(e.size) / item ||
      static_cast<uint64_t>(numel) * item != static_cast<uint64_t>(e.size)) {
    fail_at(ctx, "entry ", quote_name(e.key), " holds ", e.size, " bytes but shape ", shape_str(e.shape), " of ",
            dtype_name(dtype), " needs ", static_cast<uint64_t>(numel) * item);
  }
  // Bytes that need fixing (a swap, bools to 0/1) are fixed in a copy: entries may share
  // bytes, and each must see them as the file holds them, as TensorFlow reads each entry.
  if ((big_endian && item > 1) || dtype == DType::b8) {
    auto own = copy_to_storage({shard->data() + e.offset, static_cast<size_t>(e.size)});
    if (big_endian) byteswap_inplace(own->data(), own->nbytes(), item);
    if (dtype == DType::b8) normalize_bools(own->data(), own->nbytes());
    return view_or_copy(std::move(own), 0, dtype, e.shape, contiguous_strides(e.shape));
  }
  return view_or_copy(shard, static_cast<size_t>(e.offset), dtype, e.shape, contiguous_strides(e.shape));
}

std::vector<TensorInfo> listing(const Bundle& b, const std::vector<std::string>* object_graph, const Context& ctx) {
  std::vector<TensorInfo> out;
  for (const BundleEntry& e : b.entries) {
    const auto dt = qkv_dtype(e.dtype);
    out.push_back({e.key, e.key, dt ? std::string(dtype_name(*dt)) : tf_dtype_name(e.dtype), e.shape, false});
  }
  if (object_graph != nullptr && object_graph->size() == 1)
    name_from_object_graph((*object_graph)[0], out, ctx);
  else
    name_from_keys(out);
  return out;
}

const BundleEntry* find_entry(const Bundle& b, const std::string& key) {
  for (const BundleEntry& e : b.entries) {
    if (e.key == key) return &e;
  }
  return nullptr;
}

// Loads every entry from the shards (storage i = shard i; null for unread shards).
WeightFile assemble(const Bundle& b, const std::vector<std::shared_ptr<Storage>>& shards, const Context& ctx) {
  WeightFile ck;
  std::vector<std::string> graph;
  for (const BundleEntry& e : b.entries) {
    if (e.sliced)
      fail_at(ctx, "entry ", quote_name(e.key), " is a partitioned variable (slices), which qkv does not read");
    const auto& shard = shards.at(static_cast<size_t>(e.shard_id));
    const auto bytes = entry_bytes(e, {shard->data(), shard->nbytes()}, ctx);
    if (e.dtype == kStringDType) {
      auto strings = decode_strings(e, bytes, ctx);
      if (e.key == kObjectGraphKey) graph = std::move(strings);
    }
    if (const auto dt = qkv_dtype(e.dtype)) ck.tensors.emplace(e.key, entry_tensor(e, *dt, shard, b.big_endian, ctx));
  }
  ck.entries = listing(b, find_entry(b, kObjectGraphKey) ? &graph : nullptr, ctx);
  return ck;
}

std::string shard_suffix(int32_t i, int32_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, ".data-%05d-of-%05d", i, n);
  return buf;
}

}  // namespace
}  // namespace detail

std::filesystem::path tf_checkpoint_prefix(const std::filesystem::path& path) {
  const std::string s = path.string();
  std::error_code ec;
  if (s.size() > 6 && s.ends_with(".index")) return s.substr(0, s.size() - 6);
  if (const auto at = s.rfind(".data-"); at != std::string::npos && at > 0) return s.substr(0, at);
  if (std::filesystem::is_regular_file(s + ".index", ec)) return path;
  return {};
}

WeightFile parse_tf_checkpoint(std::span<const std::byte> index, std::span<const std::span<const std::byte>> shards,
                               const std::string& source) {
  const detail::Context ctx{"parse_tf_checkpoint", source};
  const detail::Bundle b = detail::parse_index(index, ctx);
  if (shards.size() != static_cast<size_t>(b.num_shards)) {
    detail::fail_at<ValueError>(ctx, "the bundle has ", b.num_shards, " shard(s) but ", shards.size(), " were given");
  }
  std::vector<std::shared_ptr<Storage>> storages;
  for (const auto& s : shards) storages.push_back(detail::copy_to_storage(s));
  return detail::assemble(b, storages, ctx);
}

WeightFile load_tf_checkpoint(const std::filesystem::path& path) {
  const std::filesystem::path prefix = tf_checkpoint_prefix(path);
  const std::string index_path = (prefix.empty() ? path.string() : prefix.string()) + (prefix.empty() ? "" : ".index");
  const detail::Context ctx{"load_tf_checkpoint", index_path};
  const auto index = detail::read_file(index_path, ctx);
  const detail::Bundle b = detail::parse_index({index->data(), index->nbytes()}, ctx);
  std::vector<std::shared_ptr<Storage>> shards(static_cast<size_t>(b.num_shards));
  for (const auto& e : b.entries) {
    auto& s = shards[static_cast<size_t>(e.shard_id)];
    if (s) continue;
    const std::string shard_path = prefix.string() + detail::shard_suffix(e.shard_id, b.num_shards);
    s = detail::read_file(shard_path, detail::Context{ctx.op, shard_path});
  }
  return detail::assemble(b, shards, ctx);
}

std::vector<TensorInfo> inspect_tf_checkpoint(const std::filesystem::path& path) {
  const std::filesystem::path prefix = tf_checkpoint_prefix(path);
  const std::string index_path = prefix.empty() ? path.string() : prefix.string() + ".index";
  const detail::Context ctx{"inspect_tf_checkpoint", index_path};
  const auto index = detail::read_file(index_path, ctx);
  const detail::Bundle b = detail::parse_index({index->data(), index->nbytes()}, ctx);
  // The object graph lives in a shard: read just its bytes when present.
  std::vector<std::string> graph;
  const detail::BundleEntry* g = detail::find_entry(b, detail::kObjectGraphKey);
  if (g != nullptr && g->dtype == detail::kStringDType) {
    const std::string shard_path = prefix.string() + detail::shard_suffix(g->shard_id, b.num_shards);
    const auto shard = detail::read_file(shard_path, detail::Context{ctx.op, shard_path});
    graph = detail::decode_strings(*g, detail::entry_bytes(*g, {shard->data(), shard->nbytes()}, ctx), ctx);
  }
  return detail::listing(b, g != nullptr && g->dtype == detail::kStringDType ? &graph : nullptr, ctx);
}

}  // namespace qkv::io
