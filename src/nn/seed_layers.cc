// The seed articles' attention layers (seeds 000, 003, 004).
#include "qkv/nn/seed_layers.h"

#include <algorithm>
#include <cmath>
#include <initializer_list>
#include <optional>
#include <string>

#include "nn/heads.h"
#include "nn/seed_layers_internal.h"
#include "qkv/attention.h"
#include "qkv/size.h"

namespace qkv::nn {

using detail::check_3d;
using detail::check_qkv_agree;
using detail::rows_dk_to_kd;
using detail::seed_mask;

namespace {

// PyTorch nn.Linear's default bound 1/sqrt(in) (kaiming_uniform with a = sqrt(5)).
Tensor torch_init(const Shape& shape, uint64_t seed) {
  const double bound = 1.0 / std::sqrt(static_cast<double>(shape.back()));
  return Tensor::uniform(shape, seed, -bound, bound);
}

Tensor load(const std::map<std::string, Tensor>& sd, const std::string& layer, const std::string& name,
            const Shape& shape) {
  auto it = sd.find(name);
  if (it == sd.end()) fail<ValueError>(layer, ": state_dict has no \"", name, "\"");
  return parameter(it->second, shape, (layer + ": " + name).c_str()).contiguous();
}

// a * b * c, ValueError naming the layer when it passes 2^62 (it overflowed int64, undefined, for
// huge head counts and sizes, and reached the allocator as 0 or a negative dimension).
int64_t sizes_product(const char* layer, const char* what, int64_t a, int64_t b, int64_t c = 1) {
  const std::optional<int64_t> ab = checked_mul(a, b);
  const std::optional<int64_t> abc = ab ? checked_mul(*ab, c) : std::nullopt;
  if (!abc)
    fail<ValueError>(layer, ": ", what, " (", a, " * ", b, c == 1 ? "" : " * " + std::to_string(c), ") passes 2^62");
  return *abc;
}

// torch's load_state_dict (strict=True) refuses keys the module does not have: a bias-free
// layer given "W_q.bias" dropped it without a word and computed other numbers than its source.
void no_unexpected_keys(const std::map<std::string, Tensor>& sd, const char* layer,
                        std::initializer_list<const char*> names) {
  std::string unexpected;
  for (const auto& entry : sd) {
    const std::string& key = entry.first;  // not a structured binding: clang 14 refuses one captured by a lambda
    if (std::find_if(names.begin(), names.end(), [&](const char* n) { return key == n; }) == names.end()) {
      unexpected += (unexpected.empty() ? "" : ", ") + key;
    }
  }
  if (!unexpected.empty()) fail<ValueError>(layer, ": unexpected keys in state_dict [", unexpected, "]");
}

}  // namespace

// ---- seed 000: SelfAttention -----------------------------------------------------------

SelfAttention::SelfAttention(int64_t dim, uint64_t seed) : dim_(dim) {
  const AllocationScope scope("SelfAttention");  // names the layer in out-of-memory errors (qkv/size.h)
  if (dim <= 0) fail<ValueError>("SelfAttention: dim must be positive, got ", dim);
  (void)sizes_product("SelfAttention", "3 * dim", 3, dim);
  load_state_dict({{"to_qvk.weight", torch_init({3 * dim, dim}, seed)}});
}

void SelfAttention::load_state_dict(const std::map<std::string, Tensor>& sd) {
  no_unexpected_keys(sd, "SelfAttention", {"to_qvk.weight"});
  to_qvk_ = load(sd, "SelfAttention", "to_qvk.weight", {3 * dim_, dim_});
  proj_ = Linear::torch(rows_dk_to_kd(to_qvk_, dim_, 3), std::nullopt);
}

std::map<std::string, Tensor> SelfAttention::state_dict() const { return {{"to_qvk.weight", to_qvk_}}; }

Tensor SelfAttention::forward(const Tensor& x, const std::optional<Tensor>& mask) const {
  const AllocationScope scope("SelfAttention.forward", {}, std::span<const Shape>(&x.shape(), 1),
                              "x");  // names it in errors
  check_3d(x, dim_, "SelfAttention", "x");
  const Tensor qkv = proj_.forward(x).view({x.size(0), x.size(1), 3, dim_});  // [B, T, 3, dim]
  AttentionOptions o;
  o.attn_mask = seed_mask(mask, x.size(1), "SelfAttention");
  o.scale = 1.0 / std::sqrt(static_cast<double>(dim_));
  return scaled_dot_product_attention(qkv.select(2, 0), qkv.select(2, 1), qkv.select(2, 2), o).output;
}

// ---- seed 000: MultiHeadSelfAttention ----------------------------------------------------

MultiHeadSelfAttention::MultiHeadSelfAttention(int64_t dim, int64_t heads, std::optional<int64_t> dim_head,
                                               uint64_t seed)
    : dim_(dim), heads_(heads), dim_head_(dim_head.value_or(heads > 0 ? dim / heads : 0)) {
  const AllocationScope scope("MultiHeadSelfAttention");  // names the layer in out-of-memory errors
  if (dim <= 0 || heads <= 0 || dim_head_ <= 0) {
    fail<ValueError>("MultiHeadSelfAttention: dim, heads and dim_head must be positive, got ", dim, ", ", heads, ", ",
                     dim_head_);
  }
  const int64_t inner = sizes_product("MultiHeadSelfAttention", "3 * heads * dim_head", 3, heads_, dim_head_) / 3;
  load_state_dict(
      {{"to_qvk.weight", torch_init({3 * inner, dim}, seed)}, {"W_0.weight", torch_init({dim, inner}, seed + 1)}});
}

void MultiHeadSelfAttention::load_state_dict(const std::map<std::string, Tensor>& sd) {
  no_unexpected_keys(sd, "MultiHeadSelfAttention", {"to_qvk.weight", "W_0.weight"});
  const int64_t inner = heads_ * dim_head_;
  // both read before either is kept: a bad W_0 left the new to_qvk in state_dict() only
  Tensor to_qvk = load(sd, "MultiHeadSelfAttention", "to_qvk.weight", {3 * inner, dim_});
  w0_ = load(sd, "MultiHeadSelfAttention", "W_0.weight", {dim_, inner});
  to_qvk_ = std::move(to_qvk);
  // 'b t (d k h) -> k b h t d': reorder the rows (d, k*h) to (k*h, d) once, so that the
  // projection comes out as [B, T, 3, H, dh] and q, k, v are strided views.
  proj_ = Linear::torch(rows_dk_to_kd(to_qvk_, dim_head_, 3 * heads_), std::nullopt);
  out_ = Linear::torch(w0_, std::nullopt);
}

std::map<std::string, Tensor> MultiHeadSelfAttention::state_dict() const {
  return {{"to_qvk.weight", to_qvk_}, {"W_0.weight", w0_}};
}

Tensor MultiHeadSelfAttention::forward(const Tensor& x, const std::optional<Tensor>& mask) const {
  const AllocationScope scope("MultiHeadSelfAttention.forward", {}, std::span<const Shape>(&x.shape(), 1),
                              "x");  // names it in errors
  check_3d(x, dim_, "MultiHeadSelfAttention", "x");
  const int64_t b = x.size(0), t = x.size(1);
  const Tensor qkv = proj_.forward(x).view({b, t, 3, heads_, dim_head_});         // [B, T, 3, H, dh]
  auto part = [&](int64_t i) { return qkv.select(2, i).permute({0, 2, 1, 3}); };  // [B, H, T, dh]
  AttentionOptions o;
  o.attn_mask = seed_mask(mask, t, "MultiHeadSelfAttention");
  o.scale = 1.0 / std::sqrt(static_cast<double>(dim_head_));
  const Tensor heads = scaled_dot_product_attention(part(0), part(1), part(2), o).output;  // [B, H, T, dh]
  return out_.forward(detail::merge_heads(heads, true));  // 'b h t d -> b t (h d)', W_0
}

// ---- seed 003 ------------------------------------------------------------------------------

SeparateHeadsAttention::SeparateHeadsAttention(int64_t embed_dim, int64_t n_heads, std::optional<int64_t> d_kq,
                                               std::optional<int64_t> d_v, std::optional<double> scale, bool causal,
                                               uint64_t seed)
    : e_(embed_dim), h_(n_heads), scale_(scale), causal_(causal) {
  const AllocationScope scope("SeparateHeadsAttention");  // names the layer in out-of-memory errors
  if (n_heads <= 0 || embed_dim <= 0)
    fail<ValueError>("SeparateHeadsAttention: embed_dim and n_heads must be positive");
  if ((!d_kq || !d_v) && embed_dim < n_heads) {
    fail<ValueError>("SeparateHeadsAttention: embed_dim (", embed_dim, ") must be at least n_heads (", n_heads,
                     ") for the default head size embed_dim / n_heads");
  }
  dkq_ = d_kq.value_or(embed_dim / n_heads);
  dv_ = d_v.value_or(embed_dim / n_heads);
  if (dkq_ <= 0 || dv_ <= 0) fail<ValueError>("SeparateHeadsAttention: d_kq and d_v must be positive");
  (void)sizes_product("SeparateHeadsAttention", "n_heads * d_kq", h_, dkq_);
  (void)sizes_product("SeparateHeadsAttention", "n_heads * d_v", h_, dv_);
  params_ = {{"W_q.weight", torch_init({h_ * dkq_, e_}, seed)},
             {"W_k.weight", torch_init({h_ * dkq_, e_}, seed + 1)},
             {"W_v.weight", torch_init({h_ * dv_, e_}, seed + 2)},
             {"W_o.weight", torch_init({e_, h_ * dv_}, seed + 3)}};
  rebuild();
}

void SeparateHeadsAttention::load_state_dict(const std::map<std::string, Tensor>& sd) {
  const char* layer = "SeparateHeadsAttention";
  no_unexpected_keys(sd, layer, {"W_q.weight", "W_k.weight", "W_v.weight", "W_o.weight"});
  params_ = {{"W_q.weight", load(sd, layer, "W_q.weight", {h_ * dkq_, e_})},
             {"W_k.weight", load(sd, layer, "W_k.weight", {h_ * dkq_, e_})},
             {"W_v.weight", load(sd, layer, "W_v.weight", {h_ * dv_, e_})},
             {"W_o.weight", load(sd, layer, "W_o.weight", {e_, h_ * dv_})}};
  rebuild();
}

void SeparateHeadsAttention::rebuild() {
  wq_ = Linear::torch(params_.at("W_q.weight"), std::nullopt);
  wk_ = Linear::torch(params_.at("W_k.weight"), std::nullopt);
  wv_ = Linear::torch(params_.at("W_v.weight"), std::nullopt);
  wo_ = Linear::torch(params_.at("W_o.weight"), std::nullopt);
}

std::map<std::string, Tensor> SeparateHeadsAttention::state_dict() const { return params_; }

SeparateHeadsAttentionResult SeparateHeadsAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v) const {
  const std::vector<Shape> inputs{q.shape(), k.shape(), v.shape()};  // named in out-of-memory errors
  const AllocationScope scope("SeparateHeadsAttention.forward", {}, inputs, "q, k, v");
  const char* layer = "SeparateHeadsAttention";
  check_3d(q, e_, layer, "q");
  check_3d(k, e_, layer, "k");
  check_3d(v, e_, layer, "v");
  check_qkv_agree(q, k, v, layer);
  AttentionOptions o;
  o.scale = scale_.value_or(1.0 / std::sqrt(static_cast<double>(dkq_)));
  o.is_causal = causal_;  // triu(ones(Lq, Lk), 1) filled with -inf: top-left aligned
  o.return_weights = true;
  // view + transpose: [B, L, H*D] -> [B, H, L, D]
  const AttentionResult r = scaled_dot_product_attention(detail::split_heads(wq_.forward(q), h_, true),
                                                         detail::split_heads(wk_.forward(k), h_, true),
                                                         detail::split_heads(wv_.forward(v), h_, true), o);
  return {wo_.forward(detail::merge_heads(r.output, true)), *r.weights};
}

// ---- seed 004 ------------------------------------------------------------------------------

namespace {
const char* const kLazy = "LazyMultiHeadAttention";
const char* const kLazyNames[] = {"W_q", "W_k", "W_v"};
}  // namespace

LazyMultiHeadAttention::LazyMultiHeadAttention(int64_t hidden, int64_t heads, uint64_t seed)
    : hidden_(hidden), heads_(heads), seed_(seed) {
  const AllocationScope scope(kLazy);  // names the layer in out-of-memory errors
  if (hidden <= 0 || heads <= 0 || hidden % heads != 0) {
    fail<ValueError>(kLazy, ": hidden size ", hidden, " must be a positive multiple of heads ", heads);
  }
  const double bound = 1.0 / std::sqrt(static_cast<double>(hidden));
  params_["W_o.weight"] = Tensor::uniform({hidden, hidden}, seed + 3, -bound, bound);
  params_["W_o.bias"] = Tensor::uniform({hidden}, seed + 4, -bound, bound);
  rebuild();
}

void LazyMultiHeadAttention::load_state_dict(const std::map<std::string, Tensor>& sd) {
  no_unexpected_keys(
      sd, kLazy,
      {"W_q.weight", "W_q.bias", "W_k.weight", "W_k.bias", "W_v.weight", "W_v.bias", "W_o.weight", "W_o.bias"});
  std::map<std::string, Tensor> next;
  for (const char* name : kLazyNames) {
    const std::string w = std::string(name) + ".weight", b = std::string(name) + ".bias";
    auto it = sd.find(w);
    if (it == sd.end()) fail<ValueError>(kLazy, ": state_dict has no \"", w, "\"");
    const int64_t in = it->second.dim() == 2 ? it->second.size(1) : -1;
    if (materialized() && params_.at(w).size(1) != in) {
      fail<ShapeError>(kLazy, ": ", w, " has ", in, " input features but the layer was materialized with ",
                       params_.at(w).size(1));
    }
    next[w] = load(sd, kLazy, w, {hidden_, in});
    next[b] = load(sd, kLazy, b, {hidden_});
  }
  next["W_o.weight"] = load(sd, kLazy, "W_o.weight", {hidden_, hidden_});
  next["W_o.bias"] = load(sd, kLazy, "W_o.bias", {hidden_});
  params_ = std::move(next);
  rebuild();
}

std::map<std::string, Tensor> LazyMultiHeadAttention::state_dict() const { return params_; }

void LazyMultiHeadAttention::rebuild() {
  if (params_.count("W_q.weight")) {
    wq_ = Linear::torch(params_.at("W_q.weight"), params_.at("W_q.bias"));
    wk_ = Linear::torch(params_.at("W_k.weight"), params_.at("W_k.bias"));
    wv_ = Linear::torch(params_.at("W_v.weight"), params_.at("W_v.bias"));
  }
  wo_ = Linear::torch(params_.at("W_o.weight"), params_.at("W_o.bias"));
}

void LazyMultiHeadAttention::check_inputs(const Tensor& q, const Tensor& k, const Tensor& v) const {
  const Tensor* inputs[] = {&q, &k, &v};
  for (int i = 0; i < 3; ++i) {
    const Tensor& x = *inputs[i];
    if (x.dim() != 3) fail<ShapeError>(kLazy, ": inputs must be [batch, seq, features], got ", shape_str(x.shape()));
    if (materialized()) {
      const int64_t fixed = params_.at(std::string(kLazyNames[i]) + ".weight").size(1);
      if (x.size(2) != fixed) {
        fail<ShapeError>(kLazy, ": ", "qkv"[i], " has ", x.size(2), " features, but the first call fixed d_", "qkv"[i],
                         " = ", fixed, " (LazyLinear input sizes are inferred once)");
      }
    }
  }
}

Tensor LazyMultiHeadAttention::forward(const Tensor& q, const Tensor& k, const Tensor& v) {
  const std::vector<Shape> shapes{q.shape(), k.shape(), v.shape()};  // named in out-of-memory errors
  const AllocationScope scope("LazyMultiHeadAttention.forward", {}, shapes, "q, k, v");
  check_inputs(q, k, v);
  const Tensor* inputs[] = {&q, &k, &v};
  if (!materialized()) {  // LazyLinear: the input sizes of this first call become the layer's
    for (int i = 0; i < 3; ++i) {
      const int64_t in = inputs[i]->size(2);
      const double bound = 1.0 / std::sqrt(static_cast<double>(in));
      const std::string name = kLazyNames[i];
      params_[name + ".weight"] =
          Tensor::uniform({hidden_, in}, seed_ + 10 + 2 * static_cast<uint64_t>(i), -bound, bound);
      params_[name + ".bias"] = Tensor::uniform({hidden_}, seed_ + 11 + 2 * static_cast<uint64_t>(i), -bound, bound);
    }
    rebuild();
  }
  check_qkv_agree(q, k, v, kLazy);
  // 'batch seq (heads eachhead) -> batch heads seq eachhead' as views, attention per
  // (batch, head), '(batch heads) numq eachhead -> batch numq (heads eachhead)', W_o.
  const Tensor out = scaled_dot_product_attention(detail::split_heads(wq_.forward(q), heads_, true),
                                                  detail::split_heads(wk_.forward(k), heads_, true),
                                                  detail::split_heads(wv_.forward(v), heads_, true))
                         .output;  // [B, H, Lq, D/H]
  return wo_.forward(detail::merge_heads(out, true));
}

// ---- shared with the backward (seed_layers_internal.h) ------------------------------------

namespace detail {

void check_3d(const Tensor& x, int64_t dim, const char* layer, const char* what) {
  if (x.dim() != 3 || x.size(2) != dim) {
    fail<ShapeError>(layer, ": ", what, " must be [B, T, ", dim, "], got ", shape_str(x.shape()));
  }
}

void check_qkv_agree(const Tensor& q, const Tensor& k, const Tensor& v, const char* layer) {
  if (k.size(0) != q.size(0) || v.size(0) != q.size(0) || v.size(1) != k.size(1)) {
    fail<ShapeError>(layer, ": q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()),
                     " disagree in batch or key length");
  }
}

std::optional<Tensor> seed_mask(const std::optional<Tensor>& mask, int64_t t, const char* layer) {
  if (!mask) return std::nullopt;
  if (mask->shape() != Shape{t, t}) {
    fail<ShapeError>(layer, ": mask must be [", t, ", ", t, "] (tokens, tokens), got ", shape_str(mask->shape()));
  }
  return additive_mask(*mask, true, layer);
}

Tensor rows_dk_to_kd(const Tensor& w, int64_t d, int64_t k) {
  return w.view({d, k, w.size(1)}).permute({1, 0, 2}).contiguous().view({k * d, w.size(1)});
}

Tensor rows_kd_to_dk(const Tensor& w, int64_t d, int64_t k) {
  return w.view({k, d, w.size(1)}).permute({1, 0, 2}).contiguous().view({d * k, w.size(1)});
}

}  // namespace detail

}  // namespace qkv::nn
