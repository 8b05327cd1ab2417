// The attention layers the seed articles build, with their parameter names.
// All project through nn::Linear and attend through qkv::scaled_dot_product_attention.
// Each has backward(inputs..., grad_output): the gradients of a loss L with respect to the
// inputs and to every parameter (by state_dict name and shape, PyTorch's layout), given
// grad_output = dL/d output; the forward is recomputed (seed_layers_backward.cc) and
// differentiated as PyTorch's autograd does it (masks are constants). Float32.
// load_state_dict is strict as torch's default: ValueError for a missing key or one the layer
// does not have, ShapeError for a misshapen one; a failed load leaves the layer as it was.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "qkv/kv_cache.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/mha.h"
#include "qkv/tensor.h"

namespace qkv::nn {

// Gradients through a layer with one input x (SelfAttention, MultiHeadSelfAttention). The
// layers with q, k, v inputs return MultiheadAttentionGradients (qkv/nn/mha.h: query, key,
// value, params).
struct SelfAttentionGradients {
  Tensor x;                              // d loss / d x, x's shape [B, T, dim]
  std::map<std::string, Tensor> params;  // d loss / d parameter, by state_dict name and shape
};

// Seed 000's single-head SelfAttention: to_qvk Linear(dim, 3*dim, bias=False), split by
// rearrange(qkv, 'b t (d k) -> k b t d', k=3), scores * dim**-0.5, optional mask [T, T]
// (True = masked: masked_fill(mask, -inf)), softmax, weighted values. No output projection.
// state_dict: "to_qvk.weight" [3*dim, dim]. x [B, T, dim] -> [B, T, dim].
class SelfAttention {
 public:
  explicit SelfAttention(int64_t dim, uint64_t seed = 0);
  void load_state_dict(const std::map<std::string, Tensor>& state_dict);
  std::map<std::string, Tensor> state_dict() const;
  Tensor forward(const Tensor& x, const std::optional<Tensor>& mask = std::nullopt) const;
  // Causal self-attention of new tokens x [B, T, dim] against `cache` ([B, 1, capacity, dim]):
  // their keys and values are appended, then each attends every cached position up to its own
  // (prefill with T tokens, then decode one at a time). Equal to forward(x_all, causal mask) over
  // the whole sequence so far (mask[i][j] = j > i). ShapeError for a cache of other sizes.
  // seed_layers_cached.cc.
  Tensor forward(const Tensor& x, KVCache& cache) const;
  // grad_output [B, T, dim]; params {"to_qvk.weight"} in its (d k) row order. ShapeError
  // naming "SelfAttention.backward" for a grad_output of another shape.
  SelfAttentionGradients backward(const Tensor& x, const Tensor& grad_output,
                                  const std::optional<Tensor>& mask = std::nullopt) const;

 private:
  int64_t dim_;
  Tensor to_qvk_;  // [3*dim, dim], PyTorch's row order (d k)
  Linear proj_;    // rows reordered to (k d): q, k, v are contiguous column blocks
};

// Seed 000's MultiHeadSelfAttention: dim_head defaults to dim / heads but may differ;
// to_qvk Linear(dim, 3*heads*dim_head, bias=False) split by 'b t (d k h) -> k b h t d',
// scores scaled by dim_head**-0.5, mask [T, T] (True = masked), merge 'b h t d -> b t (h d)',
// W_0 Linear(heads*dim_head, dim, bias=False).
// state_dict: "to_qvk.weight" [3*H*dh, dim], "W_0.weight" [dim, H*dh]. x [B, T, dim] -> [B, T, dim].
class MultiHeadSelfAttention {
 public:
  MultiHeadSelfAttention(int64_t dim, int64_t heads = 8, std::optional<int64_t> dim_head = std::nullopt,
                         uint64_t seed = 0);
  void load_state_dict(const std::map<std::string, Tensor>& state_dict);
  std::map<std::string, Tensor> state_dict() const;
  Tensor forward(const Tensor& x, const std::optional<Tensor>& mask = std::nullopt) const;
  // As SelfAttention's: causal self-attention against a cache [B, heads, capacity, dim_head].
  Tensor forward(const Tensor& x, KVCache& cache) const;
  // grad_output [B, T, dim]; params {"to_qvk.weight" ((d k h) rows), "W_0.weight"}.
  SelfAttentionGradients backward(const Tensor& x, const Tensor& grad_output,
                                  const std::optional<Tensor>& mask = std::nullopt) const;

 private:
  int64_t dim_, heads_, dim_head_;
  Tensor to_qvk_, w0_;
  Linear proj_, out_;
};

// Seed 003's layer: separate key/query and value head sizes. Bias-free projections
// W_q, W_k: E -> H*Dkq, W_v: E -> H*Dv; scores Q K^T * scale (scale = 1/sqrt(Dkq) unless
// given); causal = upper-triangular -inf mask; W_o: H*Dv -> E. Queries, keys and values are
// separate inputs (Lq != Lk allowed). Dkq and Dv default to embed_dim / n_heads; then
// embed_dim < n_heads (head size 0) is a ValueError. Explicit sizes allow E < H, as in the
// article's example (B=15, U=50, E=4, H=8, Dkq=64, Dv=32).
// state_dict: "W_q.weight" [H*Dkq, E], "W_k.weight", "W_v.weight" [H*Dv, E], "W_o.weight" [E, H*Dv].
struct SeparateHeadsAttentionResult {
  Tensor output;  // [B, Lq, E]
  Tensor scores;  // [B, H, Lq, Lk], the softmax weights
};
class SeparateHeadsAttention {
 public:
  SeparateHeadsAttention(int64_t embed_dim, int64_t n_heads, std::optional<int64_t> d_kq = std::nullopt,
                         std::optional<int64_t> d_v = std::nullopt, std::optional<double> scale = std::nullopt,
                         bool causal = false, uint64_t seed = 0);
  void load_state_dict(const std::map<std::string, Tensor>& state_dict);
  std::map<std::string, Tensor> state_dict() const;
  // q [B, Lq, E], k [B, Lk, E], v [B, Lk, E].
  SeparateHeadsAttentionResult forward(const Tensor& q, const Tensor& k, const Tensor& v) const;
  // Self-attention of new tokens x [B, T, E] against `cache` ([B, H, capacity, Dkq], values Dv):
  // their keys and values appended, each attending the cached positions up to its own, with the
  // layer's scale: equal to forward(x_all, x_all, x_all).output over the sequence so far. Only for
  // a causal layer (ValueError otherwise: the non-causal forward lets each token see later
  // ones, which a cache cannot give). Output [B, T, E] (no scores).
  Tensor forward(const Tensor& x, KVCache& cache) const;
  // grad_output [B, Lq, E] is the gradient of the output only (the scores are not
  // differentiated). Returns d q, d k, d v and W_q/W_k/W_v/W_o.weight's gradients.
  MultiheadAttentionGradients backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& grad_output) const;

 private:
  void rebuild();
  int64_t e_, h_, dkq_, dv_;
  std::optional<double> scale_;
  bool causal_;
  std::map<std::string, Tensor> params_;
  Linear wq_, wk_, wv_, wo_;
};

// Seed 004's layer (no forward against a KV cache: its attention is never causal, so decoding
// token by token could not equal its forward): q, k, v arrive with feature sizes d_q, d_k, d_v, each projected to the
// hidden size D by a LazyLinear whose input size is fixed by the first call (or by
// load_state_dict); heads split the feature axis ('batch seq (heads eachhead) -> ...'),
// attention per (batch, head), merge '(batch heads) numq eachhead -> batch numq (heads
// eachhead)', then W_o Linear(D, D). Linear layers have biases (PyTorch's defaults).
// A later call with other feature sizes is a ShapeError naming the sizes fixed before.
// state_dict: "W_q.weight" [D, d_q], "W_q.bias" [D], likewise W_k, W_v; "W_o.weight" [D, D], "W_o.bias".
class LazyMultiHeadAttention {
 public:
  LazyMultiHeadAttention(int64_t hidden, int64_t heads, uint64_t seed = 0);
  void load_state_dict(const std::map<std::string, Tensor>& state_dict);
  std::map<std::string, Tensor> state_dict() const;  // empty W_q/W_k/W_v before the first call
  bool materialized() const { return wq_.defined(); }
  // q [B, Lq, d_q], k [B, Lk, d_k], v [B, Lk, d_v] -> [B, Lq, D]. Initialises the lazy
  // weights (PyTorch's kaiming-uniform bounds, from the seed) on the first call.
  Tensor forward(const Tensor& q, const Tensor& k, const Tensor& v);
  // grad_output [B, Lq, D]: d q, d k, d v and the gradients of every weight and bias
  // ("W_k.bias"'s is exactly 0: it shifts whole score rows, which softmax ignores).
  // ValueError before the layer is materialized (a forward call or load_state_dict).
  MultiheadAttentionGradients backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                       const Tensor& grad_output) const;

 private:
  void check_inputs(const Tensor& q, const Tensor& k, const Tensor& v) const;
  void rebuild();
  int64_t hidden_, heads_;
  uint64_t seed_;
  std::map<std::string, Tensor> params_;
  Linear wq_, wk_, wv_, wo_;
};

}  // namespace qkv::nn
