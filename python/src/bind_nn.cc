// qkv._qkv.nn: the attention layers (qkv/nn/*.h). python/qkv/nn.py gives them the
// frameworks' signatures; these classes convert arrays and release the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "args.h"
#include "array_like.h"
#include "interrupt.h"
#include "layer_attention_arg.h"
#include "mods_arg.h"
#include "qkv/kv_cache.h"
#include "qkv/nn/keras_layers.h"
#include "qkv/nn/keras_mha.h"
#include "qkv/nn/keras_weights.h"
#include "qkv/nn/mha.h"
#include "qkv/nn/seed_layers.h"
#include "tensor_convert.h"

namespace nb = nanobind;
using qkv::Tensor;
using qkv::python::to_dict;
using qkv::python::to_numpy;
using qkv::python::to_optional_tensor;
using qkv::python::to_tensor;
using qkv::python::to_tensor_map;

namespace {

// Constructor arguments as Python gave them, converted with messages naming the layer and
// the argument (args.h) instead of nanobind's "incompatible function arguments". Sizes
// take any int64; the layers' own checks (qkv::nn) say which values they refuse.
struct CtorArgs {
  const char* layer;
  int64_t size(nb::handle v, const char* name) const {
    return qkv::python::int_arg(v, qkv::python::arg_name(layer, name), INT64_MIN, INT64_MAX);
  }
  std::optional<int64_t> optional_size(nb::handle v, const char* name) const {
    return qkv::python::optional_int_arg(v, qkv::python::arg_name(layer, name), INT64_MIN, INT64_MAX);
  }
  std::vector<int64_t> sizes(nb::handle v, const char* name) const {
    return qkv::python::int_list_arg(v, qkv::python::arg_name(layer, name), INT64_MIN, INT64_MAX);
  }
  bool flag(nb::handle v, const char* name) const {
    return qkv::python::bool_arg(v, qkv::python::arg_name(layer, name));
  }
  double real(nb::handle v, const char* name) const {
    return qkv::python::float_arg(v, qkv::python::arg_name(layer, name));
  }
  std::optional<double> optional_real(nb::handle v, const char* name) const {
    return qkv::python::optional_float_arg(v, qkv::python::arg_name(layer, name));
  }
  uint64_t seed(nb::handle v) const { return qkv::python::uint64_arg(v, qkv::python::arg_name(layer, "seed")); }
};

nb::object optional_numpy(const std::optional<Tensor>& t) { return t ? to_numpy(*t) : nb::none(); }

// ---- PyTorch flavour ------------------------------------------------------------------------

qkv::nn::MultiheadAttention make_torch(nb::handle embed_dim, nb::handle num_heads, nb::handle dropout, nb::handle bias,
                                       nb::handle add_bias_kv, nb::handle add_zero_attn, nb::handle kdim,
                                       nb::handle vdim, nb::handle batch_first) {
  const CtorArgs a{"MultiheadAttention"};
  qkv::nn::MultiheadAttentionConfig c;
  c.embed_dim = a.size(embed_dim, "embed_dim");
  c.num_heads = a.size(num_heads, "num_heads");
  c.dropout = a.real(dropout, "dropout");
  c.bias = a.flag(bias, "bias");
  c.add_bias_kv = a.flag(add_bias_kv, "add_bias_kv");
  c.add_zero_attn = a.flag(add_zero_attn, "add_zero_attn");
  c.kdim = a.optional_size(kdim, "kdim");
  c.vdim = a.optional_size(vdim, "vdim");
  c.batch_first = a.flag(batch_first, "batch_first");
  return qkv::nn::MultiheadAttention(c);
}

// mha.quantize_static(batches, observer, percentile): each batch an array (self-attention)
// or a (query, key, value) sequence.
qkv::nn::MultiheadAttention quantize_static(const qkv::nn::MultiheadAttention& m, nb::handle batches,
                                            const std::string& observer, double percentile, int weight_bits) {
  constexpr const char* kWhat = "MultiheadAttention.quantize_static";
  qkv::nn::CalibrationOptions options;
  if (observer == "percentile") {
    options.observer = qkv::nn::ActivationObserver::Kind::percentile;
  } else if (observer != "minmax") {
    throw nb::value_error(
        (std::string(kWhat) + ": observer must be 'minmax' or 'percentile', got '" + observer + "'").c_str());
  }
  options.percentile = percentile;
  options.weight_bits = weight_bits;
  std::vector<std::array<Tensor, 3>> tensors;
  size_t i = 0;
  for (nb::handle item : nb::iter(batches)) {
    const std::string name = std::string(kWhat) + ": batches[" + std::to_string(i++) + "]";
    if (nb::isinstance<nb::tuple>(item) || nb::isinstance<nb::list>(item)) {
      const nb::sequence seq = nb::borrow<nb::sequence>(item);
      if (nb::len(seq) != 3) throw nb::value_error((name + " must be an array or (query, key, value)").c_str());
      tensors.push_back({to_tensor(seq[0], (name + "[0]").c_str()), to_tensor(seq[1], (name + "[1]").c_str()),
                         to_tensor(seq[2], (name + "[2]").c_str())});
    } else {
      const Tensor x = to_tensor(item, name.c_str());
      tensors.push_back({x, x, x});
    }
  }
  qkv::python::InterruptibleRelease release;
  return m.quantize_static(tensors, options);
}

// The PyTorch layer's inputs and options as Python gave them: one tensor when query, key and
// value are one object (self-attention), errors naming `op` ("MultiheadAttention",
// "MultiheadAttention.backward") and the argument.
struct TorchCall {
  Tensor q, k, v;
  qkv::nn::MultiheadAttentionOptions o;
};

TorchCall torch_call(const std::string& op, nb::handle query, nb::handle key, nb::handle value,
                     nb::handle key_padding_mask, bool need_weights, nb::handle attn_mask, bool is_causal,
                     nb::handle mods, nb::handle attention, nb::handle attention_options) {
  TorchCall c;
  c.q = to_tensor(query, (op + ": query").c_str());
  c.k = key.is(query) ? c.q : to_tensor(key, (op + ": key").c_str());
  c.v = value.is(key) ? c.k : (value.is(query) ? c.q : to_tensor(value, (op + ": value").c_str()));
  c.o.key_padding_mask = to_optional_tensor(key_padding_mask, (op + ": key_padding_mask").c_str());
  c.o.attn_mask = to_optional_tensor(attn_mask, (op + ": attn_mask").c_str());
  c.o.need_weights = need_weights;
  c.o.is_causal = is_causal;
  c.o.mods = qkv::python::mods_arg(mods, op.c_str());
  c.o.attention = qkv::python::layer_attention_arg(attention, attention_options, op.c_str());
  return c;
}

nb::tuple torch_forward(const qkv::nn::MultiheadAttention& m, nb::handle query, nb::handle key, nb::handle value,
                        nb::handle key_padding_mask, bool need_weights, nb::handle attn_mask, bool average_attn_weights,
                        bool is_causal, nb::handle mods, nb::handle attention, nb::handle attention_options) {
  TorchCall c = torch_call("MultiheadAttention", query, key, value, key_padding_mask, need_weights, attn_mask,
                           is_causal, mods, attention, attention_options);
  c.o.average_attn_weights = average_attn_weights;
  qkv::nn::MultiheadAttentionResult r;
  {
    qkv::python::InterruptibleRelease release;
    r = m.forward(c.q, c.k, c.v, c.o);
  }
  return nb::make_tuple(to_numpy(r.output), optional_numpy(r.weights));
}

// (d_query, d_key, d_value, {parameter name: gradient}) as NumPy arrays.
nb::tuple torch_backward(const qkv::nn::MultiheadAttention& m, nb::handle query, nb::handle key, nb::handle value,
                         nb::handle grad_output, nb::handle key_padding_mask, bool need_weights, nb::handle attn_mask,
                         bool is_causal, nb::handle mods, nb::handle attention, nb::handle attention_options) {
  const TorchCall c = torch_call("MultiheadAttention.backward", query, key, value, key_padding_mask, need_weights,
                                 attn_mask, is_causal, mods, attention, attention_options);
  const Tensor g = to_tensor(grad_output, "MultiheadAttention.backward: grad_output");
  qkv::nn::MultiheadAttentionGradients r;
  {
    qkv::python::InterruptibleRelease release;
    r = m.backward(c.q, c.k, c.v, g, c.o);
  }
  return nb::make_tuple(to_numpy(r.query), to_numpy(r.key), to_numpy(r.value), to_dict(r.params));
}

void bind_torch_flavour(nb::module_& nn) {
  nb::class_<qkv::nn::MultiheadAttention>(nn, "_MultiheadAttention")
      .def(nb::new_(&make_torch), nb::arg("embed_dim").none(), nb::arg("num_heads").none(),
           nb::arg("dropout").none() = 0.0, nb::arg("bias").none() = true, nb::arg("add_bias_kv").none() = false,
           nb::arg("add_zero_attn").none() = false, nb::arg("kdim").none() = nb::none(),
           nb::arg("vdim").none() = nb::none(), nb::arg("batch_first").none() = false)
      .def(
          "load_state_dict",
          [](qkv::nn::MultiheadAttention& m, nb::handle sd, bool strict) {
            const auto tensors = to_tensor_map(sd, "MultiheadAttention.load_state_dict");
            qkv::python::InterruptibleRelease release;
            m.load_state_dict(tensors, strict);
          },
          nb::arg("state_dict"), nb::arg("strict") = true)
      .def("state_dict", [](const qkv::nn::MultiheadAttention& m) { return to_dict(m.state_dict()); })
      .def("forward", &torch_forward, nb::arg("query"), nb::arg("key"), nb::arg("value"),
           nb::arg("key_padding_mask").none() = nb::none(), nb::arg("need_weights") = true,
           nb::arg("attn_mask").none() = nb::none(), nb::arg("average_attn_weights") = true,
           nb::arg("is_causal") = false, nb::arg("mods").none() = nb::none(), nb::arg("attention").none() = nb::none(),
           nb::arg("attention_options").none() = nb::none())
      .def("backward", &torch_backward, nb::arg("query"), nb::arg("key"), nb::arg("value"), nb::arg("grad_output"),
           nb::arg("key_padding_mask").none() = nb::none(), nb::arg("need_weights") = true,
           nb::arg("attn_mask").none() = nb::none(), nb::arg("is_causal") = false, nb::arg("mods").none() = nb::none(),
           nb::arg("attention").none() = nb::none(), nb::arg("attention_options").none() = nb::none())
      .def(
          "forward_cached",
          [](const qkv::nn::MultiheadAttention& m, nb::handle x, qkv::KVCache& cache) {
            const Tensor t = to_tensor(x, "MultiheadAttention.forward: query");
            qkv::nn::MultiheadAttentionResult r;
            {
              qkv::python::InterruptibleRelease release;
              r = m.forward(t, cache);
            }
            return to_numpy(r.output);
          },
          nb::arg("x"), nb::arg("cache"))
      .def("quantized_state_dict",
           [](const qkv::nn::MultiheadAttention& m) { return to_dict(m.quantized_state_dict()); })
      .def(
          "from_quantized",
          [](const qkv::nn::MultiheadAttention& m, nb::handle sd) {  // m: a layer of the config to load into
            return qkv::nn::MultiheadAttention::from_quantized_state_dict(
                m.config(), to_tensor_map(sd, "MultiheadAttention.from_quantized_state_dict"));
          },
          nb::arg("state_dict"))
      .def("quantize_dynamic", &qkv::nn::MultiheadAttention::quantize_dynamic, nb::arg("weight_bits") = 0)
      .def("quantize_static", &quantize_static, nb::arg("batches"), nb::arg("observer") = "minmax",
           nb::arg("percentile") = 99.99, nb::arg("weight_bits") = 0)
      .def_prop_ro("quantized", &qkv::nn::MultiheadAttention::quantized)
      .def_prop_ro("weight_bits", &qkv::nn::MultiheadAttention::weight_bits)
      .def_rw("training", &qkv::nn::MultiheadAttention::training)
      .def_rw("dropout_seed", &qkv::nn::MultiheadAttention::dropout_seed);
  nn.def("_int8_weight_bits", [] { return qkv::nn::int8_weight_bits(0, "int8_weight_bits"); });
  nn.def(
      "_mha_state_dict",
      [](nb::handle d, const std::string& prefix) {
        return to_dict(qkv::nn::mha_state_dict(to_tensor_map(d, "MultiheadAttention.from_state_dict"), prefix));
      },
      nb::arg("state_dict"), nb::arg("prefix") = "");
}

// ---- Keras flavour ----------------------------------------------------------------------------

qkv::nn::KerasMultiHeadAttention make_keras(nb::handle num_heads, nb::handle key_dim, nb::handle value_dim,
                                            nb::handle use_bias, nb::handle output_shape, nb::handle attention_axes,
                                            nb::handle dropout, nb::handle sliding_window, nb::handle use_gate) {
  const CtorArgs a{"KerasMultiHeadAttention"};
  qkv::nn::KerasMultiHeadAttentionConfig c;
  c.num_heads = a.size(num_heads, "num_heads");
  c.key_dim = a.size(key_dim, "key_dim");
  c.value_dim = a.optional_size(value_dim, "value_dim");
  c.use_bias = a.flag(use_bias, "use_bias");
  c.output_shape = a.sizes(output_shape, "output_shape");
  c.attention_axes = a.sizes(attention_axes, "attention_axes");
  c.dropout = a.real(dropout, "dropout");
  c.sliding_window = a.optional_size(sliding_window, "sliding_window");
  c.use_gate = a.flag(use_gate, "use_gate");
  return qkv::nn::KerasMultiHeadAttention(c);
}

// The call's keywords past use_causal_mask: mods, attention, attention_options.
struct KerasExtras {
  nb::handle mods, attention, attention_options;
};

qkv::nn::KerasMultiHeadAttentionOptions keras_options(nb::handle key, nb::handle query_mask, nb::handle value_mask,
                                                      nb::handle key_mask, nb::handle attention_mask,
                                                      bool return_attention_scores, bool use_causal_mask,
                                                      const KerasExtras& extras, const char* op) {
  qkv::nn::KerasMultiHeadAttentionOptions o;
  o.mods = qkv::python::mods_arg(extras.mods, op);
  o.attention = qkv::python::layer_attention_arg(extras.attention, extras.attention_options, op);
  o.key = to_optional_tensor(key, "KerasMultiHeadAttention: key");
  o.query_mask = to_optional_tensor(query_mask, "KerasMultiHeadAttention: query_mask");
  o.value_mask = to_optional_tensor(value_mask, "KerasMultiHeadAttention: value_mask");
  o.key_mask = to_optional_tensor(key_mask, "KerasMultiHeadAttention: key_mask");
  o.attention_mask = to_optional_tensor(attention_mask, "KerasMultiHeadAttention: attention_mask");
  o.return_attention_scores = return_attention_scores;
  o.use_causal_mask = use_causal_mask;
  return o;
}

nb::object keras_call(qkv::nn::KerasMultiHeadAttention& m, nb::handle query, nb::handle value, nb::handle key,
                      nb::handle query_mask, nb::handle value_mask, nb::handle key_mask, nb::handle attention_mask,
                      bool return_attention_scores, bool use_causal_mask, nb::handle mods, nb::handle attention,
                      nb::handle attention_options) {
  const Tensor q = to_tensor(query, "KerasMultiHeadAttention: query");
  const Tensor v = value.is(query) ? q : to_tensor(value, "KerasMultiHeadAttention: value");
  qkv::nn::KerasMultiHeadAttentionOptions o =
      keras_options(key, query_mask, value_mask, key_mask, attention_mask, return_attention_scores, use_causal_mask,
                    {mods, attention, attention_options}, "KerasMultiHeadAttention");
  if (key.is(query)) o.key = q;  // one tensor: self-attention, as attention='lsh' needs
  qkv::nn::KerasMultiHeadAttentionResult r;
  {
    qkv::python::InterruptibleRelease release;
    r = m.forward(q, v, o);
  }
  if (!return_attention_scores) return to_numpy(r.output);
  return nb::make_tuple(to_numpy(r.output), to_numpy(*r.scores));
}

// (d_query, d_value, d_key or None, {Keras weight name: gradient}) as NumPy arrays.
nb::tuple keras_backward(const qkv::nn::KerasMultiHeadAttention& m, nb::handle query, nb::handle value,
                         nb::handle grad_output, nb::handle key, nb::handle query_mask, nb::handle value_mask,
                         nb::handle key_mask, nb::handle attention_mask, bool return_attention_scores,
                         bool use_causal_mask, nb::handle mods, nb::handle attention, nb::handle attention_options) {
  const Tensor q = to_tensor(query, "KerasMultiHeadAttention.backward: query");
  const Tensor v = value.is(query) ? q : to_tensor(value, "KerasMultiHeadAttention.backward: value");
  const Tensor g = to_tensor(grad_output, "KerasMultiHeadAttention.backward: grad_output");
  const qkv::nn::KerasMultiHeadAttentionOptions o =
      keras_options(key, query_mask, value_mask, key_mask, attention_mask, return_attention_scores, use_causal_mask,
                    {mods, attention, attention_options}, "KerasMultiHeadAttention.backward");
  qkv::nn::KerasMultiHeadAttentionGradients r;
  {
    qkv::python::InterruptibleRelease release;
    r = m.backward(q, v, g, o);
  }
  return nb::make_tuple(to_numpy(r.query), to_numpy(r.value), r.key ? nb::object(to_numpy(*r.key)) : nb::none(),
                        to_dict(r.weights));
}

void bind_keras_flavour(nb::module_& nn) {
  nb::class_<qkv::nn::KerasMultiHeadAttention>(nn, "_KerasMultiHeadAttention")
      .def(nb::new_(&make_keras), nb::arg("num_heads").none(), nb::arg("key_dim").none(),
           nb::arg("value_dim").none() = nb::none(), nb::arg("use_bias").none() = true,
           nb::arg("output_shape").none() = nb::none(), nb::arg("attention_axes").none() = nb::none(),
           nb::arg("dropout").none() = 0.0, nb::arg("sliding_window").none() = nb::none(),
           nb::arg("use_gate").none() = false)
      .def("quantize_dynamic", &qkv::nn::KerasMultiHeadAttention::quantize_dynamic, nb::arg("weight_bits") = 0)
      .def_prop_ro("quantized", &qkv::nn::KerasMultiHeadAttention::quantized)
      .def("set_weights",
           [](qkv::nn::KerasMultiHeadAttention& m, nb::handle weights) {
             std::vector<Tensor> ws;
             for (nb::handle w : weights) ws.push_back(to_tensor(w, "KerasMultiHeadAttention.set_weights"));
             m.set_weights(ws);
           })
      .def(
          "load_weights",
          [](qkv::nn::KerasMultiHeadAttention& m, nb::handle d, const std::string& layer) {
            m.load_weights(to_tensor_map(d, "KerasMultiHeadAttention.load_weights"), layer);
          },
          nb::arg("weights"), nb::arg("layer") = "")
      .def("get_weights",
           [](const qkv::nn::KerasMultiHeadAttention& m) {
             nb::list out;
             for (const Tensor& w : m.get_weights()) out.append(to_numpy(w));
             return out;
           })
      .def("build", &qkv::nn::KerasMultiHeadAttention::build, nb::arg("query_dim"), nb::arg("value_dim"),
           nb::arg("key_dim"), nb::arg("seed") = 0)
      .def_prop_ro("built", &qkv::nn::KerasMultiHeadAttention::built)
      .def("forward", &keras_call, nb::arg("query"), nb::arg("value"), nb::arg("key").none() = nb::none(),
           nb::arg("query_mask").none() = nb::none(), nb::arg("value_mask").none() = nb::none(),
           nb::arg("key_mask").none() = nb::none(), nb::arg("attention_mask").none() = nb::none(),
           nb::arg("return_attention_scores") = false, nb::arg("use_causal_mask") = false,
           nb::arg("mods").none() = nb::none(), nb::arg("attention").none() = nb::none(),
           nb::arg("attention_options").none() = nb::none())
      .def("backward", &keras_backward, nb::arg("query"), nb::arg("value"), nb::arg("grad_output"),
           nb::arg("key").none() = nb::none(), nb::arg("query_mask").none() = nb::none(),
           nb::arg("value_mask").none() = nb::none(), nb::arg("key_mask").none() = nb::none(),
           nb::arg("attention_mask").none() = nb::none(), nb::arg("return_attention_scores") = false,
           nb::arg("use_causal_mask") = false, nb::arg("mods").none() = nb::none(),
           nb::arg("attention").none() = nb::none(), nb::arg("attention_options").none() = nb::none())
      .def_rw("training", &qkv::nn::KerasMultiHeadAttention::training)
      .def_rw("dropout_seed", &qkv::nn::KerasMultiHeadAttention::dropout_seed);
  // One MHA layer's weights out of qkv.load's dict of any weight file, and the config they imply.
  nn.def(
      "_keras_mha_weights",
      [](nb::handle d, const std::string& layer) {
        const auto w = qkv::nn::keras_mha_weights(to_tensor_map(d, "KerasMultiHeadAttention.from_weights"), layer);
        const qkv::nn::KerasMultiHeadAttentionConfig c = qkv::nn::keras_mha_config(w);
        nb::dict config;
        config["num_heads"] = c.num_heads;
        config["key_dim"] = c.key_dim;
        config["value_dim"] = c.value_dim ? nb::cast(*c.value_dim) : nb::none();
        config["use_bias"] = c.use_bias;
        config["use_gate"] = c.use_gate;
        config["output_shape"] = c.output_shape.empty() ? nb::none() : nb::cast(c.output_shape);
        return nb::make_tuple(to_dict(w), config);
      },
      nb::arg("weights"), nb::arg("layer") = "");
  // The one Keras <-> PyTorch conversion (qkv/nn/keras_layers.h), as `qkv convert` runs it.
  nn.def(
      "_keras_to_torch",
      [](nb::handle d) {
        return to_dict(qkv::nn::keras_to_torch(qkv::nn::keras_layer_weights(to_tensor_map(d, "keras_to_torch"))));
      },
      nb::arg("weights"));
  nn.def(
      "_torch_to_keras",
      [](nb::handle d, int64_t num_heads) {
        std::map<std::string, Tensor> paths;  // "<layer>/query/kernel": what from_weights takes
        for (const auto& [layer, w] : qkv::nn::torch_to_keras(to_tensor_map(d, "torch_to_keras"), num_heads)) {
          for (const auto& [name, t] : w) paths[layer + "/" + name] = t;
        }
        return to_dict(paths);
      },
      nb::arg("state_dict"), nb::arg("num_heads"));
}

// ---- seed flavours -------------------------------------------------------------------------------

template <class Layer>
void bind_state(nb::class_<Layer>& c) {
  c.def("load_state_dict", [](Layer& m, nb::handle sd) {
     m.load_state_dict(to_tensor_map(sd, "load_state_dict"));
   }).def("state_dict", [](const Layer& m) { return to_dict(m.state_dict()); });
}

// __call__(x, mask=None) of the seed layers whose forward is forward(x, mask); errors
// name the layer and the argument.
template <class Layer>
auto self_attention_call(std::string layer) {
  return [layer](const Layer& m, nb::handle x, nb::handle mask, nb::handle cache) {
    const Tensor t = to_tensor(x, (layer + ": x").c_str());
    const auto mk = to_optional_tensor(mask, (layer + ": mask").c_str());
    if (!cache.is_none() && mk) {
      throw nb::value_error((layer + ": with a cache the attention is causal; pass no mask").c_str());
    }
    Tensor r;
    if (!cache.is_none()) {
      qkv::KVCache& c = nb::cast<qkv::KVCache&>(cache);
      qkv::python::InterruptibleRelease release;
      r = m.forward(t, c);
    } else {
      qkv::python::InterruptibleRelease release;
      r = m.forward(t, mk);
    }
    return qkv::python::to_array_like(r, x);
  };
}

// backward(x, grad_output, mask=None) -> (d x, {parameter name: gradient}) as NumPy arrays.
template <class Layer>
auto self_attention_backward(std::string layer) {
  return [op = layer + ".backward"](const Layer& m, nb::handle x, nb::handle grad_output, nb::handle mask) {
    const Tensor t = to_tensor(x, (op + ": x").c_str());
    const Tensor g = to_tensor(grad_output, (op + ": grad_output").c_str());
    const auto mk = to_optional_tensor(mask, (op + ": mask").c_str());
    qkv::nn::SelfAttentionGradients r;
    {
      qkv::python::InterruptibleRelease release;
      r = m.backward(t, g, mk);
    }
    return nb::make_tuple(to_numpy(r.x), to_dict(r.params));
  };
}

// backward(q, k, v, grad_output) -> (d q, d k, d v, {parameter name: gradient}) as NumPy arrays.
template <class Layer>
auto qkv_layer_backward(std::string layer) {
  return [op = layer + ".backward"](const Layer& m, nb::handle q, nb::handle k, nb::handle v, nb::handle grad_output) {
    const Tensor tq = to_tensor(q, (op + ": q").c_str()), tk = to_tensor(k, (op + ": k").c_str()),
                 tv = to_tensor(v, (op + ": v").c_str());
    const Tensor g = to_tensor(grad_output, (op + ": grad_output").c_str());
    qkv::nn::MultiheadAttentionGradients r;
    {
      qkv::python::InterruptibleRelease release;
      r = m.backward(tq, tk, tv, g);
    }
    return nb::make_tuple(to_numpy(r.query), to_numpy(r.key), to_numpy(r.value), to_dict(r.params));
  };
}

// Seed 000: SelfAttention and MultiHeadSelfAttention (x -> x).
void bind_seed000(nb::module_& nn) {
  using namespace qkv::nn;
  nb::class_<SelfAttention> sa(nn, "SelfAttention", "Seed 000's single-head self-attention (to_qvk, no bias).");
  sa.def(
        "__init__",
        [](SelfAttention* self, nb::handle dim, nb::handle seed) {
          const CtorArgs a{"SelfAttention"};
          new (self) SelfAttention(a.size(dim, "dim"), a.seed(seed));
        },
        nb::arg("dim").none(), nb::arg("seed").none() = 0,
        nb::sig("def __init__(self, dim: int, seed: int = 0) -> None"))
      .def("__call__", self_attention_call<SelfAttention>("SelfAttention"), nb::arg("x"),
           nb::arg("mask").none() = nb::none(), nb::arg("cache").none() = nb::none(),
           "forward(x, mask); with cache=qkv.KVCache [B, 1, capacity, dim]: causal self-attention of the new\n"
           "tokens x against the cache (appended first; prefill, then decode token by token; docs/decode.md).")
      .def("backward", self_attention_backward<SelfAttention>("SelfAttention"), nb::arg("x"), nb::arg("grad_output"),
           nb::arg("mask").none() = nb::none(),
           "(d x, {state_dict name: gradient}) of sum(forward(x, mask) * grad_output).");
  bind_state(sa);
  nb::class_<MultiHeadSelfAttention> mh(nn, "MultiHeadSelfAttention",
                                        "Seed 000's MHSA: to_qvk 'b t (d k h) -> k b h t d', W_0.");
  mh.def(
        "__init__",
        [](MultiHeadSelfAttention* self, nb::handle dim, nb::handle heads, nb::handle dim_head, nb::handle seed) {
          const CtorArgs a{"MultiHeadSelfAttention"};
          new (self) MultiHeadSelfAttention(a.size(dim, "dim"), a.size(heads, "heads"),
                                            a.optional_size(dim_head, "dim_head"), a.seed(seed));
        },
        nb::arg("dim").none(), nb::arg("heads").none() = 8, nb::arg("dim_head").none() = nb::none(),
        nb::arg("seed").none() = 0,
        nb::sig("def __init__(self, dim: int, heads: int = 8, dim_head: int | None = None, seed: int = 0) -> None"))
      .def("__call__", self_attention_call<MultiHeadSelfAttention>("MultiHeadSelfAttention"), nb::arg("x"),
           nb::arg("mask").none() = nb::none(), nb::arg("cache").none() = nb::none(),
           "forward(x, mask); with cache=qkv.KVCache [B, heads, capacity, dim_head]: causal self-attention of\n"
           "the new tokens x against the cache (appended first; docs/decode.md).")
      .def("backward", self_attention_backward<MultiHeadSelfAttention>("MultiHeadSelfAttention"), nb::arg("x"),
           nb::arg("grad_output"), nb::arg("mask").none() = nb::none(),
           "(d x, {state_dict name: gradient}) of sum(forward(x, mask) * grad_output).");
  bind_state(mh);
}

// Seeds 003 and 004: layers called with (q, k, v).
void bind_seed003_004(nb::module_& nn) {
  using namespace qkv::nn;
  nb::class_<SeparateHeadsAttention> sh(nn, "SeparateHeadsAttention",
                                        "Seed 003's layer: Dkq != Dv, scale, causal; returns (output, scores).");
  sh.def(
        "__init__",
        [](SeparateHeadsAttention* self, nb::handle embed_dim, nb::handle n_heads, nb::handle d_kq, nb::handle d_v,
           nb::handle scale, nb::handle causal, nb::handle seed) {
          const CtorArgs a{"SeparateHeadsAttention"};
          new (self) SeparateHeadsAttention(a.size(embed_dim, "embed_dim"), a.size(n_heads, "n_heads"),
                                            a.optional_size(d_kq, "d_kq"), a.optional_size(d_v, "d_v"),
                                            a.optional_real(scale, "scale"), a.flag(causal, "causal"), a.seed(seed));
        },
        nb::arg("embed_dim").none(), nb::arg("n_heads").none(), nb::arg("d_kq").none() = nb::none(),
        nb::arg("d_v").none() = nb::none(), nb::arg("scale").none() = nb::none(), nb::arg("causal").none() = false,
        nb::arg("seed").none() = 0,
        nb::sig("def __init__(self, embed_dim: int, n_heads: int, d_kq: int | None = None, d_v: int | None = None, "
                "scale: float | None = None, causal: bool = False, seed: int = 0) -> None"))
      .def(
          "__call__",
          [](const SeparateHeadsAttention& m, nb::handle q, nb::handle k, nb::handle v, nb::handle cache) {
            const Tensor tq = to_tensor(q, "SeparateHeadsAttention: q");
            if (!cache.is_none()) {  // self-attention of new tokens against the cache: (output, None)
              if (!k.is(q) || !v.is(q)) {
                throw nb::value_error("SeparateHeadsAttention: with a cache, k and v must be q itself");
              }
              qkv::KVCache& c = nb::cast<qkv::KVCache&>(cache);
              Tensor out;
              {
                qkv::python::InterruptibleRelease release;
                out = m.forward(tq, c);
              }
              return nb::make_tuple(qkv::python::to_array_like(out, q), nb::none());
            }
            const Tensor tk = to_tensor(k, "SeparateHeadsAttention: k");
            const Tensor tv = to_tensor(v, "SeparateHeadsAttention: v");
            SeparateHeadsAttentionResult r;
            {
              qkv::python::InterruptibleRelease release;
              r = m.forward(tq, tk, tv);
            }
            return nb::make_tuple(qkv::python::to_array_like(r.output, q), qkv::python::to_array_like(r.scores, q));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("cache").none() = nb::none(),
          "(output, scores); with cache=qkv.KVCache [B, H, capacity, d_kq] (value_dim d_v) and k, v the\n"
          "array q: a causal layer's self-attention of the new tokens against the cache, (output, None).")
      .def("backward", qkv_layer_backward<SeparateHeadsAttention>("SeparateHeadsAttention"), nb::arg("q"), nb::arg("k"),
           nb::arg("v"), nb::arg("grad_output"),
           "(d q, d k, d v, {state_dict name: gradient}); grad_output is the output's (scores not differentiated).");
  bind_state(sh);
  nb::class_<LazyMultiHeadAttention> lz(nn, "LazyMultiHeadAttention",
                                        "Seed 004's layer: LazyLinear q/k/v projections fixed at the first call.");
  lz.def(
        "__init__",
        [](LazyMultiHeadAttention* self, nb::handle hidden, nb::handle heads, nb::handle seed) {
          const CtorArgs a{"LazyMultiHeadAttention"};
          new (self) LazyMultiHeadAttention(a.size(hidden, "hidden"), a.size(heads, "heads"), a.seed(seed));
        },
        nb::arg("hidden").none(), nb::arg("heads").none(), nb::arg("seed").none() = 0,
        nb::sig("def __init__(self, hidden: int, heads: int, seed: int = 0) -> None"))
      .def(
          "__call__",
          [](LazyMultiHeadAttention& m, nb::handle q, nb::handle k, nb::handle v) {
            const Tensor tq = to_tensor(q, "LazyMultiHeadAttention: q");
            const Tensor tk = to_tensor(k, "LazyMultiHeadAttention: k");
            const Tensor tv = to_tensor(v, "LazyMultiHeadAttention: v");
            Tensor r;
            {
              qkv::python::InterruptibleRelease release;
              r = m.forward(tq, tk, tv);
            }
            return qkv::python::to_array_like(r, q);
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"))
      .def("backward", qkv_layer_backward<LazyMultiHeadAttention>("LazyMultiHeadAttention"), nb::arg("q"), nb::arg("k"),
           nb::arg("v"), nb::arg("grad_output"), "(d q, d k, d v, {state_dict name: gradient}).")
      .def_prop_ro("materialized", &LazyMultiHeadAttention::materialized);
  bind_state(lz);
}

}  // namespace

void bind_training(nb::module_& nn);  // bind_training.cc

void bind_nn(nb::module_& m) {
  nb::module_ nn = m.def_submodule("nn", "Attention layers: PyTorch, Keras and the seed articles' flavours");
  bind_torch_flavour(nn);
  bind_training(nn);
  bind_keras_flavour(nn);
  bind_seed000(nn);
  bind_seed003_004(nn);
}
