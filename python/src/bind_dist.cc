// qkv._qkv's distributed attention (qkv/dist): ring, Ulysses and tensor-parallel attention on
// an MPI communicator that mpi4py made (python/qkv/dist.py passes its C handle). Without MPI
// (QKV_MPI=OFF) only dist_available = False is defined.
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <exception>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "args.h"
#include "array_like.h"
#include "interrupt.h"
#include "tensor_convert.h"
#ifdef QKV_HAVE_MPI
#include "qkv/dist/ring_attention.h"
#include "qkv/dist/tensor_parallel_mha.h"
#include "qkv/dist/ulysses_attention.h"
#endif

namespace nb = nanobind;

#ifdef QKV_HAVE_MPI
namespace {

using namespace qkv::python;

// mpi4py's handle: the C MPI_Comm as an integer (a pointer in Open MPI, an int in MPICH).
template <class Comm>
Comm comm_from_handle(uint64_t handle) {
  if constexpr (std::is_pointer_v<Comm>) {
    return reinterpret_cast<Comm>(static_cast<uintptr_t>(handle));
  } else {
    return static_cast<Comm>(handle);
  }
}

qkv::dist::Communicator communicator(uint64_t handle) {
  return qkv::dist::Communicator::borrow(comm_from_handle<MPI_Comm>(handle));
}

// Ring's or Ulysses' options from the Python arguments both take (errors name `op`).
template <class Options>
Options scheme_options(const char* op, nb::handle is_causal, nb::handle layout, nb::handle scale, nb::handle enable_gqa,
                       nb::handle attn_mask) {
  Options o;
  o.is_causal = bool_arg(is_causal, arg_name(op, "is_causal"));
  o.layout = qkv::dist::sequence_layout_from_name(str_arg(layout, arg_name(op, "layout")));
  o.scale = optional_float_arg(scale, arg_name(op, "scale"));
  o.enable_gqa = bool_arg(enable_gqa, arg_name(op, "enable_gqa"));
  o.attn_mask = to_optional_tensor(attn_mask, arg_name(op, "attn_mask").c_str());
  return o;
}

// Runs `convert` (this rank's arguments from Python). When it fails, this rank takes part in the
// call's agreement step as a refusal (refuse_call), so that the other ranks' call fails at once
// naming this rank and quoting the error, instead of waiting QKV_DIST_TIMEOUT for a rank that
// never makes the call; then the error is raised here. nanobind's TypeError / ValueError /
// IndexError become qkv's DTypeError / ValueError / IndexError (the same Python classes), so
// that the other ranks raise that class too. The GIL stays held: the others are already in the
// same step, or on their way to it.
template <class Convert>
void converting(const char* op, const qkv::dist::Communicator& comm, Convert&& convert) {
  std::exception_ptr error;
  try {
    convert();
    return;
  } catch (const nb::builtin_exception& e) {
    switch (e.type()) {
      case nb::exception_type::type_error: error = std::make_exception_ptr(qkv::DTypeError(e.what())); break;
      case nb::exception_type::value_error: error = std::make_exception_ptr(qkv::ValueError(e.what())); break;
      case nb::exception_type::index_error: error = std::make_exception_ptr(qkv::IndexError(e.what())); break;
      default: error = std::current_exception();
    }
  } catch (...) {
    error = std::current_exception();
  }
  qkv::dist::refuse_call(op, comm, error);
}

qkv::Tensor tensor_arg(nb::handle h, const char* op, const char* name) {
  return to_tensor(h, arg_name(op, name).c_str());
}

nb::object gradients(const qkv::AttentionGradients& g, nb::handle like) {
  return nb::make_tuple(to_array_like(g.dq, like), to_array_like(g.dk, like), to_array_like(g.dv, like));
}

nb::object ring(nb::handle q, nb::handle k, nb::handle v, uint64_t comm, nb::handle is_causal, nb::handle layout,
                nb::handle scale, nb::handle enable_gqa, nb::handle attn_mask, nb::handle return_logsumexp) {
  constexpr const char* kOp = "ring_attention";
  const qkv::dist::Communicator world = communicator(comm);
  qkv::dist::RingAttentionOptions o;
  qkv::Tensor tq, tk, tv;
  converting(kOp, world, [&] {
    o = scheme_options<qkv::dist::RingAttentionOptions>(kOp, is_causal, layout, scale, enable_gqa, attn_mask);
    o.return_logsumexp = bool_arg(return_logsumexp, arg_name(kOp, "return_logsumexp"));
    tq = tensor_arg(q, kOp, "q"), tk = tensor_arg(k, kOp, "k"), tv = tensor_arg(v, kOp, "v");
  });
  qkv::AttentionResult r;
  {
    nb::gil_scoped_release release;  // MPI waits poll their own deadline (QKV_DIST_TIMEOUT)
    r = qkv::dist::ring_attention(tq, tk, tv, world, o);
  }
  if (!o.return_logsumexp) return to_array_like(r.output, q);
  return nb::make_tuple(to_array_like(r.output, q), to_array_like(*r.logsumexp, q));
}

nb::object ulysses(nb::handle q, nb::handle k, nb::handle v, uint64_t comm, nb::handle is_causal, nb::handle layout,
                   nb::handle scale, nb::handle enable_gqa, nb::handle attn_mask) {
  constexpr const char* kOp = "ulysses_attention";
  const qkv::dist::Communicator world = communicator(comm);
  qkv::dist::UlyssesAttentionOptions o;
  qkv::Tensor tq, tk, tv;
  converting(kOp, world, [&] {
    o = scheme_options<qkv::dist::UlyssesAttentionOptions>(kOp, is_causal, layout, scale, enable_gqa, attn_mask);
    tq = tensor_arg(q, kOp, "q"), tk = tensor_arg(k, kOp, "k"), tv = tensor_arg(v, kOp, "v");
  });
  qkv::Tensor out;
  {
    nb::gil_scoped_release release;
    out = qkv::dist::ulysses_attention(tq, tk, tv, world, o);
  }
  return to_array_like(out, q);
}

nb::object ring_backward(nb::handle q, nb::handle k, nb::handle v, nb::handle out, nb::handle grad_out,
                         nb::handle logsumexp, uint64_t comm, nb::handle is_causal, nb::handle layout, nb::handle scale,
                         nb::handle enable_gqa, nb::handle attn_mask) {
  constexpr const char* kOp = "ring_attention_backward";
  const qkv::dist::Communicator world = communicator(comm);
  qkv::dist::RingAttentionOptions o;
  qkv::Tensor tq, tk, tv, to, tg, tl;
  converting(kOp, world, [&] {
    o = scheme_options<qkv::dist::RingAttentionOptions>(kOp, is_causal, layout, scale, enable_gqa, attn_mask);
    tq = tensor_arg(q, kOp, "q"), tk = tensor_arg(k, kOp, "k"), tv = tensor_arg(v, kOp, "v");
    to = tensor_arg(out, kOp, "out"), tg = tensor_arg(grad_out, kOp, "grad_out");
    tl = tensor_arg(logsumexp, kOp, "logsumexp");
  });
  qkv::AttentionGradients g;
  {
    nb::gil_scoped_release release;
    g = qkv::dist::ring_attention_backward(tq, tk, tv, to, tg, tl, world, o);
  }
  return gradients(g, q);
}

nb::object ulysses_backward(nb::handle q, nb::handle k, nb::handle v, nb::handle grad_out, uint64_t comm,
                            nb::handle is_causal, nb::handle layout, nb::handle scale, nb::handle enable_gqa,
                            nb::handle attn_mask) {
  constexpr const char* kOp = "ulysses_attention_backward";
  const qkv::dist::Communicator world = communicator(comm);
  qkv::dist::UlyssesAttentionOptions o;
  qkv::Tensor tq, tk, tv, tg;
  converting(kOp, world, [&] {
    o = scheme_options<qkv::dist::UlyssesAttentionOptions>(kOp, is_causal, layout, scale, enable_gqa, attn_mask);
    tq = tensor_arg(q, kOp, "q"), tk = tensor_arg(k, kOp, "k"), tv = tensor_arg(v, kOp, "v");
    tg = tensor_arg(grad_out, kOp, "grad_out");
  });
  qkv::AttentionGradients g;
  {
    nb::gil_scoped_release release;
    g = qkv::dist::ulysses_attention_backward(tq, tk, tv, tg, world, o);
  }
  return gradients(g, q);
}

std::vector<std::pair<int64_t, int64_t>> chunks(int64_t length, int rank, int size, const std::string& layout) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (const qkv::dist::Chunk& c :
       qkv::dist::sequence_chunks(length, rank, size, qkv::dist::sequence_layout_from_name(layout))) {
    out.emplace_back(c.start, c.length);
  }
  return out;
}

void bind_tensor_parallel(nb::module_& m) {
  using qkv::dist::TensorParallelAttention;
  nb::class_<TensorParallelAttention>(m, "TensorParallelAttention")
      .def_static(
          "from_torch_mha",
          [](nb::handle state, int64_t embed_dim, int64_t num_heads, bool batch_first, uint64_t comm) {
            qkv::nn::MultiheadAttentionConfig c;
            c.embed_dim = embed_dim, c.num_heads = num_heads, c.batch_first = batch_first;
            const qkv::dist::Communicator world = communicator(comm);
            std::map<std::string, qkv::Tensor> sd;
            converting("TensorParallelAttention::from_torch_mha", world,
                       [&] { sd = to_tensor_map(state, "TensorParallelAttention"); });
            return TensorParallelAttention::from_torch_mha(c, sd, world);
          },
          nb::arg("state_dict"), nb::arg("embed_dim"), nb::arg("num_heads"), nb::arg("batch_first"), nb::arg("comm"))
      .def_static(
          "from_projections",
          [](nb::handle state, int64_t embed_dim, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
             bool batch_first, uint64_t comm) {
            const qkv::dist::Communicator world = communicator(comm);
            std::map<std::string, qkv::Tensor> sd;
            converting("TensorParallelAttention::from_projections", world,
                       [&] { sd = to_tensor_map(state, "TensorParallelAttention"); });
            return TensorParallelAttention::from_projections(
                {embed_dim, num_heads, num_kv_heads, head_dim, batch_first}, sd, world);
          },
          nb::arg("state_dict"), nb::arg("embed_dim"), nb::arg("num_heads"), nb::arg("num_kv_heads"),
          nb::arg("head_dim"), nb::arg("batch_first"), nb::arg("comm"))
      .def_static(
          "from_shard",
          [](nb::handle shard, int64_t embed_dim, int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
             bool batch_first, uint64_t comm) {
            const qkv::dist::Communicator world = communicator(comm);
            std::map<std::string, qkv::Tensor> sd;
            converting("TensorParallelAttention::from_shard", world,
                       [&] { sd = to_tensor_map(shard, "TensorParallelAttention.from_shard"); });
            return TensorParallelAttention::from_shard({embed_dim, num_heads, num_kv_heads, head_dim, batch_first}, sd,
                                                       world);
          },
          nb::arg("shard"), nb::arg("embed_dim"), nb::arg("num_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim"),
          nb::arg("batch_first"), nb::arg("comm"))
      .def("shard_state_dict", [](const TensorParallelAttention& layer) { return to_dict(layer.shard_state_dict()); })
      .def(
          "forward",
          [](const TensorParallelAttention& layer, nb::handle query, nb::handle key, nb::handle value,
             nb::handle is_causal) {
            qkv::Tensor q, k, v;
            qkv::dist::TensorParallelOptions o;
            converting("TensorParallelAttention.forward", layer.communicator(), [&] {
              o.is_causal = bool_arg(is_causal, "TensorParallelAttention.forward: is_causal");
              q = to_tensor(query, "TensorParallelAttention.forward: query");
              k = to_tensor(key, "TensorParallelAttention.forward: key");
              v = to_tensor(value, "TensorParallelAttention.forward: value");
            });
            qkv::Tensor out;
            {
              nb::gil_scoped_release release;
              out = layer.forward(q, k, v, o);
            }
            return to_array_like(out, query);
          },
          nb::arg("query"), nb::arg("key"), nb::arg("value"), nb::arg("is_causal").none() = false)
      .def_prop_ro("first_head", &TensorParallelAttention::first_head)
      .def_prop_ro("local_heads", &TensorParallelAttention::local_heads);
}

}  // namespace
#endif

void bind_dist(nb::module_& m) {
  nb::module_ d = m.def_submodule("dist", "Distributed attention over MPI (qkv/dist; python/qkv/dist.py wraps it).");
#ifdef QKV_HAVE_MPI
  d.attr("available") = true;
  d.def("ring_attention", &ring, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("comm"),
        nb::arg("is_causal").none() = false, nb::arg("layout").none() = "contiguous",
        nb::arg("scale").none() = nb::none(), nb::arg("enable_gqa").none() = false,
        nb::arg("attn_mask").none() = nb::none(), nb::arg("return_logsumexp").none() = false,
        "Ring attention on this rank's shards (qkv.dist.ring_attention).");
  d.def("ring_attention_backward", &ring_backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"),
        nb::arg("grad_out"), nb::arg("logsumexp"), nb::arg("comm"), nb::arg("is_causal").none() = false,
        nb::arg("layout").none() = "contiguous", nb::arg("scale").none() = nb::none(),
        nb::arg("enable_gqa").none() = false, nb::arg("attn_mask").none() = nb::none(),
        "(dq, dk, dv) of this rank's shards (qkv.dist.ring_attention_backward).");
  d.def("ulysses_attention", &ulysses, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("comm"),
        nb::arg("is_causal").none() = false, nb::arg("layout").none() = "contiguous",
        nb::arg("scale").none() = nb::none(), nb::arg("enable_gqa").none() = false,
        nb::arg("attn_mask").none() = nb::none(),
        "Ulysses attention on this rank's shards (qkv.dist.ulysses_attention).");
  d.def("ulysses_attention_backward", &ulysses_backward, nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("grad_out"),
        nb::arg("comm"), nb::arg("is_causal").none() = false, nb::arg("layout").none() = "contiguous",
        nb::arg("scale").none() = nb::none(), nb::arg("enable_gqa").none() = false,
        nb::arg("attn_mask").none() = nb::none(),
        "(dq, dk, dv) of this rank's shards (qkv.dist.ulysses_attention_backward).");
  d.def("sequence_chunks", &chunks, nb::arg("length"), nb::arg("rank"), nb::arg("size"),
        nb::arg("layout") = "contiguous", "[(start, length)] of the positions `rank` holds (qkv/dist/shard.h).");
  bind_tensor_parallel(d);
#else
  d.attr("available") = false;
#endif
}
