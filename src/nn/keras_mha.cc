// qkv::nn::KerasMultiHeadAttention: weights, projections, attention over flattened axes.
#include "qkv/nn/keras_mha.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <string>
#include <utility>

#include "nn/keras_masks.h"
#include "nn/layer_attention.h"
#include "qkv/attention.h"
#include "qkv/nn/keras_weights.h"

namespace qkv::nn {

namespace {

constexpr const char* kOp = "KerasMultiHeadAttention";

Tensor glorot(const Shape& shape, uint64_t seed) {
  const int64_t rfs = shape_numel(Shape(shape.begin(), shape.end() - 2));
  const double fan_in = static_cast<double>(shape[shape.size() - 2] * rfs);
  const double fan_out = static_cast<double>(shape.back() * rfs);
  const double a = std::sqrt(6.0 / (fan_in + fan_out));
  return Tensor::uniform(shape, seed, -a, a);
}

// The attended axes of a query of shape `q` (rank R), Keras' default when `given` is empty.
// Keras 3 (_build_attention) reads a < 0 as R + a. It then accepts, and computes something
// else, for axes that are not token axes: 0 attends over the batch, R - 1 (the features) over
// the heads of the projection (and its fused rank-3 path ignores attention_axes altogether);
// it raises for duplicates and axes past R - 1. qkv takes the token axes 1..R-2 and raises
// for every other axis, naming what Keras would do (docs/nn.md).
std::vector<int64_t> attention_axes(const std::vector<int64_t>& given, const Shape& q) {
  const int64_t rank = static_cast<int64_t>(q.size());
  std::vector<int64_t> axes;
  if (given.empty()) {
    for (int64_t a = 1; a < rank - 1; ++a) axes.push_back(a);
    return axes;
  }
  for (int64_t a : given) {
    const int64_t n = a < 0 ? rank + a : a;
    const char* why = n == 0          ? " is the batch axis (Keras 3 would attend over the batch)"
                      : n == rank - 1 ? " is the feature axis (Keras 3 would attend over the heads of the projection)"
                      : n < 0 || n >= rank                      ? " is out of range (Keras 3 reads a < 0 as rank + a)"
                      : std::count(axes.begin(), axes.end(), n) ? " names an axis twice (Keras 3: \"Output character "
                                                                  "appeared more than once\")"
                                                                : nullptr;
    if (why != nullptr) {
      fail<ValueError>(kOp, ": attention axis ", a, " of attention_axes ", shape_str(Shape(given)), why, "; a query ",
                       shape_str(q), " has the token axes 1..", rank - 2, " (or ", 1 - rank, "..-2)");
    }
    axes.push_back(n);
  }
  return axes;
}

// An attention= choice other than softmax (qkv/nn/layer_attention.h) on q [batch.., N, T, kd],
// k [batch.., N, S, kd], v [batch.., N, S, vd] -> [batch.., N, T, vd], after refusing what it
// cannot do. `self`: the key input is the query itself (lsh needs it).
Tensor variant_heads(const KerasMultiHeadAttentionOptions& o, const KerasMultiHeadAttentionConfig& c, bool dropout,
                     const detail::KerasAxes& axes, bool self, const Tensor& q, const Tensor& k, const Tensor& v) {
  detail::refuse_unsupported(
      kOp, o.attention,
      {{o.query_mask.has_value(), "query_mask"},
       {o.value_mask.has_value(), "value_mask"},
       {o.key_mask.has_value(), "key_mask"},
       {o.attention_mask.has_value(), "attention_mask"},
       {c.sliding_window.has_value(), "sliding_window"},
       {o.mods.any(), "mods"},
       {o.return_attention_scores, "return_attention_scores (it has no [T, S] scores)"},
       {dropout, "dropout while training"},
       {o.use_causal_mask && axes.attention.size() != 1, "use_causal_mask over several attention axes"}});
  detail::require_self_attention(kOp, o.attention, self, "value, and key when given, the query itself");
  return detail::variant_attention(o.attention, q, k, v, o.use_causal_mask);
}

}  // namespace

KerasMultiHeadAttention::KerasMultiHeadAttention(const KerasMultiHeadAttentionConfig& config) : config_(config) {
  if (config.num_heads <= 0 || config.key_dim <= 0 || config.value_dim.value_or(1) <= 0) {
    fail<ValueError>(kOp, ": num_heads, key_dim and value_dim must be positive, got ", config.num_heads, ", ",
                     config.key_dim, ", ", config.value_dim.value_or(config.key_dim));
  }
  if (!(config.dropout >= 0 && config.dropout <= 1)) {  // NaN too; Keras' Dropout refuses the same
    fail<ValueError>(kOp, ": dropout must be in [0, 1], got ", config.dropout);
  }
  if (config.sliding_window && *config.sliding_window <= 0) {  // Keras' own check
    fail<ValueError>(kOp, ": sliding_window must be None or a positive integer, got ", *config.sliding_window);
  }
}

std::vector<std::string> keras_mha_weight_names(bool use_bias, bool use_gate) {
  std::vector<std::string> out;
  for (const std::string part : {"query", "key", "gate", "value", "attention_output"}) {
    if (part == "gate" && !use_gate) continue;
    out.push_back(part + "/kernel");
    if (use_bias) out.push_back(part + "/bias");
  }
  return out;
}

void KerasMultiHeadAttention::set_weights(const std::vector<Tensor>& weights) {
  const std::vector<std::string> names = keras_mha_weight_names(config_.use_bias, config_.use_gate);
  if (weights.size() != names.size()) {
    std::string list;
    for (const std::string& name : names) list += (list.empty() ? "" : ", ") + name;
    fail<ValueError>(kOp, ": expected ", names.size(), " weights (get_weights() order: ", list, "), got ",
                     weights.size());
  }
  std::map<std::string, const Tensor*> w;
  for (size_t i = 0; i < names.size(); ++i) w[names[i]] = &weights[i];
  const int64_t n = config_.num_heads, kd = config_.key_dim, vd = config_.value_dim.value_or(kd);
  auto kernel = [&](const std::string& part, int64_t d) {
    const Tensor& k = *w.at(part + "/kernel");
    const std::string what = std::string(kOp) + ": " + part + "/kernel";
    if (k.dim() != 3) fail<ShapeError>(what, ": expected [dim, ", n, ", ", d, "], got ", shape_str(k.shape()));
    return parameter(k, {k.size(0), n, d}, what.c_str());
  };
  auto bias = [&](const std::string& part, const Shape& shape) -> std::optional<Tensor> {
    if (!config_.use_bias) return std::nullopt;
    return parameter(*w.at(part + "/bias"), shape, (std::string(kOp) + ": " + part + "/bias").c_str());
  };
  const Tensor qk = kernel("query", kd), kk = kernel("key", kd), vk = kernel("value", vd);
  const Tensor& ok = *w.at("attention_output/kernel");
  Shape out_shape = config_.output_shape;
  if (out_shape.empty() && ok.dim() >= 3) out_shape.assign(ok.shape().begin() + 2, ok.shape().end());
  Shape ok_shape{n, vd};
  ok_shape.insert(ok_shape.end(), out_shape.begin(), out_shape.end());
  const Tensor okp = parameter(ok, ok_shape, "KerasMultiHeadAttention: attention_output/kernel");
  Linear gate;
  if (config_.use_gate) {
    const Tensor gk = kernel("gate", vd);
    if (gk.size(0) != qk.size(0)) {
      fail<ShapeError>(kOp, ": gate/kernel ", shape_str(gk.shape()), " must take the query's ", qk.size(0),
                       " features (query/kernel ", shape_str(qk.shape()), ")");
    }
    gate = Linear::keras(gk, bias("gate", {n, vd}));
  }
  // Every projection built (and checked) before any is replaced: a bad bias further down left
  // the layer half new, half old.
  Linear query = Linear::keras(qk, bias("query", {n, kd})), key = Linear::keras(kk, bias("key", {n, kd}));
  Linear value = Linear::keras(vk, bias("value", {n, vd}));
  Linear output = Linear::keras(okp, bias("attention_output", out_shape), 2);
  // A quantized layer stays quantized (the new weights in int8, its bits), as
  // MultiheadAttention::load_state_dict re-quantizes: it silently became float32.
  if (quantized()) {
    const int bits = query_.weight_bits();
    for (Linear* l : {&query, &key, &value, &output, &gate}) {
      if (l->defined()) *l = l->quantize_dynamic(bits);
    }
  }
  query_ = query, key_ = key, value_ = value, output_ = output, gate_ = gate;
  config_.output_shape = out_shape;
  weights_.clear();
  for (const Tensor& t : weights) weights_.push_back(t.to(DType::f32).contiguous());
}

void KerasMultiHeadAttention::load_weights(const std::map<std::string, Tensor>& weights, const std::string& layer) {
  const std::map<std::string, Tensor> w = keras_mha_weights(weights, layer);
  if (!config_.use_gate && w.count("gate/kernel")) {
    fail<ValueError>(kOp, ": the weights have a gate (gate/kernel ", shape_str(w.at("gate/kernel").shape()),
                     "): use_gate=True for a layer with one");
  }
  std::vector<Tensor> list;
  for (const std::string& name : keras_mha_weight_names(config_.use_bias, config_.use_gate)) {
    const auto it = w.find(name);
    if (it == w.end()) {
      std::string found;
      for (const auto& [have, t] : w) found += (found.empty() ? "" : ", ") + have + " " + shape_str(t.shape());
      const bool bias = name.ends_with("/bias");
      fail<ValueError>(kOp, ": no weight named \"", name, "\" (or \".../", name, "\"); the layer has ", found,
                       bias                        ? " (use_bias=False for a layer without biases)"
                       : name.starts_with("gate/") ? " (use_gate=False for a layer without a gate)"
                                                   : "");
    }
    list.push_back(it->second);
  }
  set_weights(list);
}

std::vector<Tensor> KerasMultiHeadAttention::get_weights() const { return weights_; }

void KerasMultiHeadAttention::build(int64_t query_dim, int64_t value_dim, int64_t key_dim, uint64_t seed) {
  const AllocationScope scope("KerasMultiHeadAttention.build");  // names it in out-of-memory errors
  const int64_t n = config_.num_heads, kd = config_.key_dim, vd = config_.value_dim.value_or(kd);
  Shape out_shape = config_.output_shape.empty() ? Shape{query_dim} : config_.output_shape;
  Shape ok_shape{n, vd};
  ok_shape.insert(ok_shape.end(), out_shape.begin(), out_shape.end());
  std::vector<Tensor> w{glorot({query_dim, n, kd}, seed), Tensor::zeros({n, kd}), glorot({key_dim, n, kd}, seed + 1),
                        Tensor::zeros({n, kd})};
  if (config_.use_gate) w.insert(w.end(), {glorot({query_dim, n, vd}, seed + 4), Tensor::zeros({n, vd})});
  w.insert(w.end(), {glorot({value_dim, n, vd}, seed + 2), Tensor::zeros({n, vd}), glorot(ok_shape, seed + 3),
                     Tensor::zeros(out_shape)});
  if (!config_.use_bias) {
    std::vector<Tensor> kernels;
    for (size_t i = 0; i < w.size(); i += 2) kernels.push_back(w[i]);
    w = kernels;
  }
  set_weights(w);
}

KerasMultiHeadAttentionResult KerasMultiHeadAttention::forward(const Tensor& query, const Tensor& value,
                                                               const KerasMultiHeadAttentionOptions& options) {
  if (!built()) {
    const Tensor& key = options.key ? *options.key : value;
    build(query.size(-1), value.size(-1), key.size(-1));
  }
  return std::as_const(*this).forward(query, value, options);
}

namespace detail {

KerasAxes keras_axes(const std::vector<int64_t>& given, const Tensor& query, const Tensor& value, const Tensor& key,
                     const char* op) {
  const int64_t rank = query.dim();
  if (rank < 3 || value.dim() != rank || key.dim() != rank) {
    fail<ShapeError>(op, ": query ", shape_str(query.shape()), ", value ", shape_str(value.shape()), " and key ",
                     shape_str(key.shape()), " must have the same rank, at least 3 ([B, T, dim])");
  }
  KerasAxes axes;
  axes.attention = attention_axes(given, query.shape());
  for (int64_t a = 0; a < rank - 1; ++a) {
    if (!std::count(axes.attention.begin(), axes.attention.end(), a)) axes.batch.push_back(a);
  }
  for (int64_t a : axes.batch) {
    if (value.size(a) != query.size(a) || key.size(a) != query.size(a)) {
      fail<ShapeError>(op, ": query ", shape_str(query.shape()), ", value ", shape_str(value.shape()), " and key ",
                       shape_str(key.shape()), " differ on axis ", a, ", which is not an attention axis");
    }
  }
  return axes;
}

// A view when the layout allows, else one copy.
Tensor to_attention_layout(const Tensor& x, int64_t heads, const KerasAxes& axes) {
  Shape split = x.shape();
  const int64_t d = split.back() / heads;
  split.back() = heads;
  split.push_back(d);
  const Tensor v = x.view(split);  // [B, A.., N, D]
  const int64_t rank = v.dim();
  std::vector<int64_t> perm(axes.batch.begin(), axes.batch.end());
  perm.push_back(rank - 2);
  perm.insert(perm.end(), axes.attention.begin(), axes.attention.end());
  perm.push_back(rank - 1);
  const Tensor p = v.permute(perm);  // [batch.., N, attended.., D]
  Shape flat;
  for (int64_t a : axes.batch) flat.push_back(v.size(a));
  flat.push_back(heads);
  int64_t attended = 1;  // not -1: with a batch of 0 the length cannot be inferred (a ValueError)
  for (int64_t a : axes.attention) attended *= v.size(a);
  flat.push_back(attended);
  flat.push_back(d);
  return p.reshape(flat);
}

// Unflatten the attended axes, undo the permutation, merge the heads.
Tensor from_attention_layout(const Tensor& x, const Shape& input, const KerasAxes& axes) {
  const int64_t rank = static_cast<int64_t>(input.size());
  Shape unflat(x.shape().begin(), x.shape().end() - 2);  // [batch.., N]
  for (int64_t a : axes.attention) unflat.push_back(input[static_cast<size_t>(a)]);
  unflat.push_back(x.size(-1));
  std::vector<int64_t> order(axes.batch.begin(), axes.batch.end());
  order.push_back(rank - 1);
  order.insert(order.end(), axes.attention.begin(), axes.attention.end());
  order.push_back(rank);
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i) inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  Shape merged(input.begin(), input.end() - 1);
  merged.push_back(x.size(-3) * x.size(-1));
  return x.contiguous().view(unflat).permute(inverse).reshape(merged);  // [B, A.., N*D]
}

}  // namespace detail

KerasMultiHeadAttentionResult KerasMultiHeadAttention::forward(const Tensor& query, const Tensor& value,
                                                               const KerasMultiHeadAttentionOptions& o) const {
  const std::vector<Shape> inputs{query.shape(), value.shape(), (o.key ? *o.key : value).shape()};
  const AllocationScope scope("KerasMultiHeadAttention.forward", {}, inputs,
                              "query, value, key");  // names it in errors
  if (!built()) fail<ValueError>(kOp, ": the layer has no weights (set_weights, load_weights or build first)");
  const Tensor& key = o.key ? *o.key : value;
  require_cpu(kOp, {&query, &value, &key});
  const int64_t rank = query.dim();
  const detail::KerasAxes axes = detail::keras_axes(config_.attention_axes, query, value, key, kOp);
  const int64_t n = config_.num_heads;
  const Tensor q = detail::to_attention_layout(query_.forward(query), n, axes);  // [batch.., N, T, kd]
  const Tensor k = detail::to_attention_layout(key_.forward(key), n, axes);      // [batch.., N, S, kd]
  const Tensor v = detail::to_attention_layout(value_.forward(value), n, axes);  // [batch.., N, S, vd]
  const bool dropout = training && config_.dropout > 0;
  Tensor out;  // [batch.., N, T, vd]
  std::optional<Tensor> scores;
  if (o.attention.kind != AttentionKind::softmax) {
    out = variant_heads(o, config_, dropout, axes, detail::same_tensor(query, key), q, k, v).contiguous();
  } else {
    AttentionOptions ao;
    ao.attn_mask = detail::keras_attention_mask(query, value, o, axes, config_.sliding_window);  // [mb.., 1, T, S]
    ao.scale = 1.0 / std::sqrt(static_cast<double>(config_.key_dim));
    ao.return_weights = o.return_attention_scores;
    ao.mods = o.mods;
    ao.matmul_precision = o.attention.matmul_precision;
    if (dropout) {
      ao.dropout_p = config_.dropout;
      ao.seed = dropout_seed;
    }
    const AttentionResult r = scaled_dot_product_attention(q, k, v, ao);
    out = r.output.contiguous();
    if (r.weights) scores = r.weights->contiguous();
    // Keras 3 zeroes fully masked rows on its einsum path (scores, dropout or several axes) and
    // averages the values on its fused dot_product_attention path (the rest): follow it.
    const bool keras_fused_path = !o.return_attention_scores && rank == 3 && config_.dropout == 0;
    if (ao.attn_mask && keras_fused_path) detail::fill_fully_masked_rows(*ao.attn_mask, v, out, scores);
  }
  Tensor heads = detail::from_attention_layout(out, query.shape(), axes);                   // [B, A.., N*vd]
  if (config_.use_gate) heads = detail::multiply(heads, detail::keras_gate(gate_, query));  // Keras' use_gate
  Shape out_shape(query.shape().begin(), query.shape().end() - 1);
  out_shape.insert(out_shape.end(), config_.output_shape.begin(), config_.output_shape.end());
  KerasMultiHeadAttentionResult result;
  result.output = output_.forward(heads).view(out_shape);
  if (scores) {
    Shape sshape(out.shape().begin(), out.shape().end() - 2);  // [batch.., N]
    for (int64_t a : axes.attention) sshape.push_back(query.size(a));
    for (int64_t a : axes.attention) sshape.push_back(value.size(a));
    result.scores = scores->view(sshape);
  }
  return result;
}

}  // namespace qkv::nn
