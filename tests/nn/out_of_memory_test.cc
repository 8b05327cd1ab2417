// Out of memory in a layer names the layer's call and its inputs' shapes (qkv/out_of_memory.h).
#include <gtest/gtest.h>

#include "common/expect.h"
#include "common/limit_guard.h"
#include "qkv/nn/keras_mha.h"
#include "qkv/nn/mha.h"
#include "qkv/nn/seed_layers.h"

namespace qkv::nn {
namespace {

TEST(LayerOutOfMemory, ForwardNamesTheLayerAndItsInputs) {
  MultiheadAttentionConfig c;
  c.embed_dim = 8;
  c.num_heads = 2;
  c.batch_first = true;
  const MultiheadAttention mha(c);
  const SelfAttention self_attention(8);
  const Tensor x = Tensor::ones({1, 64, 8}), kv = Tensor::ones({1, 16, 8});
  const LimitGuard limit(size_t{1} << 10);  // the [1, 64, 24] f32 projection needs 6 KiB
  EXPECT_THROW_WITH(mha.forward(x, kv, kv), OutOfMemoryError,
                    "MultiheadAttention.forward (query [1, 64, 8], key [1, 16, 8], value [1, 16, 8]): ");
  EXPECT_THROW_WITH(self_attention.forward(x), OutOfMemoryError, "SelfAttention.forward (x [1, 64, 8]): ");
}

TEST(LayerOutOfMemory, ConstructorsNameTheLayer) {
  MultiheadAttentionConfig c;
  c.embed_dim = 64;
  c.num_heads = 2;
  const LimitGuard limit(size_t{1} << 10);  // a [192, 64] f32 in_proj_weight needs 48 KiB
  EXPECT_THROW_WITH(MultiheadAttention{c}, OutOfMemoryError, "MultiheadAttention: ");
  EXPECT_THROW_WITH(SelfAttention(64), OutOfMemoryError, "SelfAttention: ");
  EXPECT_THROW_WITH(LazyMultiHeadAttention(64, 2), OutOfMemoryError, "LazyMultiHeadAttention: ");
}

}  // namespace
}  // namespace qkv::nn
