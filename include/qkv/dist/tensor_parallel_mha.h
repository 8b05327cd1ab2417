// Tensor-parallel multi-head attention (Megatron-LM; Shoeybi et al. 2019): the heads are
// split over ranks. The query, key and value projections are column-parallel (each rank
// keeps the weight rows of its heads, so no communication), attention runs on the local
// heads, and the output projection is row-parallel (each rank keeps the weight columns of
// its heads) followed by one all-reduce of the [L, N, E] output; its bias is added once.
//
// Heads: with Hk >= P the key/value heads are split evenly over ranks (the first Hk % P
// one more) and each rank takes the Hq/Hk query heads of each; with Hk < P the query
// heads are split evenly and each rank keeps a copy of the key/value heads its query heads
// use (replicated, as Megatron does when there are fewer KV heads than ranks).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>

#include "qkv/dist/communicator.h"
#include "qkv/nn/linear.h"
#include "qkv/nn/mha.h"

namespace qkv::dist {

class CallSignature;  // dist/internal.h

struct TensorParallelAttentionConfig {
  int64_t embed_dim = 0;     // E: model width (inputs and output)
  int64_t num_heads = 1;     // Hq
  int64_t num_kv_heads = 0;  // Hk (GQA/MQA); 0: num_heads
  int64_t head_dim = 0;      // D; 0: embed_dim / num_heads
  bool batch_first = false;  // inputs [N, L, E] instead of [L, N, E]
};

struct TensorParallelOptions {
  bool is_causal = false;
  // SDPA's mask (bool True = attend, or additive): [L, S] or [N, Hq, L, S] (every head;
  // each rank uses its heads' rows).
  std::optional<Tensor> attn_mask;
};

// Gradients of TensorParallelAttention::backward.
struct TensorParallelGradients {
  Tensor query, key, value;  // d loss / d input, summed over ranks (every rank has them)
  // This rank's shards, named as from_projections' state_dict: q_proj.weight [hq D, E],
  // k_proj.weight / v_proj.weight [hk D, Ek/Ev] (with .bias when the layer has biases),
  // o_proj.weight [E, hq D] (its columns of this rank's heads), o_proj.bias [E] (whole).
  std::map<std::string, Tensor> params;
};

// Every member that communicates is collective: every rank of the communicator calls it, with
// the same arguments but its own shard. Each starts with an agreement step (qkv/dist/communicator.h,
// refuse_call): a rank that refuses its arguments (the factories: a weight of the wrong shape; forward:
// an input of the wrong width or dtype) makes every rank fail at once with an error naming it and
// quoting its reason, and ranks called differently (their configurations, weights' shapes, a sample
// of their weights' values, the inputs' shapes and dtypes, is_causal, the mask) fail naming what
// differs, instead of a rank waiting QKV_DIST_TIMEOUT in the all-reduce.
class TensorParallelAttention {
 public:
  // Collective. torch.nn.MultiheadAttention's state_dict (in_proj_weight, or q/k/v_proj_weight when
  // kdim/vdim differ; in_proj_bias; out_proj.weight, out_proj.bias): this rank's share.
  // ValueError for add_bias_kv / add_zero_attn layers (not split here).
  static TensorParallelAttention from_torch_mha(const nn::MultiheadAttentionConfig& config,
                                                const std::map<std::string, Tensor>& state_dict,
                                                const Communicator& comm);
  // Collective. Separate projections as Llama/Hugging Face name them: q_proj.weight [Hq D, E],
  // k_proj.weight / v_proj.weight [Hk D, E], o_proj.weight [E, Hq D], each ".bias" optional.
  static TensorParallelAttention from_projections(const TensorParallelAttentionConfig& config,
                                                  const std::map<std::string, Tensor>& state_dict,
                                                  const Communicator& comm);

  // This rank's share, named as from_projections' state_dict (q_proj.weight [hq D, E],
  // k_proj.weight / v_proj.weight [hk D, Ek/Ev], biases, o_proj.weight [E, hq D], o_proj.bias
  // [E]): save it per rank (io::save) and load it back on as many ranks with from_shard,
  // without reading the whole layer on every rank.
  std::map<std::string, Tensor> shard_state_dict() const;
  // Collective (the shards differ; the configuration and o_proj.bias must not).
  static TensorParallelAttention from_shard(const TensorParallelAttentionConfig& config,
                                            const std::map<std::string, Tensor>& shard, const Communicator& comm);

  // query [L, N, E] (or [N, L, E]), key/value [S, N, Ek/Ev]: the full layer output on every
  // rank (float32), equal to the unsplit layer's.
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const TensorParallelOptions& options = {}) const;

  // Backward of forward(query, key, value, options) given grad_output = d loss / d output (the
  // output's shape, the same on every rank): the row-parallel output projection's backward
  // needs no communication, the column-parallel projections' input gradients are summed over
  // ranks by one all-reduce each (Megatron's f/g pair). When query, key and value are one
  // tensor, its gradient is the sum of the three. tensor_parallel_mha_backward.cc.
  TensorParallelGradients backward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& grad_output, const TensorParallelOptions& options = {}) const;

  int64_t first_head() const { return q0_; }  // this rank's query heads: [first, first + local)
  int64_t local_heads() const { return hq_local_; }
  const Communicator& communicator() const { return comm_; }

 private:
  TensorParallelAttention(const TensorParallelAttentionConfig& config, const Communicator& comm);
  // The local attention of forward, with what backward needs.
  struct Local {
    Tensor q, k, v;     // [N, hq, L, D], [N, hk or hq, S, D] (copies per query head when not aligned)
    Tensor heads, lse;  // [N, hq, L, Dv], [N, hq, L]
    Tensor merged;      // [L, N, hq D] (or [N, L, hq D])
    AttentionOptions options;
  };
  Local attend(const Tensor& query, const Tensor& key, const Tensor& value, const TensorParallelOptions& options) const;
  // Collective: every rank checks its call and all agree on it (dist/internal.h agree_on_call).
  // signature(): the layer's configuration, for that agreement.
  void check_inputs(const char* op, const Tensor& query, const Tensor& key, const Tensor& value,
                    const TensorParallelOptions& options, const std::function<void()>& more_checks = {}) const;
  CallSignature signature() const;
  bool aligned() const;                  // SDPA's GQA grouping matches this rank's heads
  int64_t key_head_of(int64_t i) const;  // local key head of local query head i
  void load(const Tensor& wq, const Tensor& wk, const Tensor& wv, const Tensor& wo,
            const std::map<std::string, std::optional<Tensor>>& biases);

  TensorParallelAttentionConfig config_;
  Communicator comm_;
  int64_t q0_ = 0, hq_local_ = 0, k0_ = 0, hk_local_ = 0;
  nn::Linear q_, k_, v_, o_;      // this rank's rows of q/k/v, columns of o (no bias)
  std::optional<Tensor> o_bias_;  // [E], added after the all-reduce
};

}  // namespace qkv::dist
