// The seed layers' forward against a KV cache (qkv/nn/seed_layers.h; issue 17 item 3): prefill,
// then token-by-token decoding, each equal to the layer's full causal forward.
#include <cmath>

#include "nn/heads.h"
#include "nn/seed_layers_internal.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/nn/seed_layers.h"

namespace qkv::nn {

namespace {

// Appends the new keys and values k [B, H, T, D], v [B, H, T, Dv], then the T new queries
// q [B, H, T, D] attend everything cached up to their own positions -> [B, H, T, Dv].
Tensor attend_cached(const Tensor& q, const Tensor& k, const Tensor& v, KVCache& cache, double scale) {
  cache.append(k, v);
  DecodeOptions o;
  o.scale = scale;
  return decode_attention(q, cache, o).output;
}

double inverse_sqrt(int64_t d) { return 1.0 / std::sqrt(static_cast<double>(d)); }

}  // namespace

Tensor SelfAttention::forward(const Tensor& x, KVCache& cache) const {
  constexpr const char* kOp = "SelfAttention.forward (cache)";
  detail::check_3d(x, dim_, kOp, "x");
  detail::check_cache(cache, kOp, x.size(0), 1, dim_, dim_);
  const Tensor qkv = proj_.forward(x).view({x.size(0), x.size(1), 3, dim_});              // [B, T, 3, dim]
  auto part = [&](int64_t i) { return qkv.select(2, i).unsqueeze(1); };                   // [B, 1, T, dim]
  return attend_cached(part(0), part(1), part(2), cache, inverse_sqrt(dim_)).squeeze(1);  // [B, T, dim]
}

Tensor MultiHeadSelfAttention::forward(const Tensor& x, KVCache& cache) const {
  constexpr const char* kOp = "MultiHeadSelfAttention.forward (cache)";
  detail::check_3d(x, dim_, kOp, "x");
  detail::check_cache(cache, kOp, x.size(0), heads_, dim_head_, dim_head_);
  const int64_t b = x.size(0), t = x.size(1);
  const Tensor qkv = proj_.forward(x).view({b, t, 3, heads_, dim_head_});         // [B, T, 3, H, dh]
  auto part = [&](int64_t i) { return qkv.select(2, i).permute({0, 2, 1, 3}); };  // [B, H, T, dh]
  const Tensor heads = attend_cached(part(0), part(1), part(2), cache, inverse_sqrt(dim_head_));
  return out_.forward(detail::merge_heads(heads, true));  // 'b h t d -> b t (h d)', W_0
}

Tensor SeparateHeadsAttention::forward(const Tensor& x, KVCache& cache) const {
  constexpr const char* kOp = "SeparateHeadsAttention.forward (cache)";
  if (!causal_) {
    fail<ValueError>(kOp,
                     ": the layer is not causal (causal = false: every token sees the later ones), so it cannot "
                     "decode against a cache; build it with causal = true");
  }
  detail::check_3d(x, e_, kOp, "x");
  detail::check_cache(cache, kOp, x.size(0), h_, dkq_, dv_);
  const Tensor heads = attend_cached(detail::split_heads(wq_.forward(x), h_, true),  // [B, H, T, Dkq]
                                     detail::split_heads(wk_.forward(x), h_, true),  // [B, H, T, Dkq]
                                     detail::split_heads(wv_.forward(x), h_, true),  // [B, H, T, Dv]
                                     cache, scale_.value_or(inverse_sqrt(dkq_)));
  return wo_.forward(detail::merge_heads(heads, true));  // [B, T, E]
}

}  // namespace qkv::nn
