// layer_attention_arg (layer_attention_arg.h).
#include "layer_attention_arg.h"

#include <nanobind/stl/string.h>

#include <cstdint>
#include <limits>
#include <string>

#include "args.h"
#include "tensor_convert.h"

namespace qkv::python {

namespace nb = nanobind;

namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

void set_linear(LinearAttentionOptions& o, const std::string& key, nb::handle value, const std::string& what) {
  if (key == "is_causal") {
    o.is_causal = bool_arg(value, what);
  } else if (key == "feature_map") {
    const std::string map = str_arg(value, what);
    if (map != "elu" && map != "favor")
      throw nb::value_error((what + " must be 'elu' or 'favor', got '" + map + "'").c_str());
    o.feature_map = map == "favor" ? LinearFeatureMap::favor : LinearFeatureMap::elu;
  } else if (key == "num_features") {
    o.num_features = int_arg(value, what, 0, kMax);
  } else if (key == "seed") {
    o.seed = uint64_arg(value, what);
  } else if (key == "chunk") {
    o.chunk = int_arg(value, what, 1, kMax);
  } else {
    throw nb::value_error((what + ": no such option of linear attention (is_causal, feature_map, num_features, seed, "
                                  "chunk: qkv.attention.linear's keywords)")
                              .c_str());
  }
}

void set_lsh(LshAttentionOptions& o, const std::string& key, nb::handle value, const std::string& what) {
  if (key == "n_hashes") {
    o.n_hashes = int_arg(value, what, 1, kMax);
  } else if (key == "n_buckets") {
    o.n_buckets = int_list_arg(value, what, 2, kMax);
  } else if (key == "chunk_length") {
    o.chunk_length = int_arg(value, what, 1, kMax);
  } else if (key == "num_chunks_before") {
    o.num_chunks_before = int_arg(value, what, 0, kMax);
  } else if (key == "num_chunks_after") {
    o.num_chunks_after = int_arg(value, what, 0, kMax);
  } else if (key == "is_causal") {
    o.is_causal = bool_arg(value, what);
  } else if (key == "rotations") {
    if (auto r = to_optional_tensor(value, what.c_str())) o.rotations = *r;
  } else if (key == "seed") {
    o.seed = uint64_arg(value, what);
  } else if (key == "attention_mask") {
    if (auto m = to_optional_tensor(value, what.c_str())) o.attention_mask = *m;
  } else {
    throw nb::value_error((what + ": no such option of LSH attention (n_hashes, n_buckets, chunk_length, "
                                  "num_chunks_before, num_chunks_after, is_causal, rotations, seed, attention_mask: "
                                  "qkv.attention.lsh's keywords)")
                              .c_str());
  }
}

}  // namespace

nn::LayerAttention layer_attention_arg(nb::handle kind, nb::handle options, const char* op) {
  const std::string name = kind.is_none() ? "softmax" : str_arg(kind, arg_name(op, "attention"));
  nn::LayerAttention a;
  if (name == "linear") {
    a = nn::LayerAttention::linear_attention();
  } else if (name == "performer") {
    a = nn::LayerAttention::performer();
  } else if (name == "lsh") {
    a = nn::LayerAttention::lsh_attention();
  } else if (name != "softmax") {
    throw nb::value_error(
        (arg_name(op, "attention") + " must be 'softmax', 'linear', 'performer' or 'lsh', got '" + name + "'").c_str());
  }
  if (options.is_none()) return a;
  if (!nb::isinstance<nb::dict>(options)) {
    throw nb::type_error((arg_name(op, "attention_options") + " must be a dict or None").c_str());
  }
  for (auto [k, v] : nb::cast<nb::dict>(options)) {
    const std::string key = str_arg(k, arg_name(op, "attention_options key"));
    const std::string what = arg_name(op, ("attention_options['" + key + "']").c_str());
    if (a.kind == nn::AttentionKind::softmax) {
      if (key != "matmul_precision") {
        throw nb::value_error((what + ": the softmax attention takes only matmul_precision here (its masks, "
                                      "dropout and mods are the layer's own arguments)")
                                  .c_str());
      }
      a.matmul_precision = matmul_precision_from_name(str_arg(v, what), what);
    } else if (a.kind == nn::AttentionKind::lsh) {
      set_lsh(a.lsh, key, v, what);
    } else {
      set_linear(a.linear, key, v, what);
    }
  }
  return a;
}

}  // namespace qkv::python
