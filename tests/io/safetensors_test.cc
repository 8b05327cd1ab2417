// .safetensors reading and writing: files written by the reference `safetensors`
// package (tests/io/make_io_fixtures.py), byte-exact writing, round trips, and the
// reference's validation rules on malformed files.
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "io/io_test_util.h"
#include "qkv/io.h"

namespace qkv::io {
namespace {

using testing::expect_formula;
using testing::f32_data;
using testing::fixture;
using testing::fixture_dtypes;
using testing::formula_tensor;
using testing::read_bytes;
using testing::to_bytes;

// A .safetensors file from header text and data; `length` overrides the header length.
std::vector<std::byte> st_file(const std::string& header, const std::string& data = "", int64_t length = -1) {
  const auto n = length < 0 ? static_cast<uint64_t>(header.size()) : static_cast<uint64_t>(length);
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xff);
  return to_bytes(out + header + data);
}

// The tensors of tests/fixtures/io/mixed.safetensors.
std::map<std::string, Tensor> mixed_tensors() {
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, dtype] : fixture_dtypes()) tensors[name] = formula_tensor(dtype, {2, 3});
  tensors["scalar"] = Tensor::full({}, 2.5);
  tensors["empty"] = Tensor::zeros({0, 3});
  return tensors;
}

const std::map<std::string, std::string> kMixedMetadata = {{"source", "make_io_fixtures.py"}};

TEST(Safetensors, ReadsFileWrittenByReferencePackage) {
  const SafetensorsFile f = load_safetensors(fixture("mixed.safetensors"));
  EXPECT_EQ(f.metadata, kMixedMetadata);
  ASSERT_EQ(f.tensors.size(), 10u);
  for (const auto& [name, dtype] : fixture_dtypes()) {
    SCOPED_TRACE(name);
    expect_formula(f.tensors.at(name), dtype, {2, 3});
  }
  EXPECT_EQ(f.tensors.at("scalar").item(), 2.5);
  EXPECT_EQ(f.tensors.at("empty").shape(), (Shape{0, 3}));
}

TEST(Safetensors, AlignedTensorsAreViewsOfOneBuffer) {
  const SafetensorsFile f = load_safetensors(fixture("mixed.safetensors"));
  const Tensor& first = f.tensors.at("f32");
  for (const char* name : {"f64", "i64", "i32", "bf16", "f16", "i8", "bool"}) {
    EXPECT_TRUE(f.tensors.at(name).shares_storage(first)) << name;
  }
  EXPECT_EQ(first.storage()->nbytes(), read_bytes(fixture("mixed.safetensors")).size());
}

TEST(Safetensors, WritesTheBytesTheReferenceWrites) {
  EXPECT_EQ(serialize_safetensors(mixed_tensors(), kMixedMetadata), read_bytes(fixture("mixed.safetensors")));
  const std::map<std::string, Tensor> unsupported_free = {{"w", formula_tensor(DType::f32, {2})}};
  // No tensors at all: "{}" padded to 8 bytes, as the reference's test_empty expects.
  EXPECT_EQ(testing::to_string(serialize_safetensors({})), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
  const std::string json = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  const std::string padded = json + std::string((8 - json.size() % 8) % 8, ' ');
  const auto one = testing::to_string(serialize_safetensors(unsupported_free));
  EXPECT_EQ(static_cast<unsigned char>(one[0]), padded.size());
  EXPECT_EQ(one.substr(8), padded + f32_data(2));
}

TEST(Safetensors, WriterOrdersByDtypeThenName) {
  const std::map<std::string, Tensor> tensors = {
      {"a", Tensor::zeros({1}, DType::b8)},  {"b", Tensor::zeros({1}, DType::f64)},
      {"c", Tensor::zeros({1}, DType::i64)}, {"d", Tensor::zeros({1}, DType::f32)},
      {"e", Tensor::zeros({1}, DType::i32)}, {"f", Tensor::zeros({1}, DType::bf16)},
      {"g", Tensor::zeros({1}, DType::f16)}, {"h", Tensor::zeros({1}, DType::i8)},
      {"i", Tensor::zeros({1}, DType::f64)}};
  const std::vector<TensorInfo> order = [&] {
    const auto path = testing::temp_path("order.safetensors");
    save_safetensors(path, tensors);
    return inspect(path);
  }();
  std::string names;
  for (const TensorInfo& info : order) names += info.name;
  EXPECT_EQ(names, "cbidefgha");
}

TEST(Safetensors, RoundTripsEveryDtype) {
  std::map<std::string, Tensor> tensors;
  for (const auto& [name, dtype] : fixture_dtypes()) {
    tensors[name + "_3d"] = formula_tensor(dtype, {2, 3, 4});
    tensors[name + "_scalar"] = formula_tensor(dtype, {});
    tensors[name + "_empty"] = formula_tensor(dtype, {3, 0});
  }
  const SafetensorsFile back = parse_safetensors(serialize_safetensors(tensors, {{"k", "v"}, {"a", "ü"}}), "m");
  EXPECT_EQ(back.metadata, (std::map<std::string, std::string>{{"k", "v"}, {"a", "ü"}}));
  ASSERT_EQ(back.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    SCOPED_TRACE(name);
    expect_formula(back.tensors.at(name), t.dtype(), t.shape());
  }
}

TEST(Safetensors, WritesNonContiguousTensors) {
  const Tensor base = formula_tensor(DType::f64, {4, 6});
  const Tensor view = base.transpose(0, 1).slice(0, 1, 5);
  const SafetensorsFile back = parse_safetensors(serialize_safetensors({{"v", view}}), "v");
  EXPECT_EQ(back.tensors.at("v").shape(), view.shape());
  EXPECT_EQ(back.tensors.at("v").to_vector<double>(), view.to_vector<double>());
}

TEST(Safetensors, SaveAndLoadFile) {
  const auto path = testing::temp_path("m.safetensors");
  save_safetensors(path, mixed_tensors(), kMixedMetadata);
  EXPECT_EQ(read_bytes(path), read_bytes(fixture("mixed.safetensors")));
  expect_formula(load_safetensors(path).tensors.at("i64"), DType::i64, {2, 3});
}

TEST(Safetensors, UnalignedTensorsAreCopied) {
  const std::string header =
      R"({"a":{"dtype":"I8","shape":[1],"data_offsets":[0,1]},"b":{"dtype":"F32","shape":[2,3],"data_offsets":[1,25]}})";
  std::string data(1, '\x07');  // one int8, then the floats at an odd offset
  data += f32_data(6);
  const SafetensorsFile f = parse_safetensors(st_file(header, data), "u.safetensors");
  expect_formula(f.tensors.at("b"), DType::f32, {2, 3});
  EXPECT_FALSE(f.tensors.at("b").shares_storage(f.tensors.at("a")));
  EXPECT_EQ(f.tensors.at("a").item({0}), 7);
}

TEST(Safetensors, AcceptsAnyOffsetOrderNullMetadataAndUnknownFields) {
  const std::string header = R"({"__metadata__":null,"b":{"dtype":"F32","shape":[3],"data_offsets":[12,24]},)"
                             R"("a":{"dtype":"F32","shape":[3],"data_offsets":[0,12],"extra":[1]}})";
  const SafetensorsFile f = parse_safetensors(st_file(header, f32_data(6)), "o.safetensors");
  EXPECT_TRUE(f.metadata.empty());
  EXPECT_EQ(f.tensors.at("b").item({0}), testing::expected_value(DType::f32, 3));
}

TEST(Safetensors, BoolBytesAreNormalized) {
  const std::string header = R"({"m":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})";
  const SafetensorsFile f = parse_safetensors(st_file(header, std::string("\0\x05\1", 3)), "b.safetensors");
  EXPECT_EQ(f.tensors.at("m").to_vector<double>(), (std::vector<double>{0, 1, 1}));
}

TEST(Safetensors, UnsupportedDtypeIsDTypeErrorButInspectLists) {
  EXPECT_THROW_WITH(load_safetensors(fixture("unsupported.safetensors")), DTypeError,
                    "unsupported.safetensors: tensor 'u8' has dtype U8, which qkv cannot hold");
  const std::vector<TensorInfo> infos = inspect(fixture("unsupported.safetensors"));
  ASSERT_EQ(infos.size(), 2u);
  EXPECT_EQ(infos[0].name, "w");
  EXPECT_EQ(infos[0].dtype, "float32");
  EXPECT_EQ(infos[1].name, "u8");
  EXPECT_EQ(infos[1].dtype, "U8");
  EXPECT_EQ(infos[1].shape, (Shape{4}));
}

TEST(Safetensors, RejectsSizeMismatch) {
  const std::string header = R"({"w":{"dtype":"F32","shape":[2,2],"data_offsets":[0,12]}})";
  EXPECT_THROW_WITH(parse_safetensors(st_file(header, f32_data(3)), "model.safetensors"), FormatError,
                    "parse_safetensors: model.safetensors: tensor 'w' data_offsets [0, 12) hold 12 bytes but shape "
                    "[2, 2] of F32 needs 16");
}

TEST(Safetensors, RejectsOverlappingOffsets) {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_THROW_WITH(parse_safetensors(st_file(header, f32_data(2)), "o.safetensors"), FormatError,
                    "tensor 'b' data_offsets [4, 8) overlap the previous tensor's data (ending at 8)");
}

TEST(Safetensors, RejectsGappedOffsets) {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})";
  EXPECT_THROW_WITH(parse_safetensors(st_file(header, f32_data(3)), "g.safetensors"), FormatError,
                    "tensor 'b' data_offsets [8, 12) leave a gap after the previous tensor's data (ending at 4)");
  const std::string first = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})";
  EXPECT_THROW_WITH(parse_safetensors(st_file(first, f32_data(2)), "g.safetensors"), FormatError,
                    "tensor 'a' data_offsets [4, 8) leave a gap");
}

TEST(Safetensors, RejectsDataNotCoveredByOffsets) {
  const std::string header = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
  EXPECT_THROW_WITH(parse_safetensors(st_file(header, f32_data(2)), "t.safetensors"), FormatError,
                    "t.safetensors: the tensors' data_offsets end at 4 but the data section after the header holds 8");
  EXPECT_THROW_WITH(parse_safetensors(st_file(header, "ab"), "t.safetensors"), FormatError,
                    "data section after the header holds 2 bytes");
}

TEST(Safetensors, RejectsEndBeforeBegin) {
  const std::string header =
      R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"b":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},)"
      R"("c":{"dtype":"F32","shape":[0],"data_offsets":[0,4294967296]}})";
  // Sorted by (begin, end) the [0, 2^32) entry comes last and its size is wrong.
  EXPECT_THROW_WITH(parse_safetensors(st_file(header), "e.safetensors"), FormatError,
                    "tensor 'c' data_offsets [0, 4294967296) hold 4294967296 bytes");
  const std::string backwards = R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                R"("b":{"dtype":"F32","shape":[0],"data_offsets":[4,2]}})";
  EXPECT_THROW_WITH(parse_safetensors(st_file(backwards, f32_data(1)), "e.safetensors"), FormatError,
                    "tensor 'b' data_offsets [4, 2) end before they begin");
}

TEST(Safetensors, RejectsHeaderTooLarge) {
  EXPECT_THROW_WITH(parse_safetensors(st_file("{}", "", 100'000'001), "big.safetensors"), FormatError,
                    "big.safetensors: header length 100000001 exceeds the limit of 100000000 bytes");
  EXPECT_THROW_WITH(parse_safetensors(st_file("{}", "", 3), "past.safetensors"), FormatError,
                    "header length 3 runs past the end of the file (10 bytes)");
  EXPECT_THROW_WITH(parse_safetensors(to_bytes(std::string("\x02\0\0", 3)), "tiny.safetensors"), FormatError,
                    "file of 3 bytes is too short for the 8-byte header length");
}

TEST(Safetensors, RejectsBadJson) {
  for (const std::string header :
       {R"({"a":{"dtype":"F32",)", "{} x", "\xff{}", R"({"a":"\xc3"})", "{\"a\":\"\xc3\"}", "", "   "}) {
    SCOPED_TRACE(header);
    EXPECT_THROW_WITH(parse_safetensors(st_file(header), "j.safetensors"), FormatError,
                      "parse_safetensors: j.safetensors: header is not valid JSON: ");
  }
}

// As the reference: safetensors 0.8.0 (serde_json) loads 125 arrays nested in a tensor's
// unknown field (127 levels with the two objects around them) and refuses 126 ("recursion limit
// exceeded"). nlohmann built any depth: 20M levels in a 40 MB header took 1.5 GB and 5.3 s.
TEST(Safetensors, RejectsJsonNestedAsDeepAsTheReferenceRefuses) {
  const std::string one(std::string_view("\0\0\x80\x3f", 4));  // 1.0f
  auto nested = [](int n) {
    return R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4],"x":)" + std::string(static_cast<size_t>(n), '[') +
           std::string(static_cast<size_t>(n), ']') + "}}";
  };
  EXPECT_EQ(parse_safetensors(st_file(nested(125), one), "n.safetensors").tensors.at("a").item({0}), 1.0);
  for (const int n : {126, 1000000}) {
    EXPECT_THROW_WITH(parse_safetensors(st_file(nested(n), one), "n.safetensors"), FormatError,
                      "parse_safetensors: n.safetensors: header nests JSON 128 levels deep, which the reference");
  }
}

TEST(Safetensors, RejectsMalformedEntries) {
  struct Case {
    std::string header;
    std::string message;
  };
  const std::vector<Case> cases = {
      {R"([])", "header is not a JSON object"},
      {R"({"a":[]})", "tensor 'a' is not an object"},
      {R"({"a":{"dtype":"F32","shape":[0]}})", "tensor 'a' has no \"data_offsets\""},
      {R"({"a":{"dtype":"F12","shape":[0],"data_offsets":[0,0]}})", "tensor 'a' has unknown dtype 'F12'"},
      {R"({"a":{"dtype":32,"shape":[0],"data_offsets":[0,0]}})", "tensor 'a' dtype is not a string"},
      {R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,0]}})", "tensor 'a' shape holds -1, not a non-negative"},
      {R"({"a":{"dtype":"F32","shape":[1.0],"data_offsets":[0,0]}})", "tensor 'a' shape holds 1.0, not a non-negative"},
      {R"({"a":{"dtype":"F32","shape":0,"data_offsets":[0,0]}})", "tensor 'a' shape is not an array"},
      {R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0]}})", "tensor 'a' data_offsets is not a [begin, end] pair"},
      {R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,"0"]}})", "tensor 'a' data_offsets holds string"},
      {R"({"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})",
       "header has duplicate key 'a'"},
      {R"({"a":{"dtype":"F32","dtype":"F64","shape":[0],"data_offsets":[0,0]}})", "header has duplicate key 'dtype'"},
      {R"({"__metadata__":{"k":1}})", "\"__metadata__\" entry 'k' is not a string"},
      {R"({"__metadata__":[]})", "\"__metadata__\" is not an object of strings"},
      {R"({"a":{"dtype":"F4","shape":[3],"data_offsets":[0,0]}})",
       "tensor 'a' shape [3] of F4 is not a whole number of bytes"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    EXPECT_THROW_WITH(parse_safetensors(st_file(c.header), "e.safetensors"), FormatError,
                      "parse_safetensors: e.safetensors: " + c.message);
  }
}

TEST(Safetensors, RejectsShapeOverflow) {
  const std::string header = R"({"a":{"dtype":"F64","shape":[4294967296,4294967296],"data_offsets":[0,0]}})";
  EXPECT_THROW_WITH(parse_safetensors(st_file(header), "o.safetensors"), FormatError,
                    "tensor 'a' shape [4294967296, 4294967296] of F64 has too many elements (overflow)");
  const std::string huge_dim = R"({"a":{"dtype":"F64","shape":[0,18446744073709551615],"data_offsets":[0,0]}})";
  EXPECT_THROW_WITH(parse_safetensors(st_file(huge_dim), "o.safetensors"), FormatError,
                    "tensor 'a' has dimension 18446744073709551615, too large");
}

TEST(Safetensors, WriterRejectsReservedAndNonUtf8Names) {
  EXPECT_THROW_WITH(serialize_safetensors({{"__metadata__", Tensor::zeros({1})}}), ValueError,
                    "serialize_safetensors: a tensor cannot be named \"__metadata__\"");
  EXPECT_THROW_WITH(serialize_safetensors({{"\xff", Tensor::zeros({1})}}), ValueError, "must be UTF-8");
}

TEST(Safetensors, MissingFileIsIOError) {
  EXPECT_THROW_WITH(load_safetensors("/nonexistent/m.safetensors"), IOError,
                    "load_safetensors: /nonexistent/m.safetensors: cannot open");
}

}  // namespace
}  // namespace qkv::io
