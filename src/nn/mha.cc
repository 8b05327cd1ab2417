// qkv::nn::MultiheadAttention (PyTorch flavour): parameters and the forward pass.
#include "qkv/nn/mha.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "nn/heads.h"
#include "nn/layer_attention.h"
#include "qkv/attention.h"
#include "qkv/gemm.h"
#include "qkv/size.h"

namespace qkv::nn {

namespace {

constexpr const char* kOp = "MultiheadAttention";

using detail::same_tensor;  // PyTorch tests `query is key`

Tensor xavier(const Shape& shape, int64_t fan_in, int64_t fan_out, uint64_t seed) {
  const double a = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return Tensor::uniform(shape, seed, -a, a);
}

// torch's checks of the attn_mask shape; returns it as [1|N, 1|H, L, S] (additive f32).
Tensor attn_mask_4d(const Tensor& m, int64_t n, int64_t h, int64_t l, int64_t s) {
  const Tensor a = detail::additive_mask(m, true, "MultiheadAttention: attn_mask");
  if (m.dim() == 2) {
    if (m.shape() != Shape{l, s}) {
      fail<ShapeError>(kOp, ": The shape of the 2D attn_mask is ", shape_str(m.shape()), ", but should be ",
                       shape_str(std::vector<int64_t>{l, s}), ".");
    }
    return a.view({1, 1, l, s});
  }
  if (m.dim() == 3) {
    if (m.shape() != Shape{n * h, l, s}) {
      fail<ShapeError>(kOp, ": The shape of the 3D attn_mask is ", shape_str(m.shape()), ", but should be ",
                       shape_str(std::vector<int64_t>{n * h, l, s}), ".");
    }
    return a.view({n, h, l, s});
  }
  fail<ShapeError>(kOp, ": attn_mask's dimension ", m.dim(), " is not supported");
}

}  // namespace

MultiheadAttention::MultiheadAttention(const MultiheadAttentionConfig& config, uint64_t seed) : config_(config) {
  const AllocationScope scope(kOp);  // names the layer in out-of-memory errors (qkv/size.h)
  const int64_t e = config.embed_dim, h = config.num_heads;
  if (e <= 0 || h <= 0) fail<ValueError>(kOp, ": embed_dim and num_heads must be positive, got ", e, " and ", h);
  if (e % h != 0) fail<ValueError>(kOp, ": embed_dim must be divisible by num_heads (", e, " and ", h, ")");
  if (!(config.dropout >= 0 && config.dropout <= 1)) {  // NaN too
    fail<ValueError>(kOp, ": dropout must be in [0, 1], got ", config.dropout);
  }
  const int64_t kd = config.kdim.value_or(e), vd = config.vdim.value_or(e);
  if (kd < 0 || vd < 0) fail<ValueError>(kOp, ": kdim and vdim must be >= 0, got ", kd, " and ", vd);
  // 3 * embed_dim (in_proj rows) overflowed int64 (undefined) for huge sizes and reached the
  // allocator as a negative dimension
  if (!checked_mul(3, e)) fail<ValueError>(kOp, ": embed_dim ", e, " is too large (3 * embed_dim passes 2^62)");
  if (packed()) {
    params_["in_proj_weight"] = xavier({3 * e, e}, e, 3 * e, seed);
  } else {
    params_["q_proj_weight"] = xavier({e, e}, e, e, seed);
    params_["k_proj_weight"] = xavier({e, kd}, kd, e, seed + 1);
    params_["v_proj_weight"] = xavier({e, vd}, vd, e, seed + 2);
  }
  if (config.bias) {
    params_["in_proj_bias"] = Tensor::zeros({3 * e});
    params_["out_proj.bias"] = Tensor::zeros({e});
  }
  if (config.add_bias_kv) {
    params_["bias_k"] = xavier({1, 1, e}, 1, e, seed + 3);
    params_["bias_v"] = xavier({1, 1, e}, 1, e, seed + 4);
  }
  const double bound = 1.0 / std::sqrt(static_cast<double>(e));
  params_["out_proj.weight"] = Tensor::uniform({e, e}, seed + 5, -bound, bound);
  rebuild();
}

bool MultiheadAttention::packed() const {
  const int64_t e = config_.embed_dim;
  return config_.kdim.value_or(e) == e && config_.vdim.value_or(e) == e;
}

MultiheadAttention MultiheadAttention::from_state_dict(const MultiheadAttentionConfig& config,
                                                       const std::map<std::string, Tensor>& state_dict,
                                                       const std::string& prefix) {
  MultiheadAttention m(config);
  m.load_state_dict(mha_state_dict(state_dict, prefix));
  return m;
}

namespace {

// The parameter names of torch.nn.MultiheadAttention's state_dict (any configuration).
constexpr const char* kTorchNames[] = {"in_proj_weight", "in_proj_bias",    "q_proj_weight",
                                       "k_proj_weight",  "v_proj_weight",   "bias_k",
                                       "bias_v",         "out_proj.weight", "out_proj.bias"};

}  // namespace

std::map<std::string, Tensor> mha_state_dict(const std::map<std::string, Tensor>& tensors, const std::string& prefix) {
  const std::string out_w = "out_proj.weight";
  std::vector<std::string> hits;
  std::string layers;
  for (const auto& [key, t] : tensors) {
    if (!key.ends_with(out_w)) continue;
    const std::string p = key.substr(0, key.size() - out_w.size());  // "" or "<layer>."
    if (!p.empty() && !p.ends_with(".")) continue;
    layers += (layers.empty() ? "'" : ", '") + p + "'";
    const std::string bare = p.empty() ? p : p.substr(0, p.size() - 1);
    if (prefix.empty() || prefix == p || prefix == bare || bare.ends_with("." + prefix) || p.ends_with("." + prefix)) {
      hits.push_back(p);
    }
  }
  if (hits.size() != 1) {
    std::string keys;
    for (const auto& [key, t] : tensors) keys += (keys.empty() ? "" : ", ") + key + " " + shape_str(t.shape());
    const std::string what = prefix.empty() ? "" : " under the prefix '" + prefix + "'";
    if (hits.empty()) {
      fail<ValueError>(kOp, ": no MultiheadAttention state_dict", what, " (no <prefix>out_proj.weight)",
                       layers.empty() ? "" : "; its layers: " + layers, "; the keys: ", keys.empty() ? "none" : keys);
    }
    fail<ValueError>(kOp, ": ", hits.size(), " MultiheadAttention layers (prefixes ", layers,
                     "); choose one with prefix=");
  }
  std::map<std::string, Tensor> out;
  for (const char* name : kTorchNames) {
    const auto it = tensors.find(hits.front() + name);
    if (it != tensors.end()) out.emplace(name, it->second);
  }
  return out;
}

void MultiheadAttention::load_state_dict(const std::map<std::string, Tensor>& state_dict, bool strict) {
  // Static scales were calibrated on this layer's own weights (the output projection's input is
  // the attention of value_proj(v)): with new weights they clip or waste the int8 range without
  // a word. torch.ao refuses float weights into a converted module too (KeyError 'scale').
  if (static_scales_) {
    fail<ValueError>(kOp,
                     ".load_state_dict: the layer is statically quantized, and its activation scales were "
                     "calibrated with the weights it has; new weights need new scales: load them into a float32 "
                     "layer and call quantize_static(batches) again (or quantize_dynamic, which needs no "
                     "calibration); a saved quantized layer loads with from_quantized_state_dict");
  }
  std::map<std::string, Tensor> next;
  std::string missing, unexpected;
  for (const auto& [name, current] : params_) {
    auto it = state_dict.find(name);
    if (it == state_dict.end()) {
      if (strict) missing += (missing.empty() ? "" : ", ") + name;
      next[name] = current;
      continue;
    }
    next[name] = parameter(it->second, current.shape(), (std::string(kOp) + ": " + name).c_str()).contiguous();
  }
  for (const auto& [name, t] : state_dict) {
    if (!params_.count(name) && strict) unexpected += (unexpected.empty() ? "" : ", ") + name;
  }
  if (!missing.empty() || !unexpected.empty()) {
    fail<ValueError>(kOp, ": error loading state_dict: missing keys [", missing, "], unexpected keys [", unexpected,
                     "]");
  }
  params_ = std::move(next);
  rebuild();
}

std::map<std::string, Tensor> MultiheadAttention::state_dict() const { return params_; }

void MultiheadAttention::rebuild() {
  const int64_t e = config_.embed_dim;
  std::optional<Tensor> b;
  auto bias_rows = [&](int64_t r0, int64_t r1) -> std::optional<Tensor> {
    if (!config_.bias) return std::nullopt;
    return params_.at("in_proj_bias").slice(0, r0, r1).contiguous();
  };
  if (packed()) {
    const Tensor& w = params_.at("in_proj_weight");  // [3E, E]
    qkv_ = Linear::torch(w, bias_rows(0, 3 * e));
    q_ = Linear::torch(w.slice(0, 0, e), bias_rows(0, e));
    k_ = Linear::torch(w.slice(0, e, 2 * e), bias_rows(e, 2 * e));
    v_ = Linear::torch(w.slice(0, 2 * e, 3 * e), bias_rows(2 * e, 3 * e));
    kv_ = Linear::torch(w.slice(0, e, 3 * e), bias_rows(e, 3 * e));
  } else {
    q_ = Linear::torch(params_.at("q_proj_weight"), bias_rows(0, e));
    k_ = Linear::torch(params_.at("k_proj_weight"), bias_rows(e, 2 * e));
    v_ = Linear::torch(params_.at("v_proj_weight"), bias_rows(2 * e, 3 * e));
  }
  std::optional<Tensor> ob;
  if (config_.bias) ob = params_.at("out_proj.bias");
  out_ = Linear::torch(params_.at("out_proj.weight"), ob);
  if (quantized_ && static_scales_) {  // one fixed activation scale per projection input
    const auto [sq, sk, sv, so] = *static_scales_;
    const int bits = weight_bits_;
    q_ = q_.quantize_static(sq, bits);
    k_ = k_.quantize_static(sk, bits);
    v_ = v_.quantize_static(sv, bits);
    if (qkv_.defined()) qkv_ = qkv_.quantize_static(std::max({sq, sk, sv}), bits);  // the same x feeds all three
    if (kv_.defined()) kv_ = kv_.quantize_static(std::max(sk, sv), bits);
    out_ = out_.quantize_static(so, bits);
  } else if (quantized_) {
    for (Linear* l : {&q_, &k_, &v_, &qkv_, &kv_, &out_}) {
      if (l->defined()) *l = l->quantize_dynamic(weight_bits_);
    }
  }
}

namespace {

// What quantizing refuses, checked before any work (quantize_static used to run every
// calibration batch first): weight_bits (int8_weight_bits), and projections deeper than the int8
// GEMM takes (Linear::quantized_as refused them only when the layer was rebuilt, naming Linear).
int int8_bits_for(const MultiheadAttentionConfig& c, int weight_bits, const char* op) {
  const int bits = int8_weight_bits(weight_bits, op);
  const int64_t e = c.embed_dim;
  const std::pair<const char*, int64_t> depths[] = {{"embed_dim (q_proj's and out_proj's in_features)", e},
                                                    {"kdim (k_proj's in_features)", c.kdim.value_or(e)},
                                                    {"vdim (v_proj's in_features)", c.vdim.value_or(e)}};
  for (const auto& [what, depth] : depths) {
    if (depth > kGemmInt8MaxDepth) {
      fail<ValueError>(op, ": ", what, " ", depth, " is more than ", kGemmInt8MaxDepth,
                       ", the depth of the int8 GEMM (its int32 sums could overflow); keep this layer float32");
    }
  }
  return bits;
}

}  // namespace

struct MultiheadAttention::Calibration {
  ActivationObserver q, k, v, o;  // inputs of the query/key/value projections and of out_proj
  explicit Calibration(const CalibrationOptions& c)
      : q(c.observer, c.percentile),
        k(c.observer, c.percentile),
        v(c.observer, c.percentile),
        o(c.observer, c.percentile) {}
};

MultiheadAttention MultiheadAttention::quantize_static(const std::vector<std::array<Tensor, 3>>& batches,
                                                       const CalibrationOptions& options) const {
  if (batches.empty()) fail<ValueError>(kOp, ".quantize_static: no calibration batches");
  const int bits = int8_bits_for(config_, options.weight_bits, "MultiheadAttention.quantize_static");
  MultiheadAttention observed = *this;
  observed.quantized_ = false;
  observed.static_scales_.reset();
  observed.rebuild();         // float32 projections while observing
  observed.training = false;  // the inference forward: dropout would scale out_proj's inputs by 1 / (1 - p)
  observed.calibrating_ = std::make_shared<Calibration>(options);
  MultiheadAttentionOptions o;
  o.need_weights = false;
  for (const auto& [query, key, value] : batches) (void)observed.forward(query, key, value, o);
  const Calibration& c = *observed.calibrating_;
  MultiheadAttention q = *this;
  q.quantized_ = true;
  q.weight_bits_ = bits;
  q.static_scales_ = std::array<float, 4>{c.q.scale(), c.k.scale(), c.v.scale(), c.o.scale()};
  q.rebuild();
  return q;
}

MultiheadAttention MultiheadAttention::quantize_dynamic(int weight_bits) const {
  MultiheadAttention q = *this;
  q.quantized_ = true;
  q.static_scales_.reset();  // per-token scales at run time, also from a statically quantized layer
  q.weight_bits_ = int8_bits_for(config_, weight_bits, "MultiheadAttention.quantize_dynamic");
  q.rebuild();
  return q;
}

namespace {

// w [N, H, L, S] -> mean over heads [N, L, S].
Tensor mean_heads(const Tensor& w) {
  const Tensor c = w.contiguous();
  const int64_t n = c.size(0), h = c.size(1), ls = c.size(2) * c.size(3);
  Tensor out = Tensor::zeros({n, c.size(2), c.size(3)});
  const float* src = c.data<float>();
  float* dst = out.data<float>();
  for (int64_t b = 0; b < n; ++b) {
    for (int64_t i = 0; i < h; ++i) {
      const float* p = src + (b * h + i) * ls;
      for (int64_t j = 0; j < ls; ++j) dst[b * ls + j] += p[j];
    }
    for (int64_t j = 0; j < ls; ++j) dst[b * ls + j] /= static_cast<float>(h);
  }
  return out;
}

void check_input(const Tensor& t, int64_t dims, int64_t features, const char* what) {
  if (t.dim() != dims || t.size(-1) != features) {
    fail<ShapeError>(kOp, ": ", what, " must be ", dims == 3 ? "[L, N, " : "[L, ", features, "] (", dims,
                     "-D like query), got ", shape_str(t.shape()));
  }
}

// The call's masks as one additive f32 mask [1|N, 1|H, L, S + extra] (PyTorch's merge of
// key_padding_mask and attn_mask; the `extra` bias_kv / zero_attn keys always take part).
std::optional<Tensor> combined_mask(const MultiheadAttentionOptions& o, bool batched, int64_t n, int64_t h, int64_t l,
                                    int64_t s, int64_t extra) {
  std::optional<Tensor> mask;
  if (o.attn_mask) mask = attn_mask_4d(*o.attn_mask, n, h, l, s);
  if (o.key_padding_mask) {
    const Tensor& m = *o.key_padding_mask;
    const Shape expected = batched ? Shape{n, s} : Shape{s};
    if (m.shape() != expected) {
      fail<ShapeError>(kOp, ": expected key_padding_mask of shape ", shape_str(expected), ", got ",
                       shape_str(m.shape()));
    }
    const Tensor kpm = detail::additive_mask(m, true, "MultiheadAttention: key_padding_mask").view({n, 1, 1, s});
    mask = mask ? detail::add_broadcast(*mask, kpm) : kpm;
  }
  if (mask && extra > 0) mask = detail::pad_last(*mask, extra, 0.0f);
  return mask;
}

// An attention= choice other than softmax (qkv/nn/layer_attention.h) on the heads q [N, H, L, D],
// k, v [N, H, S, D] -> [N, H, L, D], after refusing what it cannot do.
Tensor variant_heads(const MultiheadAttentionOptions& o, bool qk_shared, bool dropout, bool appended_keys,
                     const Tensor& qh, const Tensor& kh, const Tensor& vh) {
  detail::refuse_unsupported(kOp, o.attention,
                             {{o.need_weights, "need_weights (it has no [L, S] weights: pass need_weights = false)"},
                              {o.attn_mask.has_value(), "attn_mask"},
                              {o.key_padding_mask.has_value(), "key_padding_mask"},
                              {o.is_causal, "the is_causal hint (set the choice's own is_causal)"},
                              {o.mods.any(), "mods"},
                              {dropout, "dropout while training"},
                              {appended_keys, "add_bias_kv / add_zero_attn"}});
  detail::require_self_attention(kOp, o.attention, qk_shared, "key the query itself");
  return detail::variant_attention(o.attention, qh, kh, vh, false);
}

}  // namespace

void MultiheadAttention::project(const Tensor& q, const Tensor& k, const Tensor& v, bool self, bool kv_shared,
                                 Tensor& qp, Tensor& kp, Tensor& vp) const {
  const int64_t e = config_.embed_dim;
  if (calibrating_) {  // quantize_static's calibration run
    calibrating_->q.observe(q);
    calibrating_->k.observe(k);
    calibrating_->v.observe(v);
  }
  if (packed() && self) {
    const Tensor all = qkv_.forward(q);  // [L, N, 3E], one GEMM
    qp = all.slice(-1, 0, e);
    kp = all.slice(-1, e, 2 * e);
    vp = all.slice(-1, 2 * e, 3 * e);
  } else if (packed() && kv_shared) {
    qp = q_.forward(q);
    const Tensor kv = kv_.forward(k);  // [S, N, 2E]
    kp = kv.slice(-1, 0, e);
    vp = kv.slice(-1, e, 2 * e);
  } else {
    qp = q_.forward(q);
    kp = k_.forward(k);
    vp = v_.forward(v);
  }
}

MultiheadAttention::Prepared MultiheadAttention::prepare(const Tensor& query, const Tensor& key,
                                                         const Tensor& value) const {
  require_cpu(kOp, {&query, &key, &value});
  const int64_t e = config_.embed_dim;
  if (query.dim() != 3 && query.dim() != 2) {
    fail<ShapeError>(kOp, ": query should be unbatched 2D or batched 3D, got ", shape_str(query.shape()));
  }
  Prepared in;
  in.batched = query.dim() == 3;
  check_input(query, query.dim(), e, "query");
  check_input(key, query.dim(), config_.kdim.value_or(e), "key");
  check_input(value, query.dim(), config_.vdim.value_or(e), "value");
  // torch refuses integer and bool inputs too (F.linear: "mat1 and mat2 must have the same
  // dtype, but got Int and Float"); the projections turned them into float32 silently.
  for (const auto& [t, what] : {std::pair{&query, "query"}, {&key, "key"}, {&value, "value"}}) {
    if (!is_floating(t->dtype())) {
      fail<DTypeError>(kOp, ": ", what, " must be float32, float64, float16 or bfloat16, got ", dtype_name(t->dtype()),
                       " ", shape_str(t->shape()));
    }
  }
  // Unbatched inputs become [L, 1, E] (sequence-first).
  in.bf = in.batched && config_.batch_first;
  in.qi = in.batched ? query : query.unsqueeze(1);
  in.ki = in.batched ? key : key.unsqueeze(1);
  in.vi = in.batched ? value : value.unsqueeze(1);
  in.n = in.qi.size(in.bf ? 0 : 1), in.l = in.qi.size(in.bf ? 1 : 0), in.s = in.ki.size(in.bf ? 1 : 0);
  if (in.ki.shape().front() != in.vi.shape().front() || in.ki.size(1) != in.vi.size(1) ||
      in.ki.size(in.bf ? 0 : 1) != in.n) {
    fail<ShapeError>(kOp, ": key ", shape_str(key.shape()), " and value ", shape_str(value.shape()),
                     " must match each other and query ", shape_str(query.shape()), " in batch and length");
  }
  in.self = same_tensor(query, key) && same_tensor(key, value);
  in.kv_shared = same_tensor(key, value);
  return in;
}

AttentionOptions MultiheadAttention::attention_options(const MultiheadAttentionOptions& o, const Prepared& in,
                                                       int64_t extra) const {
  const int64_t h = config_.num_heads;
  std::optional<Tensor> mask = combined_mask(o, in.batched, in.n, h, in.l, in.s, extra);  // [1|N, 1|H, L, S']
  bool causal = false;
  if (o.is_causal) {
    if (!o.attn_mask) fail<ValueError>(kOp, ": Need attn_mask if specifying the is_causal hint.");
    if (!o.key_padding_mask && !o.need_weights) {  // PyTorch then trusts the hint
      causal = true;
      mask.reset();
    }
  }
  AttentionOptions ao;
  ao.attn_mask = mask;
  ao.is_causal = causal;
  ao.matmul_precision = o.attention.matmul_precision;
  if (o.mods.any()) {
    if (extra > 0) fail<ValueError>(kOp, ": mods cannot be combined with add_bias_kv / add_zero_attn");
    ao.mods = o.mods;
  }
  if (training && config_.dropout > 0) {
    ao.dropout_p = config_.dropout;
    ao.seed = dropout_seed;
  }
  return ao;
}

MultiheadAttentionResult MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                                     const MultiheadAttentionOptions& o) const {
  const std::vector<Shape> inputs{query.shape(), key.shape(), value.shape()};  // named in out-of-memory errors
  const AllocationScope scope("MultiheadAttention.forward", {}, inputs, "query, key, value");
  const Prepared in = prepare(query, key, value);
  const int64_t h = config_.num_heads, d = head_dim();
  // ---- projections: [L, N, E] (or [N, L, E]) ----
  Tensor qp, kp, vp;
  project(in.qi, in.ki, in.vi, in.self, in.kv_shared, qp, kp, vp);
  const Tensor qh = detail::split_heads(qp, h, in.bf);  // [N, H, L, D]
  Tensor kh = detail::split_heads(kp, h, in.bf);        // [N, H, S, D]
  Tensor vh = detail::split_heads(vp, h, in.bf);        // [N, H, S, D]
  if (o.attention.kind != AttentionKind::softmax) {
    const Tensor heads = variant_heads(o, same_tensor(query, key), training && config_.dropout > 0,
                                       config_.add_bias_kv || config_.add_zero_attn, qh, kh, vh);  // [N, H, L, D]
    const Tensor merged = detail::merge_heads(heads, in.bf);
    if (calibrating_) calibrating_->o.observe(merged);
    MultiheadAttentionResult result;
    result.output = out_.forward(merged);
    if (!in.batched) result.output = result.output.squeeze(1);
    return result;
  }
  int64_t extra = 0;
  if (config_.add_bias_kv) {
    kh = detail::append_key_row(kh, params_.at("bias_k").reshape({h, d}));
    vh = detail::append_key_row(vh, params_.at("bias_v").reshape({h, d}));
    ++extra;
  }
  if (config_.add_zero_attn) {
    kh = detail::append_key_row(kh, std::nullopt);
    vh = detail::append_key_row(vh, std::nullopt);
    ++extra;
  }
  // ---- attention ----
  AttentionOptions ao = attention_options(o, in, extra);
  ao.return_weights = o.need_weights;
  const AttentionResult r = scaled_dot_product_attention(qh, kh, vh, ao);  // output [N, H, L, D]
  MultiheadAttentionResult result;
  const Tensor merged = detail::merge_heads(r.output, in.bf);  // [L, N, E] or [N, L, E]
  if (calibrating_) calibrating_->o.observe(merged);
  result.output = out_.forward(merged);
  if (!in.batched) result.output = result.output.squeeze(1);
  if (o.need_weights) {
    Tensor w = o.average_attn_weights ? mean_heads(*r.weights) : *r.weights;  // [N, L, S'] / [N, H, L, S']
    result.weights = in.batched ? w : w.squeeze(0);
  }
  return result;
}

}  // namespace qkv::nn
