// Head split/merge and mask helpers shared by the attention layers (views where possible).
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/kv_cache.h"
#include "qkv/tensor.h"

namespace qkv::nn::detail {

// x [L, N, H*D] (or [N, L, H*D] when batch_first) -> view [N, H, L, D].
Tensor split_heads(const Tensor& x, int64_t heads, bool batch_first);
// o [N, H, L, D] -> contiguous [L, N, H*D] (or [N, L, H*D] when batch_first).
Tensor merge_heads(const Tensor& o, bool batch_first);
// k [N, H, S, D] -> [N, H, S+1, D] with `row` [H, D] (zeros when absent) appended.
Tensor append_key_row(const Tensor& k, const std::optional<Tensor>& row);
// A mask as an additive f32 tensor (contiguous): bool -> 0 where attended, -inf where
// masked (`true_masks`: True = masked, else True = attend); float -> itself, as f32.
Tensor additive_mask(const Tensor& m, bool true_masks, const char* what);
// a + b with numpy broadcasting, both f32 (contiguous result).
Tensor add_broadcast(const Tensor& a, const Tensor& b);
// m [..., S] -> [..., S + extra], the new columns filled with `value`.
Tensor pad_last(const Tensor& m, int64_t extra, float value);
// A layer's forward against a KV cache needs a cache [n, h, capacity, d] with values dv:
// ShapeError naming `op` otherwise.
void check_cache(const KVCache& cache, const char* op, int64_t n, int64_t h, int64_t d, int64_t dv);

}  // namespace qkv::nn::detail
