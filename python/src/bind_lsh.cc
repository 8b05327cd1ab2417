// qkv._qkv's LSH attention (Reformer; qkv/lsh_attention.h): lsh_attention and lsh_buckets.
// python/qkv/attention.py gathers them as qkv.attention.lsh and qkv.attention.lsh_buckets.
#include <nanobind/nanobind.h>

#include <cstdint>
#include <limits>
#include <string>

#include "args.h"
#include "array_like.h"
#include "interrupt.h"
#include "qkv/lsh_attention.h"
#include "tensor_convert.h"

namespace nb = nanobind;

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

qkv::LshAttentionOptions options_of(const char* op, nb::handle n_hashes, nb::handle n_buckets, nb::handle chunk_length,
                                    nb::handle num_chunks_before, nb::handle num_chunks_after, nb::handle is_causal,
                                    nb::handle rotations, nb::handle seed, nb::handle attention_mask) {
  using namespace qkv::python;
  qkv::LshAttentionOptions o;
  o.n_hashes = int_arg(n_hashes, arg_name(op, "n_hashes"), 1, kMax);
  o.n_buckets = int_list_arg(n_buckets, arg_name(op, "n_buckets"), 2, kMax);
  o.chunk_length = int_arg(chunk_length, arg_name(op, "chunk_length"), 1, kMax);
  o.num_chunks_before = int_arg(num_chunks_before, arg_name(op, "num_chunks_before"), 0, kMax);
  o.num_chunks_after = int_arg(num_chunks_after, arg_name(op, "num_chunks_after"), 0, kMax);
  o.is_causal = bool_arg(is_causal, arg_name(op, "is_causal"));
  if (auto r = to_optional_tensor(rotations, arg_name(op, "rotations").c_str())) o.rotations = *r;
  o.seed = uint64_arg(seed, arg_name(op, "seed"));
  if (auto m = to_optional_tensor(attention_mask, arg_name(op, "attention_mask").c_str())) o.attention_mask = *m;
  return o;
}

nb::object lsh(nb::handle qk, nb::handle v, nb::handle n_hashes, nb::handle n_buckets, nb::handle chunk_length,
               nb::handle num_chunks_before, nb::handle num_chunks_after, nb::handle is_causal, nb::handle rotations,
               nb::handle seed, nb::handle attention_mask) {
  using namespace qkv::python;
  constexpr const char* kOp = "lsh_attention";
  const qkv::LshAttentionOptions o = options_of(kOp, n_hashes, n_buckets, chunk_length, num_chunks_before,
                                                num_chunks_after, is_causal, rotations, seed, attention_mask);
  const qkv::Tensor tqk = to_tensor(qk, arg_name(kOp, "qk").c_str()), tv = to_tensor(v, arg_name(kOp, "v").c_str());
  qkv::Tensor out;
  {
    InterruptibleRelease release;
    out = qkv::lsh_attention(tqk, tv, o);
  }
  return to_array_like(out, qk);
}

nb::object buckets(nb::handle qk, nb::handle n_hashes, nb::handle n_buckets, nb::handle chunk_length,
                   nb::handle rotations, nb::handle seed, nb::handle attention_mask) {
  using namespace qkv::python;
  constexpr const char* kOp = "lsh_buckets";
  const nb::int_ zero(0);
  const qkv::LshAttentionOptions o =
      options_of(kOp, n_hashes, n_buckets, chunk_length, zero, zero, nb::bool_(false), rotations, seed, attention_mask);
  const qkv::Tensor tqk = to_tensor(qk, arg_name(kOp, "qk").c_str());
  return to_array_like(qkv::lsh_buckets(tqk, o), qk);
}

}  // namespace

void bind_lsh(nb::module_& m) {
  m.def("lsh_attention", &lsh, nb::arg("qk").none(), nb::arg("v").none(), nb::arg("n_hashes").none() = 1,
        nb::arg("n_buckets").none() = nb::none(), nb::arg("chunk_length").none() = 64,
        nb::arg("num_chunks_before").none() = 1, nb::arg("num_chunks_after").none() = 0,
        nb::arg("is_causal").none() = false, nb::arg("rotations").none() = nb::none(), nb::arg("seed").none() = 0,
        nb::arg("attention_mask").none() = nb::none(),
        nb::sig("def lsh_attention(qk: numpy.typing.ArrayLike, v: numpy.typing.ArrayLike, n_hashes: int = 1, "
                "n_buckets: int | typing.Sequence[int] | None = None, chunk_length: int = 64, "
                "num_chunks_before: int = 1, num_chunks_after: int = 0, is_causal: bool = False, "
                "rotations: numpy.typing.ArrayLike | None = None, seed: int = 0, "
                "attention_mask: numpy.typing.ArrayLike | None = None) -> typing.Any"),
        "LSH attention with Hugging Face Reformer LSHSelfAttention's semantics: shared query-key qk\n"
        "[..., L, D] (keys length-normalized), v [..., L, Dv]; n_hashes rounds of random-rotation\n"
        "hashing into n_buckets (even, or a list of even factors; None: Reformer's default for L),\n"
        "a stable sort by bucket, chunks of chunk_length attending to themselves and\n"
        "num_chunks_before/after neighbours, no attention to self unless alone (-1e5), masked keys\n"
        "-1e9 (is_causal = Reformer's is_decoder; attention_mask broadcast to [..., L], 0 = padding),\n"
        "rounds merged by logsumexp. rotations [H or 1, D, n_hashes, sum(n_buckets)/2] (Reformer's\n"
        "layout) or drawn from seed. L must be a multiple of chunk_length when L > chunk_length.");
  m.def("lsh_buckets", &buckets, nb::arg("qk").none(), nb::arg("n_hashes").none() = 1,
        nb::arg("n_buckets").none() = nb::none(), nb::arg("chunk_length").none() = 64,
        nb::arg("rotations").none() = nb::none(), nb::arg("seed").none() = 0,
        nb::arg("attention_mask").none() = nb::none(),
        nb::sig("def lsh_buckets(qk: numpy.typing.ArrayLike, n_hashes: int = 1, "
                "n_buckets: int | typing.Sequence[int] | None = None, chunk_length: int = 64, "
                "rotations: numpy.typing.ArrayLike | None = None, seed: int = 0, "
                "attention_mask: numpy.typing.ArrayLike | None = None) -> typing.Any"),
        "The bucket of each position per hash round as lsh_attention hashes it: int64\n"
        "[..., n_hashes, L] in [0, n] (n = the bucket count; n marks padding).");
}
