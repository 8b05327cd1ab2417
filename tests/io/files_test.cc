// inspect / load / save: dispatch by extension, listings without data, errors naming the path.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "io/io_test_util.h"
#include "qkv/io.h"

namespace qkv::io {
namespace {

using testing::expect_formula;
using testing::fixture;
using testing::formula_tensor;

TEST(IoFiles, InspectListsNpyWithoutLoading) {
  const std::vector<TensorInfo> infos = inspect(fixture("f32_fortran.npy"));
  ASSERT_EQ(infos.size(), 1u);
  EXPECT_EQ(infos[0].name, "f32_fortran");
  EXPECT_EQ(infos[0].dtype, "float32");
  EXPECT_EQ(infos[0].shape, (Shape{2, 3, 4}));
  EXPECT_EQ(inspect(fixture("bf16_be.npy"))[0].dtype, "bfloat16");
  EXPECT_EQ(inspect(fixture("u16.npy"))[0].dtype, "<u2");  // listed though qkv cannot load it
}

TEST(IoFiles, InspectListsSafetensorsInDataOrder) {
  const std::vector<TensorInfo> infos = inspect(fixture("mixed.safetensors"));
  std::vector<std::string> names, dtypes;
  for (const TensorInfo& info : infos) {
    names.push_back(info.name);
    dtypes.push_back(info.dtype);
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"i64", "f64", "empty", "f32", "scalar", "i32", "bf16", "f16", "i8", "bool"}));
  EXPECT_EQ(dtypes, (std::vector<std::string>{"int64", "float64", "float32", "float32", "float32", "int32", "bfloat16",
                                              "float16", "int8", "bool"}));
  EXPECT_EQ(infos[2].shape, (Shape{0, 3}));
  EXPECT_EQ(infos[4].shape, Shape{});
}

TEST(IoFiles, InspectValidatesAgainstFileSize) {
  const auto path = testing::temp_path("cut.safetensors");
  auto bytes = testing::read_bytes(fixture("mixed.safetensors"));
  bytes.pop_back();
  std::filesystem::create_directories(path.parent_path());
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  EXPECT_THROW_WITH(inspect(path), FormatError, "inspect: " + path.string() + ": the tensors' data_offsets end at");
  const auto npy = testing::temp_path("cut.npy");
  auto npy_bytes = testing::read_bytes(fixture("f64.npy"));
  npy_bytes.resize(npy_bytes.size() - 8);
  {
    std::ofstream out(npy, std::ios::binary);
    out.write(reinterpret_cast<const char*>(npy_bytes.data()), static_cast<std::streamsize>(npy_bytes.size()));
  }
  EXPECT_THROW_WITH(inspect(npy), FormatError, "needs 48 data bytes, but 40 follow the header");
}

TEST(IoFiles, LoadAndSaveDispatchByExtension) {
  const auto npy = testing::temp_path("weights.npy");
  save(npy, {{"ignored", formula_tensor(DType::i32, {2, 3})}});
  const std::map<std::string, Tensor> one = load(npy);
  ASSERT_EQ(one.size(), 1u);
  expect_formula(one.at("weights"), DType::i32, {2, 3});

  const auto st = testing::temp_path("model.SafeTensors");  // extensions match case-insensitively
  save(st, {{"a", formula_tensor(DType::f16, {4})}, {"b", formula_tensor(DType::b8, {2, 2})}});
  const std::map<std::string, Tensor> two = load(st);
  ASSERT_EQ(two.size(), 2u);
  expect_formula(two.at("a"), DType::f16, {4});
  expect_formula(two.at("b"), DType::b8, {2, 2});
}

// np.save writes an F- but not C-contiguous array in Fortran order: save must too, so a
// Fortran file loaded (a column-major view) and saved again is np.save's file byte for byte.
TEST(IoFiles, SaveWritesFortranOrderWhereNpSaveDoes) {
  for (const char* name : {"f32_fortran.npy", "i64_fortran.npy"}) {
    SCOPED_TRACE(name);
    const Tensor f = load_npy(fixture(name));  // column-major strides over the file
    const auto path = testing::temp_path(std::string("again_") + name);
    save(path, {{"x", f}});
    EXPECT_EQ(testing::read_bytes(path), testing::read_bytes(fixture(name)));
  }
  // C order where numpy's flags say C-contiguous: every size-1 and empty layout.
  const Tensor row = formula_tensor(DType::f32, {1, 3});
  const auto path = testing::temp_path("row.npy");
  save(path, {{"x", Tensor::view_of(row.storage(), row.dtype(), {1, 3}, {1, 1}, row.offset())}});
  EXPECT_EQ(testing::read_bytes(path), serialize_npy(row, false));
  const Tensor empty = Tensor::zeros({0, 3}).permute({1, 0});
  save(path, {{"x", empty}});
  EXPECT_EQ(testing::read_bytes(path), serialize_npy(Tensor::zeros({3, 0}), false));
}

TEST(IoFiles, UnknownExtensionIsFormatError) {
  EXPECT_THROW_WITH(load("model.pt"), FormatError,
                    "load: model.pt: unknown file extension '.pt' (qkv reads and writes .npy and .safetensors");
  EXPECT_THROW_WITH(inspect("noext"), FormatError, "inspect: noext: unknown file extension ''");
  EXPECT_THROW_WITH(save("x.pt", {}), FormatError, "save: x.pt: unknown file extension '.pt'");
  EXPECT_THROW_WITH(save("x.keras", {}), FormatError,
                    "save: x.keras: save writes .npy, .safetensors, .h5 and TF checkpoints");
}

// is_keras_archive is the answer inspect/load and load_weights act on (qkv convert asks it
// whether its input's config.json is kept): the extension, in any case, by name alone.
TEST(IoFiles, IsKerasArchiveIsWhatTheReadersReadAsOne) {
  for (const char* yes : {"m.keras", "M.KERAS", "dir/m.Keras", "a.b.keras", "/nonexistent/m.keras"})
    EXPECT_TRUE(is_keras_archive(yes)) << yes;
  for (const char* no : {"m.keras.h5", "m.kerass", "keras", "m.weights.h5", ".keras", "dir.keras/m", ""})
    EXPECT_FALSE(is_keras_archive(no)) << no;
  const auto upper = testing::temp_path("MODEL.KERAS");
  std::filesystem::copy_file(fixture("seed001", "model.keras"), upper,
                             std::filesystem::copy_options::overwrite_existing);
  ASSERT_TRUE(is_keras_archive(upper));
  EXPECT_FALSE(load_weights_and_config(upper).config_json.empty()) << "read as a .keras archive";
  EXPECT_THROW_WITH(load(".keras"), FormatError, "load: .keras: unknown file extension ''");
}

TEST(IoFiles, SaveNpyNeedsExactlyOneTensor) {
  EXPECT_THROW_WITH(save("two.npy", {{"a", Tensor::zeros({1})}, {"b", Tensor::zeros({1})}}), ValueError,
                    "save: two.npy: an .npy file holds exactly one tensor, got 2");
}

TEST(IoFiles, MissingFileIsIOError) {
  EXPECT_THROW_WITH(load("/nonexistent/x.npy"), IOError, "load: /nonexistent/x.npy: cannot open");
  EXPECT_THROW_WITH(inspect("/nonexistent/x.safetensors"), IOError, "inspect: /nonexistent/x.safetensors: cannot open");
  const auto dir = testing::temp_path("dir.npy");
  std::filesystem::create_directories(dir);
  EXPECT_THROW_WITH(load(dir), IOError, "load: " + dir.string() + ": not a regular file");
}

}  // namespace
}  // namespace qkv::io
