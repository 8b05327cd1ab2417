// qkv._qkv's attention variants beside scaled dot-product attention: linear attention (elu + 1,
// Performer FAVOR+; qkv/linear_attention.h) and additive attention (qkv/additive_attention.h).
// python/qkv/attention.py gathers them with the modifier shortcuts as qkv.attention.*.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <limits>
#include <string>

#include "args.h"
#include "array_like.h"
#include "interrupt.h"
#include "qkv/additive_attention.h"
#include "qkv/linear_attention.h"
#include "tensor_convert.h"

namespace nb = nanobind;
using qkv::python::to_array_like;
using qkv::python::to_optional_tensor;
using qkv::python::to_tensor;

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

// fn(q, k, v, options) on the arrays as tensors (errors naming `op` and the argument), without
// the GIL, as q's array type.
template <class Options, class Fn>
nb::object run(const char* op, nb::handle q, nb::handle k, nb::handle v, const Options& o, Fn fn) {
  using qkv::python::arg_name;
  const qkv::Tensor tq = to_tensor(q, arg_name(op, "q").c_str()), tk = to_tensor(k, arg_name(op, "k").c_str()),
                    tv = to_tensor(v, arg_name(op, "v").c_str());
  qkv::Tensor out;
  {
    qkv::python::InterruptibleRelease release;
    out = fn(tq, tk, tv, o);
  }
  return to_array_like(out, q);
}

nb::object linear(nb::handle q, nb::handle k, nb::handle v, nb::handle is_causal, nb::handle feature_map,
                  nb::handle num_features, nb::handle seed, nb::handle chunk) {
  using namespace qkv::python;
  constexpr const char* kOp = "linear_attention";
  qkv::LinearAttentionOptions o;
  o.is_causal = bool_arg(is_causal, arg_name(kOp, "is_causal"));
  const std::string map = str_arg(feature_map, arg_name(kOp, "feature_map"));
  if (map != "elu" && map != "favor") {
    throw nb::value_error((std::string(kOp) + ": feature_map must be 'elu' or 'favor', got '" + map + "'").c_str());
  }
  o.feature_map = map == "favor" ? qkv::LinearFeatureMap::favor : qkv::LinearFeatureMap::elu;
  o.num_features = int_arg(num_features, arg_name(kOp, "num_features"), 0, kMax);
  o.seed = uint64_arg(seed, arg_name(kOp, "seed"));
  o.chunk = int_arg(chunk, arg_name(kOp, "chunk"), 1, kMax);
  return run(kOp, q, k, v, o, &qkv::linear_attention);
}

// FAVOR+'s W [m, d] (float64 NumPy) for `seed`: what linear_attention(feature_map='favor',
// num_features=m, seed=seed) draws, for an oracle of the same features.
nb::object favor_features(nb::handle d, nb::handle m, nb::handle seed) {
  using namespace qkv::python;
  constexpr const char* kOp = "favor_random_features";
  const int64_t dd = int_arg(d, arg_name(kOp, "d"), 1, kMax), mm = int_arg(m, arg_name(kOp, "m"), 1, kMax);
  const uint64_t s = uint64_arg(seed, arg_name(kOp, "seed"));
  return to_numpy(qkv::favor_random_features(dd, mm, s));
}

nb::object additive(nb::handle q, nb::handle k, nb::handle v, nb::handle scale, nb::handle value_mask,
                    nb::handle use_causal_mask) {
  using namespace qkv::python;
  constexpr const char* kOp = "additive_attention";
  qkv::AdditiveAttentionOptions o;
  o.scale = to_optional_tensor(scale, arg_name(kOp, "scale").c_str());
  o.value_mask = to_optional_tensor(value_mask, arg_name(kOp, "value_mask").c_str());
  o.use_causal_mask = bool_arg(use_causal_mask, arg_name(kOp, "use_causal_mask"));
  return run(kOp, q, k, v, o, &qkv::additive_attention);
}

}  // namespace

void bind_variants(nb::module_& m) {
  m.def("linear_attention", &linear, nb::arg("q").none(), nb::arg("k").none(), nb::arg("v").none(),
        nb::arg("is_causal").none() = false, nb::arg("feature_map").none() = "elu", nb::arg("num_features").none() = 0,
        nb::arg("seed").none() = 0, nb::arg("chunk").none() = 64,
        nb::sig("def linear_attention(q: numpy.typing.ArrayLike, k: numpy.typing.ArrayLike, "
                "v: numpy.typing.ArrayLike, is_causal: bool = False, feature_map: str = 'elu', "
                "num_features: int = 0, seed: int = 0, chunk: int = 64) -> typing.Any"),
        "Linear attention (Katharopoulos et al.): out_i = phi(q_i)^T (sum_j phi(k_j) v_j^T) / (phi(q_i)^T\n"
        "sum_j phi(k_j)) over every key, or keys j <= i with is_causal (chunked prefix sums, `chunk`\n"
        "rows each). feature_map 'elu' (phi = elu + 1) or 'favor' (Performer's positive orthogonal\n"
        "random features: num_features m, 0 = 2 D, drawn from `seed`). q [..., L, D], k [..., Lk, D],\n"
        "v [..., Lk, Dv] with the same leading dims; O(L) time and memory (docs/attention-variants-linear.md).");
  m.def("favor_random_features", &favor_features, nb::arg("d").none(), nb::arg("m").none(), nb::arg("seed").none() = 0,
        nb::sig("def favor_random_features(d: int, m: int, seed: int = 0) -> numpy.typing.NDArray[numpy.float64]"),
        "FAVOR+'s random features W [m, d] (float64) drawn from `seed`: the rows linear_attention(...,\n"
        "feature_map='favor', num_features=m, seed=seed) uses for head size d (orthogonal blocks\n"
        "of d Gaussian rows, rescaled by chi(d) norms). phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m), x' = x / d^(1/4).");
  m.def("additive_attention", &additive, nb::arg("q").none(), nb::arg("k").none(), nb::arg("v").none(),
        nb::arg("scale").none() = nb::none(), nb::arg("value_mask").none() = nb::none(),
        nb::arg("use_causal_mask").none() = false,
        nb::sig("def additive_attention(q: numpy.typing.ArrayLike, k: numpy.typing.ArrayLike, "
                "v: numpy.typing.ArrayLike, scale: numpy.typing.ArrayLike | None = None, "
                "value_mask: numpy.typing.ArrayLike | None = None, use_causal_mask: bool = False) -> typing.Any"),
        "Additive (Bahdanau) attention with Keras 3's AdditiveAttention semantics: scores\n"
        "sum_d scale_d tanh(q_id + k_jd), masked keys (value_mask False, or j > i with\n"
        "use_causal_mask) lowered by 1e9 as Keras does, softmax over keys, weights times v.\n"
        "q [..., Lq, D], k [..., Lk, D], v [..., Lk, Dv]; scale [D] (Keras' use_scale weight).");
}
