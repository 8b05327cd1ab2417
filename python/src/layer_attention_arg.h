// The attention= / attention_options= keyword arguments of qkv.nn's layers as a
// qkv::nn::LayerAttention (qkv/nn/layer_attention.h).
#pragma once

#include <nanobind/nanobind.h>

#include "qkv/nn/layer_attention.h"

namespace qkv::python {

// kind: None or "softmax", "linear", "performer" (linear with feature_map "favor"), "lsh";
// options: None or a dict of the standalone function's keyword arguments (qkv.attention.linear:
// is_causal, feature_map, num_features, seed, chunk; qkv.attention.lsh: n_hashes, n_buckets,
// chunk_length, num_chunks_before, num_chunks_after, is_causal, rotations, seed, attention_mask).
// ValueError naming `op` for an unknown kind or key, or options with softmax.
nn::LayerAttention layer_attention_arg(nanobind::handle kind, nanobind::handle options, const char* op);

}  // namespace qkv::python
