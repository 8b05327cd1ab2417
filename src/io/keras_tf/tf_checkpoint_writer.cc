// TensorFlow checkpoint (tensor bundle) writer, as tensorflow/core/util/tensor_bundle/
// tensor_bundle.cc's BundleWriter: the data shard holds each tensor's raw little-endian
// bytes back to back (data_alignment 1), the .index table maps "" to the
// BundleHeaderProto and every key to a BundleEntryProto {dtype, shape, shard_id,
// offset, size, masked crc32c of the bytes}.
#include "io/keras_tf/tf_internal.h"
#include "qkv/io_tf.h"

namespace qkv::io {
namespace detail {
namespace {

constexpr const char* kObjectGraphKey = "_CHECKPOINTABLE_OBJECT_GRAPH";
constexpr int32_t kStringDType = 7;

// qkv dtype -> TF DataType enum (tensorflow/core/framework/types.proto).
int32_t tf_dtype(DType dt) {
  switch (dt) {
    case DType::f32: return 1;
    case DType::f64: return 2;
    case DType::i32: return 3;
    case DType::i8: return 6;
    case DType::i64: return 9;
    case DType::b8: return 10;
    case DType::bf16: return 14;
    case DType::f16: return 19;
  }
  return 0;
}

std::string shape_proto(const Shape& shape) {
  ProtoWriter s;
  for (const int64_t d : shape) {
    ProtoWriter dim;
    if (d != 0) dim.varint(1, static_cast<uint64_t>(d));
    s.message(2, dim);
  }
  return s.str();
}

std::string entry_proto(int32_t dtype, const Shape& shape, uint64_t offset, uint64_t size, uint32_t crc) {
  ProtoWriter e;
  e.varint(1, static_cast<uint64_t>(dtype));
  e.bytes(2, shape_proto(shape));
  if (offset != 0) e.varint(4, offset);  // shard_id (3) is always 0: one shard
  if (size != 0) e.varint(5, size);
  e.fixed32(6, crc32c_mask(crc));
  return e.str();
}

// A scalar DT_STRING tensor as TF's WriteStringTensor lays it out: the varint64
// length, the masked crc32c of the length (as a little-endian uint32), the bytes.
// Returns the bytes' crc32c, which covers the length, its checksum and the string.
uint32_t append_string(std::string& data, const std::string& s) {
  put_varint(data, s.size());
  std::byte le[4];
  for (int i = 0; i < 4; ++i) le[i] = static_cast<std::byte>(s.size() >> (8 * i));
  uint32_t crc = crc32c_extend(0, le, 4);
  const uint32_t masked = crc32c_mask(crc);
  for (int i = 0; i < 4; ++i) le[i] = static_cast<std::byte>(masked >> (8 * i));
  data.append(reinterpret_cast<const char*>(le), 4);
  crc = crc32c_extend(crc, le, 4);
  data += s;
  return crc32c_extend(crc, reinterpret_cast<const std::byte*>(s.data()), s.size());
}

void check_keys(const std::map<std::string, Tensor>& tensors, const Context& ctx) {
  for (const auto& [key, t] : tensors) {
    if (key.empty()) fail_at<ValueError>(ctx, "the empty key is the bundle header's and cannot name a tensor");
    if (key == kObjectGraphKey) fail_at<ValueError>(ctx, "key ", quote_name(key), " is reserved for the object graph");
    (void)t;
  }
}

TfCheckpointFiles write_bundle(const std::map<std::string, Tensor>& tensors,
                               const std::map<std::string, std::string>& full_names) {
  std::vector<std::string> keys;
  for (const auto& [key, t] : tensors) keys.push_back(key);
  const std::string graph = build_object_graph(keys, full_names);
  std::map<std::string, std::string> index;  // key -> BundleEntryProto, sorted as the table needs
  std::string data;
  if (!graph.empty()) {
    const uint64_t at = data.size();
    const uint32_t crc = append_string(data, graph);
    index[kObjectGraphKey] = entry_proto(kStringDType, {}, at, data.size() - at, crc);
  }
  for (const auto& [key, t] : tensors) {
    const Tensor c = t.to(Device::cpu()).contiguous();  // a GPU tensor is copied to the host first
    const auto* bytes = static_cast<const char*>(c.raw_data());
    const size_t n = c.numel() * itemsize(c.dtype());
    const uint64_t at = data.size();
    if (n > 0) data.append(bytes, n);
    const uint32_t crc = crc32c_extend(0, reinterpret_cast<const std::byte*>(data.data() + at), n);
    index[key] = entry_proto(tf_dtype(c.dtype()), c.shape(), at, n, crc);
  }
  ProtoWriter version;
  version.varint(1, 1);  // producer 1 (kTensorBundleVersion); min_consumer 0
  ProtoWriter header;
  header.varint(1, 1);  // num_shards; endianness LITTLE (0) is the default
  header.message(3, version);
  std::vector<std::pair<std::string, std::string>> table{{"", header.str()}};
  for (auto& [key, entry] : index) table.emplace_back(key, std::move(entry));
  const std::string idx = build_leveldb_table(table);
  TfCheckpointFiles out;
  out.index.resize(idx.size());
  std::memcpy(out.index.data(), idx.data(), idx.size());
  out.data.resize(data.size());
  if (!data.empty()) std::memcpy(out.data.data(), data.data(), data.size());
  return out;
}

}  // namespace
}  // namespace detail

TfCheckpointFiles serialize_tf_checkpoint(const std::map<std::string, Tensor>& tensors,
                                          const std::map<std::string, std::string>& full_names) {
  detail::check_keys(tensors, detail::Context{"serialize_tf_checkpoint", "<memory>"});
  return detail::write_bundle(tensors, full_names);
}

void save_tf_checkpoint(const std::filesystem::path& prefix, const std::map<std::string, Tensor>& tensors,
                        const std::map<std::string, std::string>& full_names) {
  const std::string index_path = prefix.string() + ".index", data_path = prefix.string() + ".data-00000-of-00001";
  detail::check_keys(tensors, detail::Context{"save_tf_checkpoint", index_path});
  const TfCheckpointFiles files = detail::write_bundle(tensors, full_names);
  // Both files written before either replaces its old one; then the data first, as TF
  // does: an index never names a shard that is not there.
  const detail::Context data_ctx{"save_tf_checkpoint", data_path}, index_ctx{"save_tf_checkpoint", index_path};
  detail::PendingFile data_file(data_path, data_ctx), index_file(index_path, index_ctx);
  const std::span<const std::byte> data[] = {files.data};
  detail::write_chunks(data_file, data, data_ctx);
  const std::span<const std::byte> index[] = {files.index};
  detail::write_chunks(index_file, index, index_ctx);
  data_file.commit();
  index_file.commit();
}

}  // namespace qkv::io
