// Tensor-parallel attention over MPI (qkv/dist/tensor_parallel_mha.h).
#include "qkv/dist/tensor_parallel_mha.h"

#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dist/internal.h"
#include "nn/heads.h"
#include "qkv/attention.h"
#include "qkv/device.h"
#include "qkv/dist/shard.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

const Tensor& require(const std::map<std::string, Tensor>& state, const std::string& name, const char* op) {
  const auto it = state.find(name);
  if (it == state.end()) fail<ValueError>(op, ": the state_dict has no '", name, "'");
  return it->second;
}

std::optional<Tensor> optional_entry(const std::map<std::string, Tensor>& state, const std::string& name) {
  const auto it = state.find(name);
  if (it == state.end()) return std::nullopt;
  return it->second;
}

// Rows [first, first + n) of a [rows, ...] tensor (a view), or of an optional bias.
Tensor rows(const Tensor& t, int64_t first, int64_t n) { return t.slice(0, first, first + n); }
std::optional<Tensor> rows(const std::optional<Tensor>& t, int64_t first, int64_t n) {
  if (!t) return std::nullopt;
  return t->slice(0, first, first + n);
}

// Llama / Hugging Face names: q_proj.weight, k_proj.weight, v_proj.weight, o_proj.weight and
// their optional ".bias" (biases keyed "q", "k", "v", "o" as load() takes them).
struct Projections {
  Tensor wq, wk, wv, wo;
  std::map<std::string, std::optional<Tensor>> biases;
};

Projections projections_of(const std::map<std::string, Tensor>& state, const char* op) {
  return {require(state, "q_proj.weight", op),
          require(state, "k_proj.weight", op),
          require(state, "v_proj.weight", op),
          require(state, "o_proj.weight", op),
          {{"q", optional_entry(state, "q_proj.bias")},
           {"k", optional_entry(state, "k_proj.bias")},
           {"v", optional_entry(state, "v_proj.bias")},
           {"o", optional_entry(state, "o_proj.bias")}}};
}

}  // namespace

TensorParallelAttention::TensorParallelAttention(const TensorParallelAttentionConfig& config, const Communicator& comm)
    : config_(config), comm_(comm) {
  TensorParallelAttentionConfig& c = config_;
  if (c.num_kv_heads == 0) c.num_kv_heads = c.num_heads;
  if (c.head_dim == 0 && c.num_heads > 0) c.head_dim = c.embed_dim / c.num_heads;
  if (c.embed_dim < 1 || c.num_heads < 1 || c.num_kv_heads < 1 || c.head_dim < 1 || c.num_heads % c.num_kv_heads != 0) {
    fail<ValueError>("TensorParallelAttention: embed_dim ", c.embed_dim, ", num_heads ", c.num_heads, ", num_kv_heads ",
                     c.num_kv_heads, ", head_dim ", c.head_dim, " (positive; num_heads a multiple of num_kv_heads)");
  }
  const int64_t g = c.num_heads / c.num_kv_heads;
  const int p = comm.size(), r = comm.rank();
  if (c.num_kv_heads >= p) {  // split the key/value heads; query heads follow their groups
    const Chunk kv = split_part(c.num_kv_heads, p, r);
    k0_ = kv.start;
    hk_local_ = kv.length;
    q0_ = k0_ * g;
    hq_local_ = hk_local_ * g;
  } else {  // split the query heads; replicate the key/value heads they use
    const Chunk qs = split_part(c.num_heads, p, r);
    q0_ = qs.start;
    hq_local_ = qs.length;
    k0_ = q0_ / g;
    hk_local_ = hq_local_ == 0 ? 0 : (q0_ + hq_local_ - 1) / g - k0_ + 1;
  }
}

void TensorParallelAttention::load(const Tensor& wq, const Tensor& wk, const Tensor& wv, const Tensor& wo,
                                   const std::map<std::string, std::optional<Tensor>>& biases) {
  const int64_t d = config_.head_dim, e = config_.embed_dim, hq = config_.num_heads, hk = config_.num_kv_heads;
  if (wq.dim() != 2 || wq.size(0) != hq * d || wq.size(1) != e || wk.dim() != 2 || wk.size(0) != hk * d ||
      wv.dim() != 2 || wv.size(0) != hk * d || wo.dim() != 2 || wo.size(0) != e || wo.size(1) != hq * d) {
    fail<ShapeError>("TensorParallelAttention: weights q ", shape_str(wq.shape()), ", k ", shape_str(wk.shape()),
                     ", v ", shape_str(wv.shape()), ", o ", shape_str(wo.shape()), " for embed_dim ", e, ", ", hq,
                     " heads, ", hk, " key/value heads of ", d);
  }
  q_ = nn::Linear::torch(rows(wq, q0_ * d, hq_local_ * d), rows(biases.at("q"), q0_ * d, hq_local_ * d));
  k_ = nn::Linear::torch(rows(wk, k0_ * d, hk_local_ * d), rows(biases.at("k"), k0_ * d, hk_local_ * d));
  v_ = nn::Linear::torch(rows(wv, k0_ * d, hk_local_ * d), rows(biases.at("v"), k0_ * d, hk_local_ * d));
  o_ = nn::Linear::torch(wo.slice(1, q0_ * d, (q0_ + hq_local_) * d), std::nullopt);
  o_bias_ = biases.at("o");
}

CallSignature TensorParallelAttention::signature() const {
  CallSignature sig;
  sig.value("embed_dim", config_.embed_dim)
      .value("num_heads", config_.num_heads)
      .value("num_kv_heads", config_.num_kv_heads)
      .value("head_dim", config_.head_dim)
      .value("batch_first", config_.batch_first);
  return sig.tensor("o_proj.bias", o_bias_);
}

namespace {

// Collective: `build` makes this rank's share of a layer (and throws when its arguments do not
// fit) with its signature(); the ranks agree on the layers' configurations and on `state` (every rank must pass the
// same whole state_dict: its entries' shapes and a sample of their values), so that a rank that
// refused its weights, or holds other ones, stops every rank here instead of leaving them
// waiting in forward's first collective.
template <class Layer, class Build>
Layer agreed_layer(const char* op, const Communicator& comm, const std::map<std::string, Tensor>* state,
                   Build&& build) {
  std::optional<Layer> layer;
  agree_on_call(op, comm, [&] {
    auto [built, sig] = build();
    layer.emplace(std::move(built));
    if (state) {
      for (const auto& [name, t] : *state) sig.sample(name.c_str(), t);
    }
    return sig;
  });
  return std::move(*layer);
}

}  // namespace

TensorParallelAttention TensorParallelAttention::from_torch_mha(const nn::MultiheadAttentionConfig& config,
                                                                const std::map<std::string, Tensor>& state,
                                                                const Communicator& comm) {
  const char* op = "TensorParallelAttention::from_torch_mha";
  return agreed_layer<TensorParallelAttention>(op, comm, &state, [&] {
    if (config.add_bias_kv || config.add_zero_attn) fail<ValueError>(op, ": add_bias_kv / add_zero_attn are not split");
    if (config.num_heads < 1 || config.embed_dim % config.num_heads != 0) {
      fail<ValueError>(op, ": embed_dim ", config.embed_dim, " is not divisible by num_heads ", config.num_heads);
    }
    TensorParallelAttention layer({config.embed_dim, config.num_heads, config.num_heads, 0, config.batch_first}, comm);
    const int64_t e = config.embed_dim;
    const std::optional<Tensor> in_bias = optional_entry(state, "in_proj_bias");
    std::map<std::string, std::optional<Tensor>> biases{{"q", rows(in_bias, 0, e)},
                                                        {"k", rows(in_bias, e, e)},
                                                        {"v", rows(in_bias, 2 * e, e)},
                                                        {"o", optional_entry(state, "out_proj.bias")}};
    const Tensor& wo = require(state, "out_proj.weight", op);
    if (const auto w = optional_entry(state, "in_proj_weight")) {
      if (w->dim() != 2 || w->size(0) != 3 * e)
        fail<ShapeError>(op, ": in_proj_weight is ", shape_str(w->shape()), ", want [", 3 * e, ", ", e, "]");
      layer.load(rows(*w, 0, e), rows(*w, e, e), rows(*w, 2 * e, e), wo, biases);
    } else {
      layer.load(require(state, "q_proj_weight", op), require(state, "k_proj_weight", op),
                 require(state, "v_proj_weight", op), wo, biases);
    }
    return std::pair(layer, layer.signature());
  });
}

TensorParallelAttention TensorParallelAttention::from_projections(const TensorParallelAttentionConfig& config,
                                                                  const std::map<std::string, Tensor>& state,
                                                                  const Communicator& comm) {
  const char* op = "TensorParallelAttention::from_projections";
  return agreed_layer<TensorParallelAttention>(op, comm, &state, [&] {
    TensorParallelAttention layer(config, comm);
    const Projections p = projections_of(state, op);
    layer.load(p.wq, p.wk, p.wv, p.wo, p.biases);
    return std::pair(layer, layer.signature());
  });
}

std::map<std::string, Tensor> TensorParallelAttention::shard_state_dict() const {
  std::map<std::string, Tensor> s;
  if (o_bias_) s["o_proj.bias"] = *o_bias_;
  if (hq_local_ == 0) return s;  // more ranks than heads: this one holds none
  const std::pair<const char*, const nn::Linear*> layers[] = {{"q_proj", &q_}, {"k_proj", &k_}, {"v_proj", &v_}};
  for (const auto& [name, layer] : layers) {
    s[std::string(name) + ".weight"] = layer->to_torch_layout();
    if (layer->bias()) s[std::string(name) + ".bias"] = layer->bias()->contiguous();
  }
  s["o_proj.weight"] = o_.to_torch_layout();
  return s;
}

TensorParallelAttention TensorParallelAttention::from_shard(const TensorParallelAttentionConfig& config,
                                                            const std::map<std::string, Tensor>& shard,
                                                            const Communicator& comm) {
  const char* op = "TensorParallelAttention::from_shard";
  // Only the configuration and o_proj.bias (added once, after the all-reduce) are the same on every
  // rank: its values are sampled too.
  std::map<std::string, Tensor> common;
  if (const auto bias = optional_entry(shard, "o_proj.bias")) common.emplace("o_proj.bias", *bias);
  return agreed_layer<TensorParallelAttention>(op, comm, &common, [&] {
    TensorParallelAttention layer(config, comm);
    layer.o_bias_ = optional_entry(shard, "o_proj.bias");
    if (layer.hq_local_ == 0) return std::pair(layer, layer.signature());
    const int64_t d = layer.config_.head_dim, e = layer.config_.embed_dim;
    const Projections p = projections_of(shard, op);
    const Tensor &wq = p.wq, &wk = p.wk, &wv = p.wv, &wo = p.wo;
    if (wq.dim() != 2 || wq.size(0) != layer.hq_local_ * d || wq.size(1) != e || wk.dim() != 2 ||
        wk.size(0) != layer.hk_local_ * d || wv.dim() != 2 || wv.size(0) != layer.hk_local_ * d || wo.dim() != 2 ||
        wo.size(0) != e || wo.size(1) != layer.hq_local_ * d) {
      fail<ShapeError>(op, ": rank ", comm.rank(), " of ", comm.size(), " holds query heads [", layer.q0_, ", ",
                       layer.q0_ + layer.hq_local_, ") and key/value heads [", layer.k0_, ", ",
                       layer.k0_ + layer.hk_local_, ") of ", d, ", so q_proj.weight [", layer.hq_local_ * d, ", ", e,
                       "], k/v_proj.weight [", layer.hk_local_ * d, ", *], o_proj.weight [", e, ", ",
                       layer.hq_local_ * d, "]; got ", shape_str(wq.shape()), ", ", shape_str(wk.shape()), ", ",
                       shape_str(wv.shape()), ", ", shape_str(wo.shape()), " (a shard of another rank count?)");
    }
    layer.q_ = nn::Linear::torch(wq, p.biases.at("q"));
    layer.k_ = nn::Linear::torch(wk, p.biases.at("k"));
    layer.v_ = nn::Linear::torch(wv, p.biases.at("v"));
    layer.o_ = nn::Linear::torch(wo, std::nullopt);
    return std::pair(layer, layer.signature());
  });
}

void TensorParallelAttention::check_inputs(const char* op, const Tensor& query, const Tensor& key, const Tensor& value,
                                           const TensorParallelOptions& options,
                                           const std::function<void()>& more_checks) const {
  // Collective (agree_on_call): a refusal on one rank stops every rank at once, and ranks called
  // with different inputs, options or layer configurations fail instead of summing mismatched
  // partial outputs (a rank without heads would otherwise wait in the all-reduce).
  agree_on_call(op, comm_, [&] {
    // MPI moves host memory, and a rank with heads would refuse alone (Linear's kernels are CPU ones).
    require_cpu(op, {&query, &key, &value, options.attn_mask ? &*options.attn_mask : nullptr});
    if (query.dim() != 3 || key.dim() != 3 || value.dim() != 3) {
      fail<ShapeError>(
          op, ": query, key, value must be [L, N, E] (or [N, L, E] with batch_first, or unbatched [L, E]), got ",
          shape_str(query.shape()), ", ", shape_str(key.shape()), ", ", shape_str(value.shape()));
    }
    const int64_t n = config_.batch_first ? 0 : 1, s = 1 - n;  // batch and sequence dims
    const bool widths = query.size(2) == config_.embed_dim &&
                        (hq_local_ == 0 || (key.size(2) == k_.in_features() && value.size(2) == v_.in_features()));
    // What the kernel refuses, on every rank (a rank without heads runs none).
    const bool alike = query.size(n) == key.size(n) && key.size(n) == value.size(n) && key.size(s) == value.size(s);
    if (!widths || !alike) {
      fail<ShapeError>(op, ": query ", shape_str(query.shape()), ", key ", shape_str(key.shape()), ", value ",
                       shape_str(value.shape()), " do not fit the layer (embed_dim ", config_.embed_dim,
                       "; one batch size, key and value of one length", config_.batch_first ? ", batch_first" : "",
                       ")");
    }
    for (const Tensor* t : {&query, &key, &value}) {  // Linear converts these; the others only some ranks refuse
      if (!is_floating(t->dtype())) {
        fail<DTypeError>(op, ": query, key, value must be float32, float64, float16 or bfloat16, got ",
                         dtype_name(query.dtype()), ", ", dtype_name(key.dtype()), ", ", dtype_name(value.dtype()));
      }
    }
    if (options.attn_mask && options.is_causal) {  // SDPA's refusal, on every rank (headless ones too)
      fail<ValueError>(op, ": attn_mask and is_causal cannot both be set (as in PyTorch)");
    }
    if (options.attn_mask) {  // [L, S] or [N, Hq, L, S] (each 1 or its size): else only some ranks' kernels refuse it
      const Tensor& m = *options.attn_mask;
      if (m.dtype() != DType::b8 && !is_floating(m.dtype())) {
        fail<DTypeError>(op, ": attn_mask must be bool or floating point, got ", dtype_name(m.dtype()));
      }
      const bool bf = config_.batch_first;
      const int64_t want[] = {query.size(bf ? 0 : 1), config_.num_heads, query.size(bf ? 1 : 0), key.size(bf ? 1 : 0)};
      bool ok = m.dim() == 2 || m.dim() == 4;
      for (int64_t i = 1; ok && i <= m.dim(); ++i) ok = m.size(-i) == 1 || m.size(-i) == want[4 - i];
      if (!ok) {
        fail<ShapeError>(op, ": attn_mask must be [L, S] or [N, Hq, L, S] = [", want[0], ", ", want[1], ", ", want[2],
                         ", ", want[3], "] (each dim 1 or its size), got ", shape_str(m.shape()));
      }
    }
    if (more_checks) more_checks();
    CallSignature sig = signature();
    sig.value("is_causal", options.is_causal).tensor("query", query).tensor("key", key).tensor("value", value);
    return sig.tensor("attn_mask", options.attn_mask);
  });
}

bool TensorParallelAttention::aligned() const {
  // SDPA's GQA gives local query head i key head i / (hq / hk); replicated heads need not
  // fall that way, and then each local query head gets a copy of its own key head.
  const int64_t g = config_.num_heads / config_.num_kv_heads;
  bool ok = hq_local_ % hk_local_ == 0;
  for (int64_t i = 0; ok && i < hq_local_; ++i) ok = (q0_ + i) / g - k0_ == i / (hq_local_ / hk_local_);
  return ok;
}

int64_t TensorParallelAttention::key_head_of(int64_t i) const {
  return (q0_ + i) / (config_.num_heads / config_.num_kv_heads) - k0_;
}

TensorParallelAttention::Local TensorParallelAttention::attend(const Tensor& query, const Tensor& key,
                                                               const Tensor& value,
                                                               const TensorParallelOptions& options) const {
  const bool bf = config_.batch_first;
  Local a;
  a.q = nn::detail::split_heads(q_.forward(query), hq_local_, bf);  // [N, hq, L, D]
  a.k = nn::detail::split_heads(k_.forward(key), hk_local_, bf);    // [N, hk, S, D]
  a.v = nn::detail::split_heads(v_.forward(value), hk_local_, bf);
  if (!aligned()) {  // [N, hq, S, D]: each local query head's own key/value head
    Tensor ke = Tensor::empty({a.k.size(0), hq_local_, a.k.size(2), a.k.size(3)});
    Tensor ve = Tensor::empty({a.v.size(0), hq_local_, a.v.size(2), a.v.size(3)});
    for (int64_t i = 0; i < hq_local_; ++i) {
      ke.select(1, i).copy_from(a.k.select(1, key_head_of(i)));
      ve.select(1, i).copy_from(a.v.select(1, key_head_of(i)));
    }
    a.k = ke;
    a.v = ve;
  }
  a.options.is_causal = options.is_causal;
  a.options.enable_gqa = a.k.size(1) != hq_local_;
  a.options.return_logsumexp = true;
  if (options.attn_mask) {
    Tensor m = *options.attn_mask;
    if (m.dim() == 4 && m.size(1) == config_.num_heads) m = m.slice(1, q0_, q0_ + hq_local_);
    a.options.attn_mask = m;
  }
  AttentionResult r = scaled_dot_product_attention(a.q, a.k, a.v, a.options);
  a.heads = r.output;  // [N, hq, L, D]
  a.lse = *r.logsumexp;
  a.merged = nn::detail::merge_heads(a.heads, bf);  // [L, N, hq D]
  return a;
}

Tensor TensorParallelAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                        const TensorParallelOptions& options) const {
  const bool bf = config_.batch_first;
  if (query.dim() == 2 && key.dim() == 2 && value.dim() == 2) {  // unbatched [L, E], as torch allows
    const int64_t n = bf ? 0 : 1;
    return forward(query.unsqueeze(n), key.unsqueeze(n), value.unsqueeze(n), options).squeeze(n);
  }
  check_inputs("TensorParallelAttention.forward", query, key, value, options);
  Tensor out;
  if (hq_local_ > 0) {
    out = o_.forward(attend(query, key, value, options).merged);  // [L, N, E] partial sum
  } else {
    const int64_t l = query.size(bf ? 1 : 0), n = query.size(bf ? 0 : 1);
    out = Tensor::zeros(bf ? Shape{n, l, config_.embed_dim} : Shape{l, n, config_.embed_dim});
  }
  comm_.all_reduce_sum(out);
  if (o_bias_) out = nn::detail::add_broadcast(out, *o_bias_);
  return out;
}

}  // namespace qkv::dist
