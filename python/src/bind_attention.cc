// qkv.attention_reference and qkv.scaled_dot_product_attention.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>

#include <cstdint>
#include <optional>
#include <random>

#include "qkv/attention.h"
#include "tensor_convert.h"

namespace nb = nanobind;
using qkv::python::to_numpy;
using qkv::python::to_optional_tensor;
using qkv::python::to_tensor;

namespace {

// seed=None draws a fresh seed, as torch's dropout differs from call to call.
uint64_t seed_or_random(std::optional<uint64_t> seed) {
  if (seed) return *seed;
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

qkv::AttentionOptions make_options(nb::handle attn_mask, double dropout_p, bool is_causal,
                                   std::optional<double> scale, bool enable_gqa, bool return_weights,
                                   std::optional<uint64_t> seed, const char* op) {
  qkv::AttentionOptions o;
  o.attn_mask = to_optional_tensor(attn_mask, op);
  o.dropout_p = dropout_p;
  o.is_causal = is_causal;
  o.scale = scale;
  o.enable_gqa = enable_gqa;
  o.return_weights = return_weights;
  o.seed = dropout_p > 0 ? seed_or_random(seed) : 0;
  return o;
}

nb::object attention_reference(nb::handle q, nb::handle k, nb::handle v, nb::handle attn_mask,
                               double dropout_p, bool is_causal, std::optional<double> scale,
                               bool enable_gqa, bool return_weights, std::optional<uint64_t> seed) {
  const qkv::Tensor tq = to_tensor(q, "attention_reference: q");
  const qkv::Tensor tk = to_tensor(k, "attention_reference: k");
  const qkv::Tensor tv = to_tensor(v, "attention_reference: v");
  const qkv::AttentionOptions o = make_options(attn_mask, dropout_p, is_causal, scale, enable_gqa,
                                               return_weights, seed, "attention_reference: attn_mask");
  qkv::AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = qkv::attention_reference(tq, tk, tv, o);
  }
  if (!return_weights) return to_numpy(r.output);
  return nb::make_tuple(to_numpy(r.output), to_numpy(*r.weights));
}

nb::object sdpa(nb::handle query, nb::handle key, nb::handle value, nb::handle attn_mask,
                double dropout_p, bool is_causal, std::optional<double> scale, bool enable_gqa,
                std::optional<uint64_t> seed) {
  const qkv::Tensor tq = to_tensor(query, "scaled_dot_product_attention: query");
  const qkv::Tensor tk = to_tensor(key, "scaled_dot_product_attention: key");
  const qkv::Tensor tv = to_tensor(value, "scaled_dot_product_attention: value");
  const qkv::AttentionOptions o = make_options(attn_mask, dropout_p, is_causal, scale, enable_gqa, false,
                                               seed, "scaled_dot_product_attention: attn_mask");
  qkv::AttentionResult r;
  {
    nb::gil_scoped_release release;
    r = qkv::scaled_dot_product_attention(tq, tk, tv, o);
  }
  return to_numpy(r.output);
}

constexpr const char* kConventions = R"(
Shapes: q [..., Hq, Lq, Dk], k [..., Hk, Lk, Dk], v [..., Hk, Lk, Dv]; leading
dims broadcast (numpy rules). Output [..., Hq, Lq, Dv] in q's dtype (float16 and
bfloat16 are computed in a wider type). Conventions are PyTorch's:
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

Inputs: NumPy arrays or any CPU DLPack producer (torch tensors, ...), read in
place without copying; float32, float64, float16, bfloat16 (ml_dtypes).
Errors: ValueError for shapes and option values, TypeError for dtypes.
The GIL is released while it computes.)";

}  // namespace

void bind_attention(nb::module_& m) {
  m.def("attention_reference", &attention_reference, nb::arg("q"), nb::arg("k"), nb::arg("v"),
        nb::arg("attn_mask").none() = nb::none(), nb::arg("dropout_p") = 0.0, nb::arg("is_causal") = false,
        nb::arg("scale").none() = nb::none(), nb::arg("enable_gqa") = false,
        nb::arg("return_weights") = false, nb::arg("seed").none() = nb::none(),
        nb::sig("def attention_reference(q: numpy.typing.ArrayLike, k: numpy.typing.ArrayLike, "
                "v: numpy.typing.ArrayLike, attn_mask: numpy.typing.ArrayLike | None = None, "
                "dropout_p: float = 0.0, is_causal: bool = False, scale: float | None = None, "
                "enable_gqa: bool = False, return_weights: bool = False, seed: int | None = None) "
                "-> numpy.ndarray | tuple[numpy.ndarray, numpy.ndarray]"),
        (std::string("Scaled dot-product attention by the float64 reference (the oracle of every\n"
                     "qkv kernel): plain loops, single-threaded. Returns the output, or\n"
                     "(output, weights) with return_weights=True, weights [..., Hq, Lq, Lk] being\n"
                     "those applied to v (after dropout).\n") +
         kConventions)
            .c_str());

  m.def("scaled_dot_product_attention", &sdpa, nb::arg("query"), nb::arg("key"), nb::arg("value"),
        nb::arg("attn_mask").none() = nb::none(), nb::arg("dropout_p") = 0.0, nb::arg("is_causal") = false,
        nb::arg("scale").none() = nb::none(), nb::arg("enable_gqa") = false, nb::kw_only(),
        nb::arg("seed").none() = nb::none(),
        nb::sig("def scaled_dot_product_attention(query: numpy.typing.ArrayLike, "
                "key: numpy.typing.ArrayLike, value: numpy.typing.ArrayLike, "
                "attn_mask: numpy.typing.ArrayLike | None = None, dropout_p: float = 0.0, "
                "is_causal: bool = False, scale: float | None = None, enable_gqa: bool = False, *, "
                "seed: int | None = None) -> numpy.ndarray"),
        (std::string("torch.nn.functional.scaled_dot_product_attention, same arguments (plus the\n"
                     "keyword seed for dropout): qkv::scaled_dot_product_attention, which runs the\n"
                     "fastest qkv kernel that supports the inputs and options. Returns the output\n"
                     "[..., Hq, Lq, Dv].\n") +
         kConventions)
            .c_str());
}
