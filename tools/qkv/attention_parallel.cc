// qkv attention --parallel ring|ulysses|heads: the same attention over the ranks of an
// mpiexec job (qkv/dist; docs/distributed.md).
//
//   mpiexec -np 4 qkv attention --q q.npy --k k.npy --v v.npy --parallel ring --causal -o o.npy
// Every rank reads only its shard of the full files (ring, ulysses: its sequence chunks in
// --layout; heads: its heads; .npy files through io::load_npy_slice, other formats whole and
// sliced); rank 0 gathers and writes the full output. With "{rank}" in
// the file names, each rank reads its own pre-sharded files and writes its own output.
#include <filesystem>
#include <string>
#include <vector>

#include "commands.h"
#include "qkv/ascii.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/io.h"
#include "qkv/io_tensor_files.h"
#ifdef QKV_HAVE_MPI
#include "qkv/dist/ring_attention.h"
#include "qkv/dist/ulysses_attention.h"
#endif

namespace qkv::cli {

#ifdef QKV_HAVE_MPI
namespace {

std::string for_rank(std::string path, int rank) {
  const std::string key = "{rank}";
  for (size_t at = path.find(key); at != std::string::npos; at = path.find(key))
    path.replace(at, key.size(), std::to_string(rank));
  return path;
}

bool per_rank(const ParallelAttentionCall& c) { return c.q.find("{rank}") != std::string::npos; }

// This rank's shard of a full tensor [..., H, L, D]: along L for ring/ulysses, H for heads.
Tensor local_part(const Tensor& full, const ParallelAttentionCall& c, const dist::Communicator& comm) {
  const dist::SequenceLayout layout = dist::sequence_layout_from_name(c.layout);
  if (c.scheme != "heads") return dist::shard_sequence(full, -2, comm.rank(), comm.size(), layout);
  const dist::Chunk heads = dist::split_part(full.size(-3), comm.size(), comm.rank());
  return full.slice(-3, heads.start, heads.start + heads.length);
}

// This rank's part of a .npy file, reading only its rows (io::load_npy_slice: one read per
// contiguous run); other formats are loaded whole and sliced.
Tensor read_local_part(const std::string& spec, const ParallelAttentionCall& c, const dist::Communicator& comm) {
  const std::filesystem::path path(spec);
  if (lower_extension(path) != ".npy") return local_part(load_tensor(spec), c, comm);  // ".NPY" too, as load_tensor
  const Shape shape = io::inspect(path).at(0).shape;
  const auto nd = static_cast<int64_t>(shape.size());
  if (nd < 3) return local_part(load_tensor(spec), c, comm);  // the scheme's own shape error
  if (c.scheme == "heads") {
    const dist::Chunk heads = dist::split_part(shape[static_cast<size_t>(nd - 3)], comm.size(), comm.rank());
    return io::load_npy_slice(path, nd - 3, heads.start, heads.start + heads.length);
  }
  std::vector<Tensor> parts;
  for (const dist::Chunk& ch : dist::sequence_chunks(shape[static_cast<size_t>(nd - 2)], comm.rank(), comm.size(),
                                                     dist::sequence_layout_from_name(c.layout))) {
    parts.push_back(io::load_npy_slice(path, nd - 2, ch.start, ch.start + ch.length));
  }
  if (parts.size() == 1) return parts[0];
  Shape out_shape = shape;
  out_shape[static_cast<size_t>(nd - 2)] = parts[0].size(-2) + parts[1].size(-2);
  Tensor out = Tensor::empty(out_shape, parts[0].dtype());
  out.slice(-2, 0, parts[0].size(-2)).copy_from(parts[0]);
  out.slice(-2, parts[0].size(-2), out_shape[static_cast<size_t>(nd - 2)]).copy_from(parts[1]);
  return out;
}

Tensor run_scheme(const Tensor& q, const Tensor& k, const Tensor& v, const ParallelAttentionCall& c,
                  const dist::Communicator& comm) {
  const dist::SequenceLayout layout = dist::sequence_layout_from_name(c.layout);
  if (c.scheme == "ring") {
    dist::RingAttentionOptions o;
    o.is_causal = c.causal, o.layout = layout, o.scale = c.scale, o.enable_gqa = c.gqa;
    o.matmul_precision = matmul_precision_from_name(c.precision);
    return dist::ring_attention(q, k, v, comm, o).output;
  }
  if (c.scheme == "ulysses") {
    dist::UlyssesAttentionOptions o;
    o.is_causal = c.causal, o.layout = layout, o.scale = c.scale, o.enable_gqa = c.gqa;
    o.matmul_precision = matmul_precision_from_name(c.precision);
    return dist::ulysses_attention(q, k, v, comm, o);
  }
  AttentionOptions o;  // heads: each rank its own heads, whole sequences, no communication
  o.is_causal = c.causal, o.scale = c.scale, o.enable_gqa = c.gqa;
  o.matmul_precision = matmul_precision_from_name(c.precision);
  return scaled_dot_product_attention(q, k, v, o).output;
}

}  // namespace

void run_parallel_attention(const ParallelAttentionCall& c) {
  if (c.scheme == "heads" && c.gqa)
    fail<ValueError>("attention --parallel heads: GQA heads are split by ring or ulysses");
  dist::MpiSession mpi(nullptr, nullptr);
  const dist::Communicator comm = dist::Communicator::world();
  const bool sharded = per_rank(c);
  auto input = [&](const std::string& spec) {
    const Tensor t = sharded ? load_tensor(for_rank(spec, comm.rank())) : read_local_part(spec, c, comm);
    return t.to(DType::f32).contiguous();
  };
  const Tensor q = input(c.q), k = input(c.k), v = input(c.v);
  const Tensor out = run_scheme(q, k, v, c, comm).contiguous();
  if (sharded) {
    io::save(for_rank(c.out, comm.rank()), {{"output", out}});
    return;
  }
  const Tensor gathered = comm.all_gather(out, c.scheme == "heads" ? -3 : -2);
  if (comm.rank() != 0) return;
  const Tensor full = c.scheme == "heads" ? gathered
                                          : dist::unshard_sequence(gathered, -2, comm.size(),
                                                                   dist::sequence_layout_from_name(c.layout));
  io::save(c.out, {{"output", full}});
}

#else

void run_parallel_attention(const ParallelAttentionCall&) {
  fail<ValueError>(
      "attention --parallel: this qkv was built without MPI (QKV_MPI=OFF or no MPI found; "
      "Debian: openmpi-bin libopenmpi-dev)");
}

#endif

}  // namespace qkv::cli
