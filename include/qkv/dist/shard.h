// How a sequence (or heads) is split over ranks for qkv's distributed attention.
//
// contiguous: rank r holds part r of an even split (the first L % P parts one longer).
// zigzag: the sequence is cut into 2P even chunks and rank r holds chunks r and 2P-1-r
//   (striped load balancing for causal ring attention: every rank then has as many
//   (query, key) pairs below the diagonal as any other; docs/distributed.md).
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "qkv/tensor.h"

namespace qkv::dist {

enum class SequenceLayout { contiguous, zigzag };

SequenceLayout sequence_layout_from_name(std::string_view name);  // "contiguous" | "zigzag"
std::string_view sequence_layout_name(SequenceLayout layout);

// Sizes of an even split of n items into `parts` (the first n % parts one larger).
std::vector<int64_t> split_sizes(int64_t n, int64_t parts);

// One run of consecutive sequence positions (or heads) a rank holds.
struct Chunk {
  int64_t start = 0;   // first global position
  int64_t length = 0;  // positions
};

// Part `index` of split_sizes(n, parts): where it starts and how long it is.
Chunk split_part(int64_t n, int64_t parts, int64_t index);

// The chunks rank `rank` of `size` holds of a sequence of `length`, in the order they are
// stored in its shard.
std::vector<Chunk> sequence_chunks(int64_t length, int rank, int size, SequenceLayout layout);

// The rank's shard of `full` along `dim` (a view for contiguous, a new tensor for zigzag).
Tensor shard_sequence(const Tensor& full, int64_t dim, int rank, int size, SequenceLayout layout);

// The full sequence from every rank's shard (shards[r] from rank r), in position order;
// the shards' sizes along `dim` must be those of sequence_chunks. A new tensor.
Tensor unshard_sequence(const std::vector<Tensor>& shards, int64_t dim, SequenceLayout layout);
// The same from the shards concatenated in rank order along `dim` (Communicator::all_gather).
Tensor unshard_sequence(const Tensor& gathered, int64_t dim, int size, SequenceLayout layout);

}  // namespace qkv::dist
