// qkv.attention_reference and qkv.scaled_dot_product_attention.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>
#include <random>

#include "args.h"
#include "array_like.h"
#include "interrupt.h"
#include "mods_arg.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "tensor_convert.h"

namespace nb = nanobind;
using qkv::python::to_array_like;
using qkv::python::to_optional_tensor;
using qkv::python::to_tensor;

namespace {

// seed=None draws a fresh seed, as torch's dropout differs from call to call.
uint64_t seed_or_random(std::optional<uint64_t> seed) {
  if (seed) return *seed;
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

// The keyword arguments both functions share, as Python gave them.
struct Args {
  nb::handle attn_mask, dropout_p, is_causal, scale, enable_gqa, return_weights, seed, return_logsumexp;
  nb::handle matmul_precision = nb::none();  // sdpa only
  nb::handle mods = nb::none();              // a qkv.AttentionMods or None
  nb::handle qk_quantization = nb::none();   // sdpa only
};

qkv::AttentionOptions make_options(const Args& a, const char* op) {
  using namespace qkv::python;
  qkv::AttentionOptions o;
  o.attn_mask = to_optional_tensor(a.attn_mask, arg_name(op, "attn_mask").c_str());
  o.dropout_p = float_arg(a.dropout_p, arg_name(op, "dropout_p"));
  o.is_causal = bool_arg(a.is_causal, arg_name(op, "is_causal"));
  o.scale = optional_float_arg(a.scale, arg_name(op, "scale"));
  o.enable_gqa = bool_arg(a.enable_gqa, arg_name(op, "enable_gqa"));
  o.return_weights = bool_arg(a.return_weights, arg_name(op, "return_weights"));
  o.return_logsumexp = bool_arg(a.return_logsumexp, arg_name(op, "return_logsumexp"));
  const std::optional<uint64_t> seed = seed_arg(a.seed, arg_name(op, "seed"));
  o.seed = o.dropout_p > 0 ? seed_or_random(seed) : 0;
  if (!a.matmul_precision.is_none()) {
    const std::string name = str_arg(a.matmul_precision, arg_name(op, "matmul_precision"));
    o.matmul_precision = qkv::matmul_precision_from_name(name);
  }
  if (!a.qk_quantization.is_none()) {
    o.qk_quantization = qkv::qk_quantization_from_name(str_arg(a.qk_quantization, arg_name(op, "qk_quantization")));
  }
  o.mods = qkv::python::mods_arg(a.mods, op);
  return o;
}

// output, or a tuple (output[, weights][, logsumexp]) in the array type of q.
nb::object run(nb::handle q, nb::handle k, nb::handle v, const Args& args, const char* op, const char* names[3],
               qkv::AttentionResult (*fn)(const qkv::Tensor&, const qkv::Tensor&, const qkv::Tensor&,
                                          const qkv::AttentionOptions&)) {
  using qkv::python::arg_name;
  const qkv::Tensor tq = to_tensor(q, arg_name(op, names[0]).c_str());
  const qkv::Tensor tk = to_tensor(k, arg_name(op, names[1]).c_str());
  const qkv::Tensor tv = to_tensor(v, arg_name(op, names[2]).c_str());
  const qkv::AttentionOptions o = make_options(args, op);
  qkv::AttentionResult r;
  {
    qkv::python::InterruptibleRelease release;
    r = fn(tq, tk, tv, o);
  }
  if (!o.return_weights && !o.return_logsumexp) return to_array_like(r.output, q);
  nb::list out;
  out.append(to_array_like(r.output, q));
  if (o.return_weights) out.append(to_array_like(*r.weights, q));
  if (o.return_logsumexp) out.append(to_array_like(*r.logsumexp, q));
  return nb::tuple(out);
}

nb::object attention_reference(nb::handle q, nb::handle k, nb::handle v, nb::handle attn_mask, nb::handle dropout_p,
                               nb::handle is_causal, nb::handle scale, nb::handle enable_gqa, nb::handle return_weights,
                               nb::handle seed, nb::handle mods) {
  static const char* names[3] = {"q", "k", "v"};
  const Args args{attn_mask,  dropout_p, is_causal, scale, enable_gqa, return_weights, seed, nb::handle(Py_False),
                  nb::none(), mods};
  return run(q, k, v, args, "attention_reference", names, &qkv::attention_reference);
}

nb::object sdpa(nb::handle query, nb::handle key, nb::handle value, nb::handle attn_mask, nb::handle dropout_p,
                nb::handle is_causal, nb::handle scale, nb::handle enable_gqa, nb::handle seed,
                nb::handle return_weights, nb::handle return_logsumexp, nb::handle matmul_precision, nb::handle mods,
                nb::handle qk_quantization) {
  static const char* names[3] = {"query", "key", "value"};
  const Args args{attn_mask, dropout_p,        is_causal,        scale, enable_gqa,     return_weights,
                  seed,      return_logsumexp, matmul_precision, mods,  qk_quantization};
  return run(query, key, value, args, "scaled_dot_product_attention", names, &qkv::scaled_dot_product_attention);
}

// (dq, dk, dv) in q's array type, from the forward's saved out and logsumexp.
nb::tuple sdpa_backward(nb::handle query, nb::handle key, nb::handle value, nb::handle out, nb::handle grad_out,
                        nb::handle logsumexp, nb::handle attn_mask, nb::handle dropout_p, nb::handle is_causal,
                        nb::handle scale, nb::handle enable_gqa, nb::handle seed, nb::handle mods) {
  constexpr const char* kOp = "scaled_dot_product_attention_backward";
  using qkv::python::arg_name;
  const qkv::Tensor tq = to_tensor(query, arg_name(kOp, "query").c_str());
  const qkv::Tensor tk = to_tensor(key, arg_name(kOp, "key").c_str());
  const qkv::Tensor tv = to_tensor(value, arg_name(kOp, "value").c_str());
  const qkv::Tensor to = to_tensor(out, arg_name(kOp, "out").c_str());
  const qkv::Tensor tg = to_tensor(grad_out, arg_name(kOp, "grad_out").c_str());
  const qkv::Tensor tl = to_tensor(logsumexp, arg_name(kOp, "logsumexp").c_str());
  const Args args{
      attn_mask,  dropout_p, is_causal, scale, enable_gqa, nb::handle(Py_False), nb::none(), nb::handle(Py_False),
      nb::none(), mods};
  qkv::AttentionOptions o = make_options(args, kOp);
  if (o.dropout_p > 0) {  // the backward must redraw the forward's mask: its seed is required
    const std::optional<uint64_t> s = qkv::python::seed_arg(seed, arg_name(kOp, "seed"));
    if (!s) throw nb::value_error("scaled_dot_product_attention_backward: dropout_p > 0 needs the forward's seed");
    o.seed = *s;
  }
  qkv::AttentionGradients g;
  {
    qkv::python::InterruptibleRelease release;
    g = qkv::scaled_dot_product_attention_backward(tq, tk, tv, to, tg, tl, o);
  }
  return nb::make_tuple(to_array_like(g.dq, query), to_array_like(g.dk, query), to_array_like(g.dv, query));
}

// output, or (output, logsumexp), for sequences packed along dim 0.
nb::object sdpa_varlen(nb::handle query, nb::handle key, nb::handle value, nb::handle cu_seqlens_q,
                       nb::handle cu_seqlens_k, nb::handle is_causal, nb::handle scale, nb::handle enable_gqa,
                       nb::handle return_logsumexp) {
  constexpr const char* kOp = "scaled_dot_product_attention_varlen";
  using namespace qkv::python;
  const qkv::Tensor tq = to_tensor(query, arg_name(kOp, "query").c_str());
  const qkv::Tensor tk = to_tensor(key, arg_name(kOp, "key").c_str());
  const qkv::Tensor tv = to_tensor(value, arg_name(kOp, "value").c_str());
  const qkv::Tensor cq = to_tensor(cu_seqlens_q, arg_name(kOp, "cu_seqlens_q").c_str());
  const qkv::Tensor ck = to_tensor(cu_seqlens_k, arg_name(kOp, "cu_seqlens_k").c_str());
  qkv::AttentionOptions o;
  o.is_causal = bool_arg(is_causal, arg_name(kOp, "is_causal"));
  o.scale = optional_float_arg(scale, arg_name(kOp, "scale"));
  o.enable_gqa = bool_arg(enable_gqa, arg_name(kOp, "enable_gqa"));
  o.return_logsumexp = bool_arg(return_logsumexp, arg_name(kOp, "return_logsumexp"));
  qkv::AttentionResult r;
  {
    InterruptibleRelease release;
    r = qkv::scaled_dot_product_attention_varlen(tq, tk, tv, cq, ck, o);
  }
  if (!o.return_logsumexp) return to_array_like(r.output, query);
  return nb::make_tuple(to_array_like(r.output, query), to_array_like(*r.logsumexp, query));
}

constexpr const char* kConventions = R"(
Shapes: q [..., Hq, Lq, Dk], k [..., Hk, Lk, Dk], v [..., Hk, Lk, Dv]; leading
dims broadcast (numpy rules). Output [..., Hq, Lq, Dv] in q's dtype (float16 and
bfloat16: scaled_dot_product_attention accumulates their products in float32,
attention_reference computes in float64). Conventions are PyTorch's:
  scale       defaults to 1/sqrt(Dk).
  attn_mask   broadcasts to [..., Lq, Lk]; bool: True = take part, float: added
              to the scaled scores.
  is_causal   query i attends to keys j <= i (top-left aligned); ValueError
              together with attn_mask.
  enable_gqa  Hk may divide Hq: query head h uses k/v head h // (Hq // Hk).
  dropout_p   weights are zeroed with this probability and the rest scaled by
              1/(1-dropout_p); the draw depends only on (seed, element index),
              and seed=None draws a fresh seed.
A row whose every key is masked gives weights 0 and output 0 (not NaN).
  mods        a qkv.AttentionMods: sliding windows, prefix-LM, global tokens,
              BigBird blocks, documents, ALiBi, relative bias, soft-capping,
              masked_fill (help(qkv.AttentionMods)); empty tiles are skipped.

Inputs: NumPy arrays or any CPU DLPack producer (torch tensors, ...), read in
place without copying; float32, float64, float16, bfloat16 (ml_dtypes). Results
have the array type of the first argument (torch in, torch out; else NumPy).
Errors: ValueError for shapes and option values, TypeError for dtypes and
argument types (each message names the argument). The GIL is released while it
computes; Ctrl-C raises KeyboardInterrupt within a fraction of a second.)";

}  // namespace

void bind_attention(nb::module_& m) {
  // Every argument is taken as an object (.none(): None too) and converted by args.h,
  // so a wrong one gets a message naming it instead of nanobind's signature list.
  m.def("attention_reference", &attention_reference, nb::arg("q").none(), nb::arg("k").none(), nb::arg("v").none(),
        nb::arg("attn_mask").none() = nb::none(), nb::arg("dropout_p").none() = 0.0,
        nb::arg("is_causal").none() = false, nb::arg("scale").none() = nb::none(), nb::arg("enable_gqa").none() = false,
        nb::arg("return_weights").none() = false, nb::arg("seed").none() = nb::none(),
        nb::arg("mods").none() = nb::none(),
        nb::sig("def attention_reference(q: numpy.typing.ArrayLike, k: numpy.typing.ArrayLike, "
                "v: numpy.typing.ArrayLike, attn_mask: numpy.typing.ArrayLike | None = None, "
                "dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, "
                "enable_gqa: bool = False, return_weights: bool = False, seed: int | None = None, "
                "mods: typing.Any = None) -> typing.Any"),
        (std::string("Scaled dot-product attention by the float64 reference (the oracle of every\n"
                     "qkv kernel): plain loops, single-threaded. Returns the output, or\n"
                     "(output, weights) with return_weights=True, weights [..., Hq, Lq, Lk] being\n"
                     "those applied to v (after dropout).\n") +
         kConventions)
            .c_str());

  m.def("scaled_dot_product_attention", &sdpa, nb::arg("query").none(), nb::arg("key").none(), nb::arg("value").none(),
        nb::arg("attn_mask").none() = nb::none(), nb::arg("dropout_p").none() = 0.0,
        nb::arg("is_causal").none() = false, nb::arg("scale").none() = nb::none(), nb::arg("enable_gqa").none() = false,
        nb::kw_only(), nb::arg("seed").none() = nb::none(), nb::arg("return_weights").none() = false,
        nb::arg("return_logsumexp").none() = false, nb::arg("matmul_precision").none() = "highest",
        nb::arg("mods").none() = nb::none(), nb::arg("qk_quantization").none() = "none",
        nb::sig("def scaled_dot_product_attention(query: numpy.typing.ArrayLike, "
                "key: numpy.typing.ArrayLike, value: numpy.typing.ArrayLike, "
                "attn_mask: numpy.typing.ArrayLike | None = None, dropout_p: float = 0.0, "
                "is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False, *, "
                "seed: int | None = None, return_weights: bool = False, return_logsumexp: bool = False, "
                "matmul_precision: str = 'highest', mods: typing.Any = None, qk_quantization: str = 'none') "
                "-> typing.Any"),
        (std::string("torch.nn.functional.scaled_dot_product_attention, same arguments (plus the\n"
                     "keywords seed, return_weights, return_logsumexp, matmul_precision, mods,\n"
                     "qk_quantization):\n"
                     "qkv::scaled_dot_product_attention,\n"
                     "which runs the fastest qkv kernel that supports the inputs and options.\n"
                     "Returns the output [..., Hq, Lq, Dv]; with return_weights and/or return_logsumexp\n"
                     "a tuple (output[, weights [..., Hq, Lq, Lk]][, logsumexp [..., Hq, Lq]]):\n"
                     "the weights applied to v (after dropout) from the fused kernel's second pass, and\n"
                     "log sum_j exp(score_ij) of the scaled, masked scores before dropout (-inf for a\n"
                     "fully masked row), float32 (float64 for float64 inputs).\n"
                     "matmul_precision ('highest', 'high', 'medium'; torch.set_float32_matmul_precision's\n"
                     "names) applies to float32 inputs: 'medium' runs the tile products on bfloat16\n"
                     "operands with float32 accumulation where the CPU has native bf16 (AVX512-BF16,\n"
                     "AMX), else exact float32; 'high' is exact float32 on CPUs.\n"
                     "qk_quantization ('none', 'int8', 'int8_unsmoothed'; float32 inputs only, no\n"
                     "backward): 'int8' computes Q K^T on int8 as SageAttention does (K minus its mean\n"
                     "over the keys, per-block scales for Q and K, int32 products), softmax and P V\n"
                     "as matmul_precision says; about 1e-2 relative error (docs/performance-precision.md).\n") +
         kConventions)
            .c_str());
  m.def("scaled_dot_product_attention_varlen", &sdpa_varlen, nb::arg("query").none(), nb::arg("key").none(),
        nb::arg("value").none(), nb::arg("cu_seqlens_q").none(), nb::arg("cu_seqlens_k").none(), nb::kw_only(),
        nb::arg("is_causal").none() = false, nb::arg("scale").none() = nb::none(), nb::arg("enable_gqa").none() = false,
        nb::arg("return_logsumexp").none() = false,
        nb::sig("def scaled_dot_product_attention_varlen(query: numpy.typing.ArrayLike, "
                "key: numpy.typing.ArrayLike, value: numpy.typing.ArrayLike, "
                "cu_seqlens_q: numpy.typing.ArrayLike, cu_seqlens_k: numpy.typing.ArrayLike, *, "
                "is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False, "
                "return_logsumexp: bool = False) -> typing.Any"),
        "Attention over variable-length sequences packed along dim 0, without padding\n"
        "(FlashAttention's flash_attn_varlen_func layout): query [Tq, Hq, Dk], key [Tk, Hk, Dk],\n"
        "value [Tk, Hk, Dv]; sequence s is rows cu_seqlens_q[s]:cu_seqlens_q[s+1] of query and\n"
        "cu_seqlens_k[s]:cu_seqlens_k[s+1] of key and value (int32 or int64 [N + 1], from 0,\n"
        "non-decreasing, ending at Tq and Tk) and attends only to itself. is_causal is\n"
        "per sequence (top-left), enable_gqa lets Hk divide Hq. Returns the output\n"
        "[Tq, Hq, Dv], or (output, logsumexp [Hq, Tq]) with return_logsumexp=True. On the CPU\n"
        "each sequence runs scaled_dot_product_attention; CUDA arrays (torch, ...) run one\n"
        "GPU kernel launch for all of them (bfloat16/float16, D in {64, 128}; docs/cuda.md).");
  m.def("scaled_dot_product_attention_backward", &sdpa_backward, nb::arg("query").none(), nb::arg("key").none(),
        nb::arg("value").none(), nb::arg("out").none(), nb::arg("grad_out").none(), nb::arg("logsumexp").none(),
        nb::arg("attn_mask").none() = nb::none(), nb::arg("dropout_p").none() = 0.0,
        nb::arg("is_causal").none() = false, nb::arg("scale").none() = nb::none(), nb::arg("enable_gqa").none() = false,
        nb::kw_only(), nb::arg("seed").none() = nb::none(), nb::arg("mods").none() = nb::none(),
        nb::sig("def scaled_dot_product_attention_backward(query: numpy.typing.ArrayLike, "
                "key: numpy.typing.ArrayLike, value: numpy.typing.ArrayLike, out: numpy.typing.ArrayLike, "
                "grad_out: numpy.typing.ArrayLike, logsumexp: numpy.typing.ArrayLike, "
                "attn_mask: numpy.typing.ArrayLike | None = None, dropout_p: float = 0.0, "
                "is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False, *, "
                "seed: int | None = None, mods: typing.Any = None) -> tuple[typing.Any, typing.Any, typing.Any]"),
        (std::string("Gradients (dq, dk, dv) of a loss with respect to query, key and value, given its\n"
                     "gradient grad_out with respect to scaled_dot_product_attention's output: the fused\n"
                     "FlashAttention-2 backward, from the forward's saved `out` and `logsumexp`\n"
                     "(scaled_dot_product_attention(..., return_logsumexp=True)) and the same options.\n"
                     "With dropout_p > 0, seed must be the forward's seed (the mask is redrawn from it).\n"
                     "dq, dk, dv have the shapes and dtypes of q, k, v (broadcast and GQA readers summed).\n") +
         kConventions)
            .c_str());
}
