// MultiheadAttention::forward(x, cache) (qkv/nn/mha.h): self-attention of new tokens against
// a KV cache, for prefill and token-by-token decoding (issue 17 item 3).
#include "nn/heads.h"
#include "qkv/error.h"
#include "qkv/kv_cache.h"
#include "qkv/nn/mha.h"

namespace qkv::nn {

MultiheadAttentionResult MultiheadAttention::forward(const Tensor& x, KVCache& cache) const {
  constexpr const char* kOp = "MultiheadAttention.forward (cache)";
  if (config_.add_bias_kv || config_.add_zero_attn) {
    fail<ValueError>(kOp, ": add_bias_kv and add_zero_attn layers cannot decode against a cache");
  }
  if (training && config_.dropout > 0.0) fail<ValueError>(kOp, ": decoding is eval-only (dropout set, training)");
  if (quantized_) fail<ValueError>(kOp, ": the layer is quantized; decode with the float32 layer");
  const Prepared in = prepare(x, x, x);  // self-attention: [L, N, E] or [N, L, E]
  const int64_t h = config_.num_heads, d = head_dim();
  detail::check_cache(cache, kOp, in.n, h, d, d);
  Tensor qp, kp, vp;  // [L, N, E] (or [N, L, E]), one packed GEMM
  project(in.qi, in.ki, in.vi, true, true, qp, kp, vp);
  cache.append(detail::split_heads(kp, h, in.bf), detail::split_heads(vp, h, in.bf));  // [N, H, L, D] each
  // the L new queries sit at the end of each sequence: causal over everything cached before them
  const AttentionResult r = decode_attention(detail::split_heads(qp, h, in.bf), cache);  // [N, H, L, D]
  MultiheadAttentionResult result;
  result.output = out_.forward(detail::merge_heads(r.output, in.bf));
  if (!in.batched) result.output = result.output.squeeze(1);
  return result;
}

}  // namespace qkv::nn
