// TensorFlow checkpoints (the "tensor bundle" that tf.train.Checkpoint and
// tf.keras save_weights write): PREFIX.index, a LevelDB table of BundleEntryProto
// records, and the data shards PREFIX.data-0000N-of-0000M.
//
// Everything read is checked: the table footer, every block's trailer crc32c,
// prefix-compressed keys and restart points, the protobuf records, every tensor's
// extent in its shard and its crc32c. Errors: FormatError (malformed file, naming
// the file and the fault), IOError (a file cannot be read), DTypeError (a tensor
// dtype qkv has no type for, raised only when its data is asked for).
// docs/formats-keras-tf.md has the full rules.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "qkv/io_tensor_files.h"  // TensorInfo, WeightFile
#include "qkv/tensor.h"

namespace qkv::io {

// A checkpoint loads as an io::WeightFile (qkv/io_tensor_files.h): entries[i].key is the checkpoint key
// ("layer_with_weights-0/_query_dense/kernel/.ATTRIBUTES/VARIABLE_VALUE"), .name the
// variable's own name from the object graph ("multi_head_attention/query/kernel"), else the
// key without "/.ATTRIBUTES/VARIABLE_VALUE"; .dtype numpy's name for qkv dtypes, TF's
// otherwise ("string", "uint8"); .optimizer marks slots (Adam's m/v), the iteration count and
// the learning rate; entries in key order, _CHECKPOINTABLE_OBJECT_GRAPH included.

// `path` is the prefix ("ckpt") or the index file ("ckpt.index"). Reads every shard.
// Entries of dtypes qkv cannot hold (strings, uint8, ...) are listed but not loaded.
WeightFile load_tf_checkpoint(const std::filesystem::path& path);
// The listing alone, from the .index file (shard data is not read).
std::vector<TensorInfo> inspect_tf_checkpoint(const std::filesystem::path& path);
// In memory: the .index bytes and the shards' bytes (shards[i] = data-i-of-N).
// `source` names the checkpoint in messages. The bytes are copied.
WeightFile parse_tf_checkpoint(std::span<const std::byte> index, std::span<const std::span<const std::byte>> shards,
                               const std::string& source);

// Writes PREFIX.index and PREFIX.data-00000-of-00001 as TensorFlow's BundleWriter
// does: tensors in key order, little endian, unaligned, each with its masked crc32c;
// the index a LevelDB table (uncompressed 256 KiB blocks, restart points every 16
// keys) whose "" entry is the header {num_shards 1, version {producer 1}}. When keys
// name object attributes ("a/b/.ATTRIBUTES/VARIABLE_VALUE") a _CHECKPOINTABLE_OBJECT_GRAPH
// is written too: one node per path component, the variables as attributes with
// full_name from `full_names` (else the path), so tf.train.Checkpoint can restore by
// object path. ValueError for an empty key or one starting with '_CHECKPOINTABLE'.
void save_tf_checkpoint(const std::filesystem::path& prefix, const std::map<std::string, Tensor>& tensors,
                        const std::map<std::string, std::string>& full_names = {});
struct TfCheckpointFiles {
  std::vector<std::byte> index, data;  // PREFIX.index, PREFIX.data-00000-of-00001
};
TfCheckpointFiles serialize_tf_checkpoint(const std::map<std::string, Tensor>& tensors,
                                          const std::map<std::string, std::string>& full_names = {});

// The checkpoint prefix of `path`: "dir/ckpt" for "dir/ckpt", "dir/ckpt.index" or
// "dir/ckpt.data-00000-of-00001"; empty when none of these files exists.
std::filesystem::path tf_checkpoint_prefix(const std::filesystem::path& path);

}  // namespace qkv::io
