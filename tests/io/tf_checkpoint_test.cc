// The TensorFlow checkpoint reader on files written by TensorFlow itself
// (tests/io/make_keras_tf_fixtures.py, tests/seed001/train_seed001.py), compared
// with the values TensorFlow read back and numpy saved as .safetensors.
#include <gtest/gtest.h>

#include <fstream>
#include <tuple>

#include "io/io_test_util.h"
#include "io/keras_tf/tf_internal.h"
#include "qkv/io_tf.h"

namespace qkv::io {
namespace {

using testing::read_bytes;
using testing::temp_path;

std::filesystem::path keras_tf(const std::string& name) {
  return std::filesystem::path(QKV_SOURCE_DIR) / "tests" / "fixtures" / "keras_tf" / name;
}
std::filesystem::path seed001(const std::string& name) {
  return std::filesystem::path(QKV_SOURCE_DIR) / "tests" / "fixtures" / "seed001" / name;
}

void expect_same_values(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i], w[i]) << what << " element " << i;
}

const TensorInfo& entry(const std::vector<TensorInfo>& entries, const std::string& key) {
  for (const auto& e : entries) {
    if (e.key == key) return e;
  }
  ADD_FAILURE() << "no entry " << key;
  static const TensorInfo none;
  return none;
}

// Copies a checkpoint (index + shards) to a temp dir, returning the new prefix.
std::filesystem::path copy_checkpoint(const std::string& name) {
  const auto dst = temp_path(name);
  for (const auto& f : std::filesystem::directory_iterator(keras_tf(""))) {
    const std::string file = f.path().filename().string();
    if (file.starts_with(name + ".")) std::filesystem::copy_file(f.path(), dst.parent_path() / file);
  }
  return dst;
}

void patch_byte(const std::filesystem::path& path, size_t offset, unsigned char value) {
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(offset));
  f.put(static_cast<char>(value));
}

TEST(Crc32c, MatchesTheStandardCheckValue) {
  const std::string s = "123456789";
  EXPECT_EQ(detail::crc32c(std::as_bytes(std::span(s.data(), s.size()))), 0xe3069283u);
  EXPECT_EQ(detail::crc32c_unmask(detail::crc32c_mask(0x12345678u)), 0x12345678u);
}

TEST(TfCheckpoint, ReadsEveryQkvDtypeTensorFlowWrote) {
  const WeightFile ck = load_tf_checkpoint(keras_tf("dtypes"));
  const SafetensorsFile want = load_safetensors(keras_tf("dtypes_expected.safetensors"));
  const std::map<std::string, DType> dtypes = {{"f32", DType::f32},   {"f64", DType::f64}, {"f16", DType::f16},
                                               {"bf16", DType::bf16}, {"i8", DType::i8},   {"i32", DType::i32},
                                               {"i64", DType::i64},   {"b", DType::b8}};
  for (const auto& [var, dtype] : dtypes) {
    const std::string key = var + "/.ATTRIBUTES/VARIABLE_VALUE";
    ASSERT_TRUE(ck.tensors.count(key)) << key;
    EXPECT_EQ(ck.tensors.at(key).dtype(), dtype) << key;
    expect_same_values(ck.tensors.at(key), want.tensors.at(key), key);
  }
  expect_same_values(ck.tensors.at("scalar/.ATTRIBUTES/VARIABLE_VALUE"),
                     want.tensors.at("scalar/.ATTRIBUTES/VARIABLE_VALUE"), "scalar");
  EXPECT_EQ(ck.tensors.at("empty/.ATTRIBUTES/VARIABLE_VALUE").shape(), (Shape{0, 4}));
}

TEST(TfCheckpoint, ListsStringAndUint8EntriesWithoutLoadingThem) {
  const WeightFile ck = load_tf_checkpoint(keras_tf("dtypes.index"));
  EXPECT_EQ(entry(ck.entries, "u8/.ATTRIBUTES/VARIABLE_VALUE").dtype, "uint8");
  EXPECT_EQ(entry(ck.entries, "s/.ATTRIBUTES/VARIABLE_VALUE").dtype, "string");
  EXPECT_EQ(entry(ck.entries, "s/.ATTRIBUTES/VARIABLE_VALUE").shape, (Shape{3}));
  EXPECT_EQ(entry(ck.entries, "_CHECKPOINTABLE_OBJECT_GRAPH").dtype, "string");
  EXPECT_FALSE(ck.tensors.count("u8/.ATTRIBUTES/VARIABLE_VALUE"));
  EXPECT_EQ(entry(ck.entries, "f32/.ATTRIBUTES/VARIABLE_VALUE").name, "Variable");  // TF's default name
  EXPECT_EQ(inspect_tf_checkpoint(keras_tf("dtypes")).size(), ck.entries.size());
}

TEST(TfCheckpoint, ReadsAnIndexOfManyBlocksAndRestartPoints) {
  const auto index = read_bytes(keras_tf("many.index"));
  const detail::Context ctx{"test", "many.index"};
  EXPECT_EQ(detail::read_leveldb_table(index, ctx).size(), 302u);  // header, object graph, 300 variables
  const WeightFile ck = load_tf_checkpoint(keras_tf("many"));
  const SafetensorsFile want = load_safetensors(keras_tf("many_expected.safetensors"));
  ASSERT_EQ(want.tensors.size(), 300u);
  for (const auto& [key, t] : want.tensors) expect_same_values(ck.tensors.at(key), t, key);
}

TEST(TfCheckpoint, ReadsEveryShardOfAShardedCheckpoint) {
  const WeightFile ck = load_tf_checkpoint(keras_tf("sharded"));
  const SafetensorsFile want = load_safetensors(keras_tf("sharded_expected.safetensors"));
  ASSERT_EQ(want.tensors.size(), 4u);
  for (const auto& [key, t] : want.tensors) expect_same_values(ck.tensors.at(key), t, key);
}

TEST(TfCheckpoint, NamesKeras3VariablesFromTheObjectGraphAndMarksOptimizerState) {
  const WeightFile ck = load_tf_checkpoint(seed001("ckpt"));
  const SafetensorsFile want = load_safetensors(seed001("variables.safetensors"));
  std::map<std::string, Shape> model;
  for (const auto& e : ck.entries) {
    if (!e.optimizer && e.key != "_CHECKPOINTABLE_OBJECT_GRAPH") model[e.name] = e.shape;
    if (ck.tensors.count(e.key)) expect_same_values(ck.tensors.at(e.key), want.tensors.at(e.key), e.key);
  }
  const std::map<std::string, Shape> seed = {{"multi_head_attention/query/kernel", {3, 2, 4}},
                                             {"multi_head_attention/query/bias", {2, 4}},
                                             {"multi_head_attention/key/kernel", {3, 2, 4}},
                                             {"multi_head_attention/key/bias", {2, 4}},
                                             {"multi_head_attention/value/kernel", {3, 2, 4}},
                                             {"multi_head_attention/value/bias", {2, 4}},
                                             {"multi_head_attention/attention_output/kernel", {2, 4, 3}},
                                             {"multi_head_attention/attention_output/bias", {3}},
                                             {"dense/kernel", {3, 1}},
                                             {"dense/bias", {1}}};
  EXPECT_EQ(model, seed);
  const auto& m = entry(ck.entries, "optimizer/_variables/2/.ATTRIBUTES/VARIABLE_VALUE");
  EXPECT_TRUE(m.optimizer);
  EXPECT_EQ(m.name, "adam/multi_head_attention_query_kernel_momentum");
  EXPECT_TRUE(entry(ck.entries, "optimizer/_iterations/.ATTRIBUTES/VARIABLE_VALUE").optimizer);
}

TEST(TfCheckpoint, ReadsTfKeras2KeysWithTheirVariableNames) {
  const WeightFile ck = load_tf_checkpoint(keras_tf("tfkeras2_ckpt"));
  const SafetensorsFile want = load_safetensors(keras_tf("tfkeras2_expected.safetensors"));
  const auto& q = entry(ck.entries, "layer_with_weights-0/_query_dense/kernel/.ATTRIBUTES/VARIABLE_VALUE");
  EXPECT_EQ(q.name, "multi_head_attention/query/kernel");
  EXPECT_FALSE(q.optimizer);
  int model_vars = 0;
  for (const auto& e : ck.entries) {
    if (e.optimizer || e.key == "_CHECKPOINTABLE_OBJECT_GRAPH") continue;
    ++model_vars;
    ASSERT_TRUE(want.tensors.count(e.name + ":0")) << e.name;
    expect_same_values(ck.tensors.at(e.key), want.tensors.at(e.name + ":0"), e.key);
  }
  EXPECT_EQ(model_vars, 10);
}

TEST(TfCheckpoint, RejectsABlockWhoseCrcDoesNotMatch) {
  const auto prefix = copy_checkpoint("dtypes");
  patch_byte(prefix.string() + ".index", 3, 0xff);
  try {
    (void)load_tf_checkpoint(prefix);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("data block at offset 0 has crc32c"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("dtypes.index"), std::string::npos) << e.what();
  }
}

TEST(TfCheckpoint, RejectsTensorDataWhoseCrcDoesNotMatch) {
  const auto prefix = copy_checkpoint("dtypes");
  const auto data = prefix.string() + ".data-00000-of-00001";
  patch_byte(data, 0, static_cast<unsigned char>(~static_cast<unsigned char>(read_bytes(data)[0])));
  EXPECT_THROW((void)load_tf_checkpoint(prefix), FormatError);
  EXPECT_NO_THROW((void)inspect_tf_checkpoint(prefix.string() + ".index"));  // the index alone is fine
}

TEST(TfCheckpoint, RejectsCompressedBlocksClearly) {
  auto index = read_bytes(keras_tf("dtypes.index"));
  // The footer's index handle tells where the index block ends; mark it snappy and fix its crc.
  const size_t footer = index.size() - 48;
  size_t pos = footer;
  uint64_t meta_off = 0, meta_size = 0, off = 0, size = 0;
  ASSERT_TRUE(detail::read_varint(index, pos, meta_off) && detail::read_varint(index, pos, meta_size) &&
              detail::read_varint(index, pos, off) && detail::read_varint(index, pos, size));
  index[off + size] = std::byte{1};
  const uint32_t crc = detail::crc32c_mask(detail::crc32c(std::span(index).subspan(off, size + 1)));
  for (int i = 0; i < 4; ++i) index[off + size + 1 + static_cast<size_t>(i)] = static_cast<std::byte>(crc >> (8 * i));
  const auto shard = read_bytes(keras_tf("dtypes.data-00000-of-00001"));
  const std::span<const std::byte> shards[] = {shard};
  try {
    (void)parse_tf_checkpoint(index, shards, "x.index");
    FAIL() << "no error";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("snappy"), std::string::npos) << e.what();
  }
}

TEST(TfCheckpoint, RejectsTruncatedAndForeignFiles) {
  const auto index = read_bytes(keras_tf("dtypes.index"));
  const std::span<const std::span<const std::byte>> none;
  EXPECT_THROW((void)parse_tf_checkpoint(std::span(index).first(40), none, "x"), FormatError);
  EXPECT_THROW((void)parse_tf_checkpoint(std::span(index).first(index.size() - 1), none, "x"), FormatError);
  const auto npy = read_bytes(std::filesystem::path(QKV_SOURCE_DIR) / "tests/fixtures/seed001/probe_inputs.npy");
  EXPECT_THROW((void)parse_tf_checkpoint(npy, none, "x"), FormatError);
  EXPECT_THROW((void)parse_tf_checkpoint(index, none, "x"), ValueError);  // shard count
}

// A bundle of one shard whose entries (key, TF dtype, dims) all cover the shard's bytes
// [0, shard.size()): TensorFlow's BundleReader reads each entry from those bytes on its own.
std::vector<std::byte> bundle_sharing_bytes(std::span<const std::byte> shard, bool big_endian,
                                            const std::vector<std::tuple<std::string, int, int64_t>>& entries) {
  detail::ProtoWriter header;
  header.varint(1, 1);  // num_shards
  if (big_endian) header.varint(2, 1);
  std::vector<std::pair<std::string, std::string>> table = {{"", header.str()}};
  for (const auto& [key, dtype, dim] : entries) {
    detail::ProtoWriter size, shape, e;
    size.varint(1, static_cast<uint64_t>(dim));
    shape.message(2, size);
    e.varint(1, static_cast<uint64_t>(dtype));
    e.message(2, shape);
    e.varint(5, shard.size());
    e.fixed32(6, detail::crc32c_mask(detail::crc32c(shard)));
    table.emplace_back(key, e.str());
  }
  return testing::to_bytes(detail::build_leveldb_table(table));
}

// Entries over the same bytes each get those bytes as the file holds them: fixing one
// entry's copy (bools to 0/1, a big-endian bundle's byte swap) must not change another's.
TEST(TfCheckpoint, EntriesSharingBytesEachReadTheFilesBytes) {
  const std::vector<std::byte> shard = {std::byte{2}, std::byte{0}, std::byte{0xff}, std::byte{1}};
  const std::span<const std::byte> shards[] = {shard};
  // int8 "a" then bool "b" (key order): b's bools were 0/1-normalized in a's bytes, a read [1, 0, 1, 1].
  const WeightFile ck = parse_tf_checkpoint(bundle_sharing_bytes(shard, false, {{"a", 6, 4}, {"b", 10, 4}}), shards,
                                            "shared.index");
  ASSERT_EQ(ck.tensors.at("a").dtype(), DType::i8);
  ASSERT_EQ(ck.tensors.at("b").dtype(), DType::b8);
  EXPECT_EQ(ck.tensors.at("a").to_vector<double>(), (std::vector<double>{2, 0, -1, 1}));
  EXPECT_EQ(ck.tensors.at("b").to_vector<double>(), (std::vector<double>{1, 0, 1, 1}));
  // Big endian: two float32 entries over 1.0f; the first one's swap made the second's crc32c mismatch.
  const std::vector<std::byte> one = {std::byte{0x3f}, std::byte{0x80}, std::byte{0}, std::byte{0}};
  const std::span<const std::byte> one_shard[] = {one};
  const WeightFile be =
      parse_tf_checkpoint(bundle_sharing_bytes(one, true, {{"x", 1, 1}, {"y", 1, 1}}), one_shard, "shared_be.index");
  EXPECT_EQ(be.tensors.at("x").to_vector<double>(), std::vector<double>{1.0});
  EXPECT_EQ(be.tensors.at("y").to_vector<double>(), std::vector<double>{1.0});
}

// A LevelDB table of one data block with one restart point: the bundle header under "",
// then n keys "\x01", "\x01\x01", .. each sharing the previous key and adding one byte
// (entries of no bytes), as LevelDB's format allows; n^2 / 2 bytes of keys from 10 n bytes.
std::vector<std::byte> table_of_growing_keys(int n) {
  auto le32 = [](std::string& out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>(v >> (8 * i)));
  };
  auto seal = [&](std::string& file, const std::string& block) {  // block, type 0, masked crc32c
    const std::string typed = block + '\0';
    file += typed;
    le32(file, detail::crc32c_mask(detail::crc32c(std::as_bytes(std::span(typed.data(), typed.size())))));
  };
  detail::ProtoWriter header, entry;
  header.varint(1, 1);                             // num_shards
  entry.fixed32(6, detail::crc32c_mask(0));        // crc32c of no bytes
  std::string data;
  detail::put_varint(data, 0), detail::put_varint(data, 0), detail::put_varint(data, header.str().size());
  data += header.str();
  for (int i = 0; i < n; ++i) {
    detail::put_varint(data, static_cast<uint64_t>(i)), detail::put_varint(data, 1);
    detail::put_varint(data, entry.str().size());
    data += '\x01' + entry.str();
  }
  le32(data, 0), le32(data, 1);  // restart points: [0]
  std::string file, handle, meta, index, footer;
  seal(file, data);
  detail::put_varint(handle, 0), detail::put_varint(handle, data.size());
  le32(meta, 1);  // an empty metaindex block: its one restart count
  const size_t meta_at = file.size();
  seal(file, meta);
  detail::put_varint(index, 0), detail::put_varint(index, 1), detail::put_varint(index, handle.size());
  index += '\x02' + handle;  // the index key: past every data key
  le32(index, 0), le32(index, 1);
  const size_t index_at = file.size();
  seal(file, index);
  detail::put_varint(footer, meta_at), detail::put_varint(footer, meta.size());
  detail::put_varint(footer, index_at), detail::put_varint(footer, index.size());
  footer.resize(40, '\0');
  le32(footer, 0x8b80fb57u), le32(footer, 0xdb477524u);  // the table magic
  return testing::to_bytes(file + footer);
}

// 3000 such keys spell 4.5 MB from a 30 KB index (20000: 1.9 GB of memory from 100 KB, 5.5 s):
// past 64 bytes of key per table byte the table is refused before the keys are built.
TEST(TfCheckpoint, RefusesPrefixCompressedKeysThatOutgrowTheTable) {
  const std::vector<std::byte> shard;
  const std::span<const std::byte> shards[] = {shard};
  EXPECT_EQ(parse_tf_checkpoint(table_of_growing_keys(100), shards, "small.index").entries.size(), 100u);
  const auto index = table_of_growing_keys(3000);
  try {
    (void)parse_tf_checkpoint(index, shards, "grown.index");
    FAIL() << "no error for " << index.size() << " bytes";
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("grown.index: data block at offset 0: entry at byte"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("keys pass 64 times the table's size"), std::string::npos) << e.what();
  }
  // LevelDB's writer restarts every 16 keys (a whole key each time): the same keys make a
  // ~300 KB table it reads (4.5 MB of keys, ~15 times the table).
  std::vector<std::pair<std::string, std::string>> entries = {{"", std::string("\x08\x01", 2)}};
  detail::ProtoWriter entry;
  entry.fixed32(6, detail::crc32c_mask(0));
  for (int i = 1; i <= 3000; ++i) entries.emplace_back(std::string(static_cast<size_t>(i), '\x01'), entry.str());
  const auto written = testing::to_bytes(detail::build_leveldb_table(entries));
  EXPECT_EQ(parse_tf_checkpoint(written, shards, "written.index").entries.size(), 3000u);
}

TEST(TfCheckpoint, MissingFilesAreIOErrors) {
  EXPECT_THROW((void)load_tf_checkpoint(temp_path("nothing")), IOError);
  const auto prefix = copy_checkpoint("dtypes");
  std::filesystem::remove(prefix.string() + ".data-00000-of-00001");
  EXPECT_THROW((void)load_tf_checkpoint(prefix), IOError);
}

}  // namespace
}  // namespace qkv::io
