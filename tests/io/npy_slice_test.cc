// io::load_npy_slice: the rows of one dim read from a .npy file without the rest, on numpy's
// own files (tests/fixtures/io: every dtype, big-endian, Fortran order, v2/v3 headers, empty),
// against load_npy's whole array sliced; and the errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "io/io_test_util.h"
#include "qkv/error.h"
#include "qkv/io_tensor_files.h"

namespace qkv::io {
namespace {

using testing::expect_same_values;
using testing::fixture;
using testing::temp_path;

TEST(NpySlice, EveryDimAndRangeOfNumpysFilesEqualsTheWholeArraySliced) {
  int checked = 0;
  for (const auto& entry : std::filesystem::directory_iterator(fixture(""))) {
    const std::string stem = entry.path().stem().string();
    if (entry.path().extension() != ".npy" || stem == "u16" || stem == "object") continue;  // no qkv dtype
    const Tensor whole = load_npy(entry.path());
    for (int64_t d = 0; d < whole.dim(); ++d) {
      const int64_t n = whole.size(d);
      for (const auto& [a, b] :
           {std::pair<int64_t, int64_t>{0, n}, {0, n / 2}, {n / 2, n}, {n > 1 ? 1 : 0, n}, {n, n}}) {
        SCOPED_TRACE(entry.path().filename().string() + " dim " + std::to_string(d) + " [" + std::to_string(a) + ", " +
                     std::to_string(b) + ")");
        const Tensor got = load_npy_slice(entry.path(), d, a, b);
        EXPECT_TRUE(got.is_contiguous());
        expect_same_values(got, whole.slice(d, a, b).contiguous(), "slice");
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 60);  // ~20 numpy files of one to three dims
}

TEST(NpySlice, ANegativeDimCountsFromTheEnd) {
  const Tensor whole = load_npy(fixture("f32.npy"));  // [2, 3]
  expect_same_values(load_npy_slice(fixture("f32.npy"), -1, 1, 3), whole.slice(1, 1, 3).contiguous(), "dim -1");
}

TEST(NpySlice, ARangeOrDimOutsideTheArrayIsAnIndexErrorNamingTheFile) {
  const auto f = fixture("f32.npy");  // [2, 3]
  EXPECT_THROW_WITH(load_npy_slice(f, 1, 0, 4), IndexError, "[0, 4) along dim 1 of [2, 3]");
  EXPECT_THROW_WITH(load_npy_slice(f, 2, 0, 1), IndexError, "f32.npy");
  EXPECT_THROW_WITH(load_npy_slice(f, 0, 2, 1), IndexError, "load_npy_slice");
  EXPECT_THROW_WITH(load_npy_slice(f, 0, -1, 1), IndexError, "load_npy_slice");
}

TEST(NpySlice, ATruncatedFileIsAFormatErrorBeforeAnyRead) {
  const auto bytes = testing::read_bytes(fixture("f64.npy"));
  const auto path = temp_path("short.npy");
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size() - 8));
  EXPECT_THROW_WITH(load_npy_slice(path, 0, 0, 1), FormatError, "data bytes");
}

}  // namespace
}  // namespace qkv::io
