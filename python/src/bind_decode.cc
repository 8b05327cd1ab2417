// qkv.KVCache and qkv.decode_attention (qkv/kv_cache.h): generation against a key/value cache.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <shared_mutex>
#include <string>
#include <vector>

#include "args.h"
#include "array_like.h"
#include "interrupt.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/rotary.h"
#include "tensor_convert.h"

namespace nb = nanobind;
using qkv::python::to_array_like;
using qkv::python::to_tensor;

namespace {

qkv::RotaryLayout layout_of(const std::string& layout, const char* op) {
  if (layout != "neox" && layout != "gptj") {
    throw nb::value_error((std::string(op) + ": layout must be 'neox' or 'gptj', got '" + layout + "'").c_str());
  }
  return layout == "gptj" ? qkv::RotaryLayout::gptj : qkv::RotaryLayout::neox;
}

qkv::KVCache make_cache(int64_t batch, int64_t kv_heads, int64_t head_dim, int64_t capacity,
                        std::optional<int64_t> value_dim, const std::string& dtype, int64_t window,
                        std::optional<int64_t> page_size, int64_t pages, bool rotary, double rotary_base,
                        const std::string& rotary_layout, int64_t rotary_dim) {
  qkv::KVCacheConfig c{batch, kv_heads, head_dim, capacity, value_dim.value_or(0), qkv::dtype_from_name(dtype)};
  c.window = window, c.page_size = page_size.value_or(0), c.pages = pages;
  if (rotary) c.rotary = qkv::CacheRotary{rotary_base, layout_of(rotary_layout, "KVCache"), rotary_dim};
  return qkv::KVCache(c);
}

// counts: None, a list or tuple of ints, or an integer array of any kind k and v may be
// (NumPy, torch, any DLPack producer); nanobind's list caster refused torch tensors.
std::vector<int64_t> counts_arg(nb::handle counts) {
  constexpr const char* kWhat = "KVCache.append: counts";
  if (PyList_Check(counts.ptr()) || PyTuple_Check(counts.ptr()) || counts.is_none()) {
    return qkv::python::int_list_arg(counts, kWhat, INT64_MIN, INT64_MAX);
  }
  const qkv::Tensor t = to_tensor(counts, kWhat);
  if (t.dtype() != qkv::DType::i8 && t.dtype() != qkv::DType::i32 && t.dtype() != qkv::DType::i64) {
    qkv::fail<qkv::DTypeError>(kWhat, " must be integers (int8, int32 or int64), got ", qkv::dtype_name(t.dtype()));
  }
  if (t.dim() != 1) qkv::fail<qkv::ShapeError>(kWhat, " must be 1-D [B], got shape ", qkv::shape_str(t.shape()));
  return t.to(qkv::Device::cpu()).to_vector<int64_t>();
}

// Threads (docs/decode.md, "Threads"): the cache's methods that lock it (append, set_length,
// reset, decode_attention, state, sequence_keys / sequence_values) are called with the GIL
// released, and the accessors below read under its read lock taken with the GIL released: a
// thread holding the GIL never waits for the cache's lock, which a thread without the GIL may
// hold while it waits for the GIL.
template <class F>
auto read_locked(const qkv::KVCache& cache, F&& f) {
  std::shared_lock<std::shared_mutex> lock;
  {
    nb::gil_scoped_release release;
    lock = cache.read_lock();
  }
  return f(cache);
}

template <class F>
auto without_gil(F&& f) {
  nb::gil_scoped_release release;
  return f();
}

void append(qkv::KVCache& cache, nb::handle k, nb::handle v, nb::handle counts) {
  const qkv::Tensor tk = to_tensor(k, "KVCache.append: k"), tv = to_tensor(v, "KVCache.append: v");
  const std::vector<int64_t> n = counts_arg(counts);
  qkv::python::InterruptibleRelease release;
  cache.append(tk, tv, n);
}

nb::object decode(nb::handle q, const qkv::KVCache& cache, std::optional<double> scale, bool causal, int64_t window,
                  double softcap, int64_t chunk, bool return_logsumexp, const std::string& matmul_precision) {
  const qkv::Tensor tq = to_tensor(q, "decode_attention: q");
  qkv::DecodeOptions o;
  o.scale = scale, o.causal = causal, o.window = window, o.softcap = softcap, o.chunk = chunk;
  o.return_logsumexp = return_logsumexp;
  o.matmul_precision = qkv::matmul_precision_from_name(matmul_precision, "decode_attention: matmul_precision");
  qkv::AttentionResult r;
  {
    qkv::python::InterruptibleRelease release;
    r = qkv::decode_attention(tq, cache, o);
  }
  if (!return_logsumexp) return to_array_like(r.output, q);
  return nb::make_tuple(to_array_like(r.output, q), to_array_like(*r.logsumexp, q));
}

nb::object rotary(nb::handle x, nb::handle positions, int64_t offset, double base, const std::string& layout,
                  int64_t rotary_dim) {
  qkv::RotaryOptions o;
  o.layout = layout_of(layout, "apply_rotary");
  o.base = base, o.offset = offset, o.rotary_dim = rotary_dim;
  o.positions = qkv::python::to_optional_tensor(positions, "apply_rotary: positions");
  const qkv::Tensor tx = to_tensor(x, "apply_rotary: x");
  qkv::Tensor out;
  {
    qkv::python::InterruptibleRelease release;
    out = qkv::apply_rotary(tx, o);
  }
  return to_array_like(out, x);
}

}  // namespace

void bind_decode(nb::module_& m) {
  m.def("apply_rotary", &rotary, nb::arg("x"), nb::arg("positions").none() = nb::none(), nb::kw_only(),
        nb::arg("offset") = 0, nb::arg("base") = 10000.0, nb::arg("layout") = "neox", nb::arg("rotary_dim") = 0,
        "Rotary position embeddings on x [..., T, D]: pair i of the first rotary_dim features (0: all)\n"
        "turns by position * base^(-2i / rotary_dim); layout 'neox' pairs (x[i], x[i + rotary_dim/2])\n"
        "(Llama, GPT-NeoX), 'gptj' pairs (x[2i], x[2i+1]). Positions offset + t, or integer [T] / [B, T]\n"
        "(for x [B, H, T, D]). Returns x's dtype and array type.");
  nb::class_<qkv::KVCache>(m, "KVCache",
                           "Keys [B, Hk, capacity, D] and values [B, Hk, capacity, Dv], allocated once (float32,\n"
                           "bfloat16, float16 or int8), one length per sequence; append(k, v) writes after each\n"
                           "sequence's length (counts: how many of the T new positions each sequence takes).\n"
                           "window=W keeps only each sequence's last W positions (a ring of capacity >= W slots;\n"
                           "decode attends the last W keys, ONNX Runtime's local_window_size = W). page_size=P\n"
                           "stores K/V in a pool of `pages` pages (0: enough for all) with a block table per\n"
                           "sequence (ValueError when the pool runs out). rotary=True rotates keys on append and\n"
                           "queries in decode_attention at their absolute positions (rotary_base, rotary_layout\n"
                           "'neox' or 'gptj', rotary_dim 0 = head_dim); pass both unrotated. One cache may be used\n"
                           "from several threads: append, set_length and reset wait for decodes in flight and the\n"
                           "reverse, so each decode sees one state (docs/decode.md, \"Threads\").")
      .def(nb::new_(&make_cache), nb::arg("batch"), nb::arg("kv_heads"), nb::arg("head_dim"), nb::arg("capacity"),
           nb::arg("value_dim").none() = nb::none(), nb::arg("dtype") = "float32", nb::kw_only(), nb::arg("window") = 0,
           nb::arg("page_size").none() = nb::none(), nb::arg("pages") = 0, nb::arg("rotary") = false,
           nb::arg("rotary_base") = 10000.0, nb::arg("rotary_layout") = "neox", nb::arg("rotary_dim") = 0)
      .def("append", &append, nb::arg("k"), nb::arg("v"), nb::arg("counts").none() = nb::none(),
           "k [B, Hk, T, D], v [B, Hk, T, Dv] (arrays or tensors); counts: B values in [0, T]\n"
           "(a list, tuple or integer array or tensor).")
      .def_prop_ro("lengths", [](const qkv::KVCache& c) { return read_locked(c, [](auto& x) { return x.lengths(); }); })
      .def(
          "set_length", [](qkv::KVCache& c, int64_t b, int64_t n) { without_gil([&] { c.set_length(b, n); }); },
          nb::arg("sequence"), nb::arg("length"))
      .def("reset", [](qkv::KVCache& c) { without_gil([&] { c.reset(); }); })
      .def_prop_ro("capacity", [](const qkv::KVCache& c) { return c.config().capacity; })
      .def_prop_ro("window", [](const qkv::KVCache& c) { return c.config().window; })
      .def_prop_ro("page_size", [](const qkv::KVCache& c) { return c.config().page_size; })
      .def_prop_ro("pages", [](const qkv::KVCache& c) { return c.config().pages; })
      .def_prop_ro("free_pages",
                   [](const qkv::KVCache& c) { return read_locked(c, [](auto& x) { return x.free_pages(); }); })
      .def(
          "block_table",
          [](const qkv::KVCache& c, int64_t b) { return read_locked(c, [&](auto& x) { return x.block_table(b); }); },
          nb::arg("sequence"), "A paged cache's pages of the sequence in order, from block first_block(sequence).")
      .def(
          "first_block",
          [](const qkv::KVCache& c, int64_t b) { return read_locked(c, [&](auto& x) { return x.first_block(b); }); },
          nb::arg("sequence"), "The block of block_table(sequence)[0]: a window's evicted pages leave the table.")
      .def(
          "first_kept",
          [](const qkv::KVCache& c, int64_t b) { return read_locked(c, [&](auto& x) { return x.first_kept(b); }); },
          nb::arg("sequence"), "The first position still stored.")
      .def(
          "sequence_keys",
          [](const qkv::KVCache& c, int64_t b) {
            return qkv::python::to_numpy(without_gil([&] { return c.sequence_keys(b); }));
          },
          nb::arg("sequence"), "The sequence's stored keys in position order, [Hk, n, D] (cache dtype).")
      .def(
          "sequence_values",
          [](const qkv::KVCache& c, int64_t b) {
            return qkv::python::to_numpy(without_gil([&] { return c.sequence_values(b); }));
          },
          nb::arg("sequence"), "The sequence's stored values in position order, [Hk, n, Dv].")
      .def(
          "state", [](const qkv::KVCache& c) { return qkv::python::to_dict(without_gil([&] { return c.state(); })); },
          "The cache as named arrays (qkv.save writes them as safetensors; docs/decode.md).")
      .def_static(
          "from_state",
          [](nb::handle state) {
            return qkv::KVCache::from_state(qkv::python::to_tensor_map(state, "KVCache.from_state"));
          },
          nb::arg("state"), "The cache state() described (qkv.load of its file).")
      .def_prop_ro(
          "keys",
          [](const qkv::KVCache& c) { return read_locked(c, [](auto& x) { return qkv::python::to_numpy(x.keys()); }); })
      .def_prop_ro("values", [](const qkv::KVCache& c) {
        return read_locked(c, [](auto& x) { return qkv::python::to_numpy(x.values()); });
      });
  m.def("decode_attention", &decode, nb::arg("q"), nb::arg("cache"), nb::kw_only(),
        nb::arg("scale").none() = nb::none(), nb::arg("causal") = true, nb::arg("window") = 0, nb::arg("softcap") = 0.0,
        nb::arg("chunk") = 0, nb::arg("return_logsumexp") = false, nb::arg("matmul_precision") = "highest",
        "Attention of the last Lq positions of each sequence (q [B, Hq, Lq, D], Hq a multiple of Hk)\n"
        "against the cache, after their keys and values were appended: query t is at position\n"
        "length - Lq + t and sees keys j <= it (causal), only the last `window` of them when\n"
        "window > 0; scores scale q.k (1/sqrt(D)), softcap c > 0: c tanh(s / c). Split-KV over the\n"
        "threads, partials merged by logsumexp (docs/decode.md). Output [B, Hq, Lq, Dv] in q's\n"
        "array type; with return_logsumexp, (output, lse [B, Hq, Lq]). matmul_precision is accepted\n"
        "and ignored: every cache is read exactly, bfloat16/float16 rows widened in registers.");
}
