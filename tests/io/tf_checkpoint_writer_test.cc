// The TensorFlow checkpoint writer against checkpoints TensorFlow wrote
// (tests/io/make_keras_tf_fixtures.py, tests/seed001/train_seed001.py): the table
// writer rebuilds TF's .index files byte for byte from their entries, entries match
// TF's for the same tensors, and a tf.keras layout gets TF's keys and names. What
// real TF reads from qkv's files is checked by tests/io/check_writers_with_tf.py
// (its report: tests/fixtures/writers/tf_report.json, asserted by
// tests/python/test_py_writers.py).
#include <gtest/gtest.h>

#include <algorithm>

#include "io/io_test_util.h"
#include "io/keras_tf/tf_internal.h"
#include "qkv/io_keras.h"
#include "qkv/io_tf.h"
#include "qkv/nn/keras_layers.h"

namespace qkv::io {
namespace {

// The layer view of weight files lives in qkv::nn (qkv/nn/keras_layers.h).
using nn::keras_layer_order;
using nn::keras_layer_weights;
using nn::LayerWeights;
using nn::tf_keras_checkpoint_keys;
using nn::TfKerasCheckpoint;

using testing::expect_same_values;
using testing::fixture;
using testing::read_bytes;
using testing::temp_path;

// A BundleEntryProto without its offset (TF and qkv may order the data differently).
struct EntryFields {
  int32_t dtype = 0;
  std::string shape;
  int64_t size = 0;
  uint32_t crc = 0;
  bool operator==(const EntryFields&) const = default;
};
EntryFields entry_fields(std::span<const std::byte> value) {
  const detail::Context ctx{"test", "entry"};
  detail::ProtoReader r(value, ctx, "entry");
  EntryFields f;
  while (!r.done()) {
    const auto [field, wt] = r.next_tag();
    if (field == 1)
      f.dtype = r.int32();
    else if (field == 2)
      f.shape = std::string(r.string());
    else if (field == 5)
      f.size = r.int64();
    else if (field == 6)
      f.crc = r.fixed32();
    else
      r.skip(wt);
  }
  return f;
}

TEST(TfCheckpointWriter, TableWriterRebuildsTensorFlowsIndexesByteForByte) {
  for (const auto& index :
       {fixture("keras_tf", "dtypes.index"), fixture("keras_tf", "many.index"), fixture("keras_tf", "sharded.index"),
        fixture("keras_tf", "tfkeras2_ckpt.index"), fixture("seed001", "ckpt.index")}) {
    const auto bytes = read_bytes(index);
    std::vector<std::pair<std::string, std::string>> entries;
    for (const auto& e : detail::read_leveldb_table(bytes, detail::Context{"test", index.string()})) {
      entries.emplace_back(e.key, std::string(reinterpret_cast<const char*>(e.value.data()), e.value.size()));
    }
    EXPECT_EQ(detail::build_leveldb_table(entries), testing::to_string(bytes)) << index;
  }
}

TEST(TfCheckpointWriter, SmallBlocksSplitTheTableAndTheReaderFollowsTheIndex) {
  std::vector<std::pair<std::string, std::string>> entries;
  for (int i = 0; i < 500; ++i) entries.emplace_back("key" + std::to_string(1000 + i), std::string(i % 7, 'x'));
  const std::string table = detail::build_leveldb_table(entries, 256);
  const auto got = detail::read_leveldb_table(std::as_bytes(std::span(table.data(), table.size())),
                                              detail::Context{"test", "table"});
  ASSERT_EQ(got.size(), entries.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].key, entries[i].first);
    EXPECT_EQ(got[i].value.size(), entries[i].second.size());
  }
}

TEST(TfCheckpointWriter, EntriesMatchTensorFlowsForTheSameTensors) {
  const auto tf_index = read_bytes(fixture("keras_tf", "dtypes.index"));
  const WeightFile ck = load_tf_checkpoint(fixture("keras_tf", "dtypes"));
  const TfCheckpointFiles ours = serialize_tf_checkpoint(ck.tensors);
  std::map<std::string, EntryFields> want, got;
  for (const auto& e : detail::read_leveldb_table(tf_index, detail::Context{"test", "tf"}))
    want[e.key] = entry_fields(e.value);
  for (const auto& e : detail::read_leveldb_table(ours.index, detail::Context{"test", "qkv"}))
    got[e.key] = entry_fields(e.value);
  ASSERT_EQ(ck.tensors.size(), 10u);  // every qkv dtype, a scalar and an empty tensor
  for (const auto& [key, t] : ck.tensors) {
    ASSERT_TRUE(got.count(key)) << key;
    EXPECT_EQ(got[key], want[key]) << key;
  }
  // The header entry ("") is TF's exactly.
  const auto ours_header = detail::read_leveldb_table(ours.index, detail::Context{"t", "q"}).front();
  const auto tf_header = detail::read_leveldb_table(tf_index, detail::Context{"t", "tf"}).front();
  EXPECT_EQ(ours_header.key, "");
  EXPECT_TRUE(
      std::equal(ours_header.value.begin(), ours_header.value.end(), tf_header.value.begin(), tf_header.value.end()));
}

TEST(TfCheckpointWriter, RoundTripsEveryDtypeScalarsAndEmptyTensors) {
  std::map<std::string, Tensor> tensors;
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16, DType::i8, DType::i32, DType::i64, DType::b8}) {
    std::vector<double> v;
    for (int i = 0; i < 12; ++i) v.push_back(dt == DType::b8 ? i % 3 == 0 : (i % 23) - 11);
    tensors[std::string("v_") + std::string(dtype_name(dt))] = Tensor::from_vector<double>(v, {3, 4}).to(dt);
    tensors[std::string("t_") + std::string(dtype_name(dt))] =
        Tensor::from_vector<double>(v, {4, 3}).to(dt).transpose(0, 1);
  }
  tensors["scalar"] = Tensor::from_vector<double>({3.5}, {}).to(DType::f32);
  tensors["empty"] = Tensor::from_vector<double>({}, {0, 4}).to(DType::f32);
  const auto prefix = temp_path("ckpt");
  save_tf_checkpoint(prefix, tensors);
  const WeightFile back = load_tf_checkpoint(prefix);
  ASSERT_EQ(back.entries.size(), tensors.size());  // no object graph: no key names an attribute
  for (const auto& [key, t] : tensors) expect_same_values(back.tensors.at(key), t, key);
  const auto by_extension = temp_path("saved.index");  // io::save: PREFIX.index is a TF checkpoint
  save(by_extension, {{"w", tensors["v_float16"]}});
  expect_same_values(load(by_extension).at("w"), tensors["v_float16"], "io::save");
  EXPECT_THROW(save_tf_checkpoint(prefix, {{"", tensors["scalar"]}}), ValueError);
  EXPECT_THROW(save_tf_checkpoint(prefix, {{"_CHECKPOINTABLE_OBJECT_GRAPH", tensors["scalar"]}}), ValueError);
}

TEST(TfCheckpointWriter, LayerOrderOfTwelveLayersFollowsTheNumbersNotTheKeyOrder) {
  // Keys sort layer_with_weights-10 before -2; the model order must not.
  LayerWeights layers;
  std::vector<std::string> order;
  for (int i = 0; i < 12; ++i) {
    const std::string name = "z_dense_" + std::to_string(11 - i);  // name order is the reverse
    layers[name] = {{"kernel", Tensor::full({2, 2}, static_cast<double>(i))}, {"bias", Tensor::zeros({2})}};
    order.push_back(name);
  }
  const TfKerasCheckpoint keys = tf_keras_checkpoint_keys(layers, order);
  const auto prefix = temp_path("twelve");
  save_tf_checkpoint(prefix, keys.tensors, keys.full_names);
  EXPECT_EQ(keras_layer_order(load_tf_checkpoint(prefix)), order);
}

TEST(TfCheckpointWriter, TfKerasLayoutHasTheKeysNamesAndValuesTfKerasWrote) {
  const WeightFile tf = load_tf_checkpoint(fixture("keras_tf", "tfkeras2_ckpt"));
  const LayerWeights layers = keras_layer_weights(tf);
  const TfKerasCheckpoint keys = tf_keras_checkpoint_keys(layers, keras_layer_order(tf));
  const auto prefix = temp_path("tfkeras");
  save_tf_checkpoint(prefix, keys.tensors, keys.full_names);
  const WeightFile ours = load_tf_checkpoint(prefix);
  size_t model_vars = 0;
  for (const TensorInfo& want : tf.entries) {
    if (want.optimizer || want.key == "_CHECKPOINTABLE_OBJECT_GRAPH") continue;
    ++model_vars;
    const auto it =
        std::find_if(ours.entries.begin(), ours.entries.end(), [&](const auto& e) { return e.key == want.key; });
    ASSERT_NE(it, ours.entries.end()) << want.key;
    EXPECT_EQ(it->name, want.name) << want.key;  // from our object graph, e.g. multi_head_attention/query/kernel
    EXPECT_EQ(it->dtype, want.dtype);
    EXPECT_FALSE(it->optimizer);
    expect_same_values(ours.tensors.at(want.key), tf.tensors.at(want.key), want.key);
  }
  EXPECT_EQ(model_vars, 10u);
  EXPECT_EQ(ours.entries.size(), model_vars + 1);  // + _CHECKPOINTABLE_OBJECT_GRAPH
}

}  // namespace
}  // namespace qkv::io
