// The CUDA runtime on a GPU (ctest label cuda): device memory, copies both ways and on
// the device (the copy engine's GPU side), streams, and the attention kernel's errors
// and layouts it copies first.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <optional>

#include "common/relative_error.h"
#include "qkv/additive_attention.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/cuda.h"
#include "qkv/einops.h"
#include "qkv/einsum.h"
#include "qkv/kv_cache.h"
#include "qkv/linear_attention.h"
#include "qkv/lsh_attention.h"
#include "qkv/rotary.h"
#include "qkv/softmax.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

using testing::max_abs_error;

class CudaRuntime : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_FAIL() << "no GPU: run these tests only where one is (ctest -L cuda)";
  }
};

TEST_F(CudaRuntime, PropertiesNameTheGpu) {
  const cuda::DeviceProperties p = cuda::properties(0);
  EXPECT_FALSE(p.name.empty());
  EXPECT_GE(p.major, 8);  // the kernels need sm_80 or later
  EXPECT_GT(p.multiprocessors, 0);
  EXPECT_GT(p.driver_version, 0);
  std::printf("GPU: %s, sm_%d%d, %d SMs, %.1f GiB, driver %d, runtime %d\n", p.name.c_str(), p.major, p.minor,
              p.multiprocessors, static_cast<double>(p.total_memory) / (1 << 30), p.driver_version, p.runtime_version);
  EXPECT_THROW(cuda::properties(cuda::device_count()), DeviceError);
}

TEST_F(CudaRuntime, RoundTripIsExact) {
  const Tensor x = Tensor::randn({3, 5, 7}, 1, DType::f32);
  const Tensor d = x.to(Device::cuda());
  EXPECT_EQ(d.device(), Device::cuda());
  EXPECT_EQ(d.to(Device::cuda()).raw_data(), d.raw_data());  // already there: no copy
  EXPECT_EQ(max_abs_error(d.to(Device::cpu()), x), 0.0);
}

TEST_F(CudaRuntime, StridedViewsCopyOnTheDevice) {
  const Tensor x = Tensor::randn({4, 6, 10}, 2, DType::bf16);
  const Tensor view = x.to(Device::cuda()).permute({2, 0, 1}).slice(1, 1, 4);  // [10, 3, 6], strided
  const Tensor back = view.contiguous().to(Device::cpu());
  EXPECT_EQ(max_abs_error(back, x.permute({2, 0, 1}).slice(1, 1, 4)), 0.0);
  const Tensor broadcast = Tensor::randn({1, 6}, 3).to(Device::cuda()).expand({5, 6}).clone();
  EXPECT_EQ(max_abs_error(broadcast.to(Device::cpu()), Tensor::randn({1, 6}, 3).expand({5, 6})), 0.0);
}

TEST_F(CudaRuntime, WorkFollowsTheStreamGuard) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  {
    const cuda::StreamGuard guard(s);
    EXPECT_EQ(cuda::current_stream(), s);
    const Tensor x = Tensor::randn({64, 64}, 4).to(Device::cuda());
    const Tensor y = x.permute({1, 0}).contiguous();
    cuda::synchronize();
    EXPECT_EQ(max_abs_error(y.to(Device::cpu()), Tensor::randn({64, 64}, 4).permute({1, 0})), 0.0);
  }
  EXPECT_EQ(cuda::current_stream(), nullptr);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

// Freed blocks stay in qkv's pool (cudaMallocFromPoolAsync, a release threshold of
// "never") and serve the next allocation of their size without growing it; empty_cache
// returns them to the device.
TEST_F(CudaRuntime, FreedMemoryIsCachedThenReturned) {
  constexpr uint64_t kBytes = uint64_t{64} << 20;
  cuda::empty_cache();
  const cuda::MemoryStats before = cuda::memory_stats();
  ASSERT_TRUE(before.caching) << "QKV_CUDA_ALLOC=plain or a GPU without memory pools";
  uint64_t reserved = 0;
  {
    const Tensor x = Tensor::empty({static_cast<int64_t>(kBytes / 4)}, DType::f32, Device::cuda());
    const cuda::MemoryStats live = cuda::memory_stats();
    EXPECT_EQ(live.allocated, before.allocated + kBytes);
    EXPECT_GE(live.reserved, before.reserved + kBytes);
    reserved = live.reserved;
  }
  EXPECT_EQ(cuda::memory_stats().allocated, before.allocated);
  EXPECT_EQ(cuda::memory_stats().reserved, reserved);  // cached, not returned
  for (int i = 0; i < 10; ++i) {
    const Tensor y = Tensor::empty({static_cast<int64_t>(kBytes / 4)}, DType::f32, Device::cuda());
    EXPECT_EQ(cuda::memory_stats().reserved, reserved) << "allocation " << i << " grew the pool";
  }
  cuda::empty_cache();
  EXPECT_LT(cuda::memory_stats().reserved, reserved);
  EXPECT_THROW(cuda::empty_cache(cuda::device_count()), DeviceError);
}

// A block allocated on a stream goes back to the pool on that stream, also when
// another stream is current at the free; the data survive the round trip.
TEST_F(CudaRuntime, BlocksGoBackOnTheirStream) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  std::optional<Tensor> x;
  {
    const cuda::StreamGuard guard(s);
    x = Tensor::randn({256, 64}, 6).to(Device::cuda());
  }
  const Tensor back = x->to(Device::cpu());  // on the legacy stream, which waits for s
  EXPECT_EQ(max_abs_error(back, Tensor::randn({256, 64}, 6)), 0.0);
  x.reset();
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(CudaRuntime, AttentionRefusesWhatItHasNoKernelFor) {
  const Tensor q = Tensor::randn({1, 2, 8, 64}, 5, DType::bf16).to(Device::cuda());
  AttentionOptions dropout;
  dropout.dropout_p = 0.1;
  EXPECT_THROW(scaled_dot_product_attention(q, q, q, dropout), ValueError);
  const Tensor f32 = Tensor::randn({1, 2, 8, 64}, 5).to(Device::cuda());
  EXPECT_THROW(scaled_dot_product_attention(f32, f32, f32), DTypeError);
  const Tensor d32 = Tensor::randn({1, 2, 8, 32}, 5, DType::bf16).to(Device::cuda());
  EXPECT_THROW(scaled_dot_product_attention(d32, d32, d32), ValueError);
  EXPECT_THROW(scaled_dot_product_attention(q, q.to(Device::cpu()), q), DeviceError);
}

TEST_F(CudaRuntime, AttentionCopiesMisalignedRowsFirst) {
  // Rows starting one element past 16 bytes, and a transposed layout: both are copied
  // to the kernel's layout on the device, and the result is the same.
  const Tensor wide = Tensor::randn({1, 2, 40, 72}, 6, DType::bf16);
  const Tensor q = wide.slice(3, 1, 65);                                                 // [1, 2, 40, 64]
  const Tensor k = Tensor::randn({1, 40, 2, 64}, 7, DType::bf16).permute({0, 2, 1, 3});  // [1, 2, 40, 64]
  const Tensor v = Tensor::randn({1, 2, 40, 64}, 8, DType::bf16);
  const Tensor got =
      scaled_dot_product_attention(q.to(Device::cuda()).clone(), k.to(Device::cuda()), v.to(Device::cuda()))
          .output.to(Device::cpu());
  const Tensor misaligned = wide.to(Device::cuda()).slice(3, 1, 65);
  const Tensor got2 =
      scaled_dot_product_attention(misaligned, k.to(Device::cuda()), v.to(Device::cuda())).output.to(Device::cpu());
  const Tensor want = attention_reference(q.to(DType::f64), k.to(DType::f64), v.to(DType::f64)).output;
  EXPECT_LE(max_abs_error(got, want), 2e-2);
  EXPECT_EQ(max_abs_error(got, got2), 0.0);
}

// Operations with host kernels only, given tensors on a real GPU (clone and contiguous
// work there, so an op that copied first and then looped on the host would read device
// memory): a DeviceError naming the op, never a crash.
TEST_F(CudaRuntime, HostOnlyOpsRefuseGpuTensors) {
  const Tensor g = Tensor::randn({1, 2, 8, 16}, 9).to(Device::cuda());  // [B, H, L, D] float32
  const Tensor gb = Tensor::randn({1, 2, 8, 64}, 9, DType::bf16).to(Device::cuda());
  EXPECT_THROW(softmax(g), DeviceError);
  EXPECT_THROW(einsum("bhid,bhjd->bhij", {g, g}), DeviceError);
  EXPECT_THROW(einops::rearrange(g, "b h l d -> b l (h d)"), DeviceError);
  EXPECT_THROW(additive_attention(g, g, g), DeviceError);
  EXPECT_THROW(linear_attention(g, g, g), DeviceError);
  EXPECT_THROW(lsh_attention(g, g), DeviceError);
  EXPECT_THROW(apply_rotary(g), DeviceError);
  EXPECT_THROW(apply_rotary_reference(g), DeviceError);
  EXPECT_THROW(attention_reference(gb, gb, gb), DeviceError);
  EXPECT_THROW(attention_backward_reference(gb, gb, gb, gb), DeviceError);
  KVCacheConfig config;
  config.batch = 1;
  config.kv_heads = 2;
  config.head_dim = 16;
  config.capacity = 16;
  KVCache cache(config);
  EXPECT_THROW(cache.append(g, g), DeviceError);
  const Tensor host = Tensor::randn({1, 2, 8, 16}, 10);
  cache.append(host, host);
  EXPECT_THROW(decode_attention(g.slice(2, 0, 1), cache), DeviceError);
}

}  // namespace
}  // namespace qkv
