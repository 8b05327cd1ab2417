// Sequence layouts over ranks (qkv/dist/shard.h).
#include "qkv/dist/shard.h"

#include <string>

#include "qkv/error.h"

namespace qkv::dist {

SequenceLayout sequence_layout_from_name(std::string_view name) {
  if (name == "contiguous") return SequenceLayout::contiguous;
  if (name == "zigzag") return SequenceLayout::zigzag;
  fail<ValueError>("sequence layout must be 'contiguous' or 'zigzag', got '", std::string(name), "'");
}

std::string_view sequence_layout_name(SequenceLayout layout) {
  return layout == SequenceLayout::zigzag ? "zigzag" : "contiguous";
}

std::vector<int64_t> split_sizes(int64_t n, int64_t parts) {
  if (parts < 1 || n < 0) fail<ValueError>("split_sizes: ", n, " items into ", parts, " parts");
  std::vector<int64_t> sizes(static_cast<size_t>(parts), n / parts);
  for (int64_t i = 0; i < n % parts; ++i) ++sizes[static_cast<size_t>(i)];
  return sizes;
}

Chunk split_part(int64_t n, int64_t parts, int64_t index) {
  if (index < 0 || index >= parts) fail<ValueError>("split_part: part ", index, " of ", parts);
  const std::vector<int64_t> sizes = split_sizes(n, parts);
  int64_t start = 0;
  for (int64_t i = 0; i < index; ++i) start += sizes[static_cast<size_t>(i)];
  return {start, sizes[static_cast<size_t>(index)]};
}

std::vector<Chunk> sequence_chunks(int64_t length, int rank, int size, SequenceLayout layout) {
  if (size < 1 || rank < 0 || rank >= size) fail<ValueError>("sequence_chunks: rank ", rank, " of ", size);
  if (layout == SequenceLayout::contiguous) return {split_part(length, size, rank)};
  const int64_t parts = 2 * int64_t{size};
  return {split_part(length, parts, rank), split_part(length, parts, parts - 1 - rank)};
}

namespace {

int64_t shard_length(const std::vector<Chunk>& chunks) {
  int64_t n = 0;
  for (const Chunk& c : chunks) n += c.length;
  return n;
}

int64_t axis_of(const Tensor& t, int64_t dim, const char* op) {
  const int64_t axis = dim < 0 ? dim + t.dim() : dim;
  if (axis < 0 || axis >= t.dim()) fail<IndexError>(op, ": dim ", dim, " of a ", shape_str(t.shape()), " tensor");
  return axis;
}

}  // namespace

Tensor shard_sequence(const Tensor& full, int64_t dim, int rank, int size, SequenceLayout layout) {
  const int64_t axis = axis_of(full, dim, "shard_sequence");
  const std::vector<Chunk> chunks = sequence_chunks(full.size(axis), rank, size, layout);
  if (chunks.size() == 1) return full.slice(axis, chunks[0].start, chunks[0].start + chunks[0].length);
  Shape shape = full.shape();
  shape[static_cast<size_t>(axis)] = shard_length(chunks);
  Tensor out = Tensor::empty(shape, full.dtype());
  int64_t at = 0;
  for (const Chunk& c : chunks) {
    out.slice(axis, at, at + c.length).copy_from(full.slice(axis, c.start, c.start + c.length));
    at += c.length;
  }
  return out;
}

Tensor unshard_sequence(const std::vector<Tensor>& shards, int64_t dim, SequenceLayout layout) {
  if (shards.empty()) fail<ValueError>("unshard_sequence: no shards");
  const int size = static_cast<int>(shards.size());
  const int64_t axis = axis_of(shards[0], dim, "unshard_sequence");
  int64_t length = 0;
  for (const Tensor& s : shards) length += s.size(axis);
  Shape shape = shards[0].shape();
  shape[static_cast<size_t>(axis)] = length;
  Tensor out = Tensor::empty(shape, shards[0].dtype());
  for (int r = 0; r < size; ++r) {
    const std::vector<Chunk> chunks = sequence_chunks(length, r, size, layout);
    const Tensor& s = shards[static_cast<size_t>(r)];
    if (s.size(axis) != shard_length(chunks) || s.dim() != shards[0].dim()) {
      fail<ShapeError>("unshard_sequence: rank ", r, "'s shard is ", shape_str(s.shape()), "; the ",
                       sequence_layout_name(layout), " layout of ", length, " positions over ", size,
                       " ranks gives it ", shard_length(chunks), " along dim ", axis);
    }
    int64_t at = 0;
    for (const Chunk& c : chunks) {
      out.slice(axis, c.start, c.start + c.length).copy_from(s.slice(axis, at, at + c.length));
      at += c.length;
    }
  }
  return out;
}

Tensor unshard_sequence(const Tensor& gathered, int64_t dim, int size, SequenceLayout layout) {
  const int64_t axis = axis_of(gathered, dim, "unshard_sequence");
  const int64_t length = gathered.size(axis);
  std::vector<Tensor> shards;
  int64_t at = 0;
  for (int r = 0; r < size; ++r) {
    const int64_t n = shard_length(sequence_chunks(length, r, size, layout));
    shards.push_back(gathered.slice(axis, at, at + n));
    at += n;
  }
  return unshard_sequence(shards, axis, layout);
}

}  // namespace qkv::dist
