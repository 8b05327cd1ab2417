// detail::transpose_tile and detail::stream_copy, the Highway pieces of
// the copy engine, on every SIMD target this CPU supports against plain loops: each
// element width, sizes around the block sizes, padded strides, unaligned dst, with
// and without non-temporal stores. Bytes around the written ones must stay untouched.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/simd_targets.h"
#include "kernels/cpu/copy_transpose.h"
#include "softmax/softmax_cpu.h"

namespace qkv::kernels {
namespace {

constexpr int64_t kSizes[] = {0, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 64, 65};

template <class T>
T value_at(int64_t j, int64_t i) {
  return static_cast<T>(static_cast<uint64_t>(j) * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(i) * 131 + 1);
}

// `misalign` elements past the first 64-byte boundary after v's start (so there is
// always an element before it), so streamed stores are possible at 0.
template <class T>
T* aligned_start(std::vector<T>& v, int64_t misalign) {
  auto address = reinterpret_cast<uintptr_t>(v.data());
  address = (address / 64 + 1) * 64;
  return reinterpret_cast<T*>(address) + misalign;
}

template <class T>
void check_case(int64_t rows, int64_t cols, int64_t tile_pad, int64_t dst_pad, int64_t misalign, bool stream) {
  const int64_t tile_stride = rows + tile_pad, dst_stride = cols + dst_pad;
  std::vector<T> tile(static_cast<size_t>(std::max<int64_t>(1, cols * tile_stride)));
  for (int64_t j = 0; j < cols; ++j)
    for (int64_t i = 0; i < tile_stride; ++i) tile[static_cast<size_t>(j * tile_stride + i)] = value_at<T>(j, i);
  const T sentinel = static_cast<T>(0x5A5A5A5A5A5A5A5Aull);
  std::vector<T> storage(static_cast<size_t>(rows * dst_stride) + 128, sentinel);
  T* dst = aligned_start(storage, misalign);
  detail::transpose_tile(sizeof(T), tile.data(), tile_stride, dst, dst_stride, rows, cols, stream);
  detail::stream_fence();
  for (int64_t i = 0; i < rows; ++i) {
    for (int64_t j = 0; j < dst_stride; ++j) {
      const T want = j < cols ? value_at<T>(j, i) : sentinel;
      ASSERT_EQ(dst[i * dst_stride + j], want) << "width " << sizeof(T) << " rows " << rows << " cols " << cols
                                               << " at (" << i << ", " << j << ") stream " << stream;
    }
  }
}

template <class T>
void check_width() {
  for (const int64_t rows : kSizes) {
    for (const int64_t cols : kSizes) {
      check_case<T>(rows, cols, 0, 0, 0, false);
      check_case<T>(rows, cols, 0, 0, 0, true);
      check_case<T>(rows, cols, 3, 5, 1, true);  // unaligned dst: plain stores
      check_case<T>(rows, cols, 1, 64 / sizeof(T), 0, true);
    }
  }
}

// Every length up to 300 bytes from every offset within a 64-byte line.
void check_stream_copy() {
  std::vector<uint8_t> src(512), storage(512 + 128);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
  for (int64_t misalign = 0; misalign < 64; ++misalign) {
    for (int64_t bytes = 0; bytes <= 300; ++bytes) {
      std::fill(storage.begin(), storage.end(), uint8_t{0xEE});
      uint8_t* dst = aligned_start(storage, misalign);
      detail::stream_copy(dst, src.data() + 5, bytes);
      detail::stream_fence();
      for (int64_t i = -1; i <= bytes; ++i) {
        const uint8_t want = i >= 0 && i < bytes ? src[static_cast<size_t>(i + 5)] : uint8_t{0xEE};
        ASSERT_EQ(dst[i], want) << "misalign " << misalign << " bytes " << bytes << " at " << i;
      }
    }
  }
}

class TransposeTile : public ::testing::TestWithParam<int64_t> {
 protected:
  void SetUp() override {
    // The parameters are every target of this CPU, listed before QKV_TEST_SIMD_TARGET's run
    // narrowed them (avx2.machine): one above the run's best is not this run's machine.
    detail::force_simd_target(0);
    const int64_t run = test::simd_targets_up_to(test::simd_target_from_env());  // 0: every target
    if (run != 0 && (GetParam() & run) == 0) {
      test::force_run_simd_targets();
      GTEST_SKIP() << detail::simd_target_name(GetParam()) << " is above QKV_TEST_SIMD_TARGET's target";
    }
    detail::force_simd_target(GetParam());
  }
  void TearDown() override { test::force_run_simd_targets(); }
};

TEST_P(TransposeTile, Width1) { check_width<uint8_t>(); }
TEST_P(TransposeTile, Width2) { check_width<uint16_t>(); }
TEST_P(TransposeTile, Width4) { check_width<uint32_t>(); }
TEST_P(TransposeTile, Width8) { check_width<uint64_t>(); }
TEST_P(TransposeTile, StreamCopy) { check_stream_copy(); }

INSTANTIATE_TEST_SUITE_P(EverySimdTarget, TransposeTile, ::testing::ValuesIn(detail::simd_targets()),
                         [](const ::testing::TestParamInfo<int64_t>& param) {
                           return detail::simd_target_name(param.param);
                         });

}  // namespace
}  // namespace qkv::kernels
