// Devices in Storage, the allocator registry, and the device checks of the ops:
// a fake "cuda:0" (host memory flagged as device memory) exercises every check
// without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "common/expect.h"
#include "common/limit_guard.h"
#include "qkv/allocator.h"
#include "qkv/attention.h"
#include "qkv/device.h"
#include "qkv/einops.h"
#include "qkv/einsum.h"
#include "qkv/nn/linear.h"
#include "qkv/softmax.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

// Host memory that qkv must treat as another device's; counts its calls and can refuse.
class FakeDeviceAllocator final : public Allocator {
 public:
  void* allocate(size_t nbytes) override {
    if (refuse) return nullptr;
    ++allocations;
    return std::aligned_alloc(Storage::kAlignment, (nbytes / Storage::kAlignment + 1) * Storage::kAlignment);
  }
  void deallocate(void* p, size_t) noexcept override {
    ++deallocations;
    std::free(p);
  }
  std::atomic<int> allocations{0}, deallocations{0};
  bool refuse = false;
};

// Registers the fake allocator for cuda:0 during one test.
class FakeCuda : public ::testing::Test {
 protected:
  void SetUp() override { register_allocator(Device::cuda(0), &fake_); }
  void TearDown() override { register_allocator(Device::cuda(0), nullptr); }
  static Tensor on_gpu(const Shape& shape) { return Tensor::empty(shape, DType::f32, Device::cuda(0)); }
  FakeDeviceAllocator fake_;
};

TEST(Device, NamesRoundTripAndBadNamesAreAValueError) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda:0"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:12"), Device::cuda(12));
  for (const Device d : {Device::cpu(), Device::cuda(0), Device::cuda(3)}) EXPECT_EQ(Device::parse(d.to_string()), d);
  EXPECT_EQ(Device::cuda(1).to_string(), "cuda:1");
  EXPECT_NE(Device::cuda(0), Device::cuda(1));
  for (const char* bad :
       {"", "gpu", "cuda", "cuda:", "cuda:-1", "cuda:+1", "cuda:1x", "CPU", "cpu:0", "cuda:99999999999"}) {
    EXPECT_THROW_WITH(Device::parse(bad), ValueError, "is not a device (expected 'cpu' or 'cuda:N')");
  }
  EXPECT_THROW(Device::cuda(-1), ValueError);
}

TEST(Device, TensorsAndStoragesAreOnTheCpuByDefault) {
  const Tensor t = Tensor::zeros({2, 3});
  EXPECT_EQ(t.device(), Device::cpu());
  EXPECT_EQ(Storage::allocate(16)->device(), Device::cpu());
  EXPECT_EQ(&allocator_for(Device::cpu()), &cpu_allocator());
  void* p = cpu_allocator().allocate(1);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % Storage::kAlignment, 0u);
  cpu_allocator().deallocate(p, 1);
  EXPECT_THROW_WITH(register_allocator(Device::cpu(), &cpu_allocator()), ValueError, "cannot be replaced");
}

TEST(Device, AnUnservedDeviceIsADeviceErrorNamingTheOpAndTheDevice) {
  EXPECT_THROW_WITH(Tensor::empty({2}, DType::f32, Device::cuda(7)), DeviceError,
                    "Tensor::empty: no allocator for device cuda:7");
  EXPECT_THROW_WITH(Storage::allocate(8, "buffer", Device::cuda(7)), DeviceError,
                    "Storage::allocate: no allocator for device cuda:7");
}

TEST_F(FakeCuda, EmptyAllocatesThroughTheDevicesAllocatorAndViewsKeepTheDevice) {
  {
    const Tensor t = on_gpu({4, 6});
    EXPECT_EQ(t.device(), Device::cuda(0));
    EXPECT_EQ(fake_.allocations.load(), 1);
    EXPECT_EQ(t.slice(0, 1, 3).reshape({12}).permute({0}).device(), Device::cuda(0));  // views: no copy
    EXPECT_EQ(t.permute({1, 0}).expand({2, 6, 4}).device(), Device::cuda(0));
    EXPECT_EQ(t.contiguous().device(), Device::cuda(0));  // already contiguous: itself
    EXPECT_EQ(reinterpret_cast<uintptr_t>(t.raw_data()) % Storage::kAlignment, 0u);
    EXPECT_EQ(fake_.allocations.load(), 1);
  }
  EXPECT_EQ(fake_.deallocations.load(), 1);  // given back to the allocator it came from
  EXPECT_EQ(Storage::allocate(10, "buffer", Device::cuda(0))->device(), Device::cuda(0));
}

TEST_F(FakeCuda, SizesAreCheckedBeforeTheDeviceIsAskedAndARefusalIsOutOfMemory) {
  {
    const LimitGuard limit(size_t{1} << 10);
    EXPECT_THROW_WITH(on_gpu({1024}), OutOfMemoryError, "4096 bytes");
  }
  EXPECT_EQ(fake_.allocations.load(), 0);
  fake_.refuse = true;
  EXPECT_THROW_WITH(on_gpu({8}), OutOfMemoryError, "Tensor::empty: out of memory");
}

// CPU code given a tensor on another device: a DeviceError naming the operation
// and the device, never a read of device memory.
TEST_F(FakeCuda, CpuOnlyTensorMethodsRefuseADeviceTensor) {
  const Tensor g = on_gpu({2, 3}), c = Tensor::zeros({2, 3});
  const char* msg = "no kernel for tensors on cuda:0";
  EXPECT_THROW_WITH(g.clone(), DeviceError, "clone: no kernel for tensors on cuda:0");
  EXPECT_THROW_WITH(g.permute({1, 0}).contiguous(), DeviceError, "clone: ");
  EXPECT_THROW_WITH(g.to(DType::f64), DeviceError, "to: ");
  EXPECT_THROW_WITH(g.fill(1.0), DeviceError, "fill: ");
  EXPECT_THROW_WITH(g.item({0, 0}), DeviceError, "item: ");
  EXPECT_THROW_WITH(g.set_item({0, 0}, 1.0), DeviceError, "set_item: ");
  EXPECT_THROW_WITH(g.at<float>({0, 0}), DeviceError, "at: ");
  EXPECT_THROW_WITH(g.to_vector<float>(), DeviceError, "to_vector: ");
  EXPECT_THROW_WITH(g.to_string(), DeviceError, msg);
  EXPECT_THROW_WITH(c.copy_from(g), DeviceError, "copy_from: tensors on cpu and cuda:0");
  EXPECT_NO_THROW(g.to(DType::f32));  // same dtype: itself, nothing read
}

TEST_F(FakeCuda, OpsRefuseADeviceTensorNamingTheOpAndTheDevice) {
  const Tensor g = on_gpu({1, 2, 4, 8}), c = Tensor::randn({1, 2, 4, 8}, 1);
  EXPECT_THROW_WITH(scaled_dot_product_attention(g, g, g), DeviceError,
                    "scaled_dot_product_attention: no kernel for tensors on cuda:0");
  EXPECT_THROW_WITH(scaled_dot_product_attention(c, g, c), DeviceError,
                    "scaled_dot_product_attention: tensors on cpu and cuda:0 (shapes [1, 2, 4, 8] and [1, 2, 4, 8])");
  AttentionOptions masked;
  masked.attn_mask = Tensor::empty({4, 4}, DType::b8, Device::cuda(0));
  EXPECT_THROW_WITH(scaled_dot_product_attention(c, c, c, masked), DeviceError, "tensors on cpu and cuda:0");
  EXPECT_THROW_WITH(attention_reference(g, g, g), DeviceError, "attention_reference: no kernel for tensors on cuda:0");
  EXPECT_THROW_WITH(einsum("bhij->bhji", {g}), DeviceError, "einsum: no kernel for tensors on cuda:0");
  EXPECT_THROW_WITH(einsum("bhij,bhkj->bhik", {c, g}), DeviceError, "einsum: tensors on cpu and cuda:0");
  EXPECT_THROW_WITH(einops::rearrange(g, "b h i j -> b i (h j)"), DeviceError, "rearrange: no kernel");
  EXPECT_THROW_WITH(einops::reduce(g, "b h i j -> b h", "mean"), DeviceError, "reduce: no kernel");
  EXPECT_THROW_WITH(einops::repeat(g, "b h i j -> b h i j r", {{"r", 2}}), DeviceError, "repeat: no kernel");
  EXPECT_THROW_WITH(einops::einsum({g, g}, "b h i d, b h j d -> b h i j"), DeviceError, "einsum: no kernel");
  EXPECT_THROW_WITH(einops::rearrange(std::vector<Tensor>{c, g}, "n b h i j -> n b h i j"), DeviceError,
                    "tensors on cpu and cuda:0");
  EXPECT_THROW_WITH(einops::pack({c, g}, "b * j"), DeviceError, "pack: tensors on cpu and cuda:0");
  EXPECT_THROW_WITH(einops::unpack(g, {{2}, {4}}, "b * j"), DeviceError, "unpack: no kernel");
  EXPECT_THROW_WITH(softmax(g), DeviceError, "softmax: no kernel for tensors on cuda:0");
  const nn::Linear linear = nn::Linear::torch(Tensor::randn({3, 8}, 2), std::nullopt);
  EXPECT_THROW_WITH(linear.forward(g), DeviceError, "Linear: tensors on cuda:0 and cpu");
  EXPECT_EQ(fake_.deallocations.load(), 0);  // nothing was freed behind the tensors' backs
}

}  // namespace
}  // namespace qkv
