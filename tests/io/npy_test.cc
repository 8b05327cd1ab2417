// .npy reading and writing: files written by numpy (tests/io/make_io_fixtures.py),
// byte-exact writing, round trips, and malformed files.
#include <gtest/gtest.h>

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

// An .npy file with the given header text (padded to 64 bytes like numpy unless `raw`).
std::vector<std::byte> npy_with_header(std::string header, const std::string& data, int version = 1, bool raw = false) {
  const size_t len_bytes = version == 1 ? 2 : 4;
  if (!raw) {
    header += '\n';
    header.insert(header.size() - 1, (64 - (8 + len_bytes + header.size()) % 64) % 64, ' ');
  }
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  for (size_t i = 0; i < len_bytes; ++i) out += static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return to_bytes(out + header + data);
}

TEST(Npy, ReadsEveryDtypeWrittenByNumpy) {
  for (const auto& [name, dtype] : fixture_dtypes()) {
    SCOPED_TRACE(name);
    expect_formula(load_npy(fixture(name + ".npy")), dtype, {2, 3});
  }
}

TEST(Npy, BigEndianIsByteswappedOnLoad) {
  for (const char* name : {"f32", "f64", "f16", "bf16", "i32", "i64"}) {
    SCOPED_TRACE(name);
    const Tensor t = load_npy(fixture(std::string(name) + "_be.npy"));
    const Tensor little = load_npy(fixture(std::string(name) + ".npy"));
    expect_formula(t, little.dtype(), {2, 3});
  }
}

TEST(Npy, FortranOrderLoadsAsStridedView) {
  const Tensor t = load_npy(fixture("f32_fortran.npy"));
  expect_formula(t, DType::f32, {2, 3, 4});
  EXPECT_EQ(t.strides(), (Strides{1, 2, 6}));
  EXPECT_FALSE(t.is_contiguous());
  // A view of the buffer holding the whole file: the data starts after numpy's 128-byte header.
  EXPECT_EQ(t.storage()->nbytes(), 128u + 24 * 4);
  EXPECT_EQ(t.offset(), 128 / 4);

  const Tensor i = load_npy(fixture("i64_fortran.npy"));
  expect_formula(i, DType::i64, {3, 2});
  EXPECT_EQ(i.strides(), (Strides{1, 3}));
}

TEST(Npy, ContiguousLoadIsViewOfFileBuffer) {
  const Tensor t = load_npy(fixture("f32.npy"));
  EXPECT_TRUE(t.is_contiguous());
  EXPECT_EQ(t.storage()->nbytes(), 128u + 6 * 4);
  EXPECT_EQ(t.offset(), 32);
}

TEST(Npy, ReadsVersion2And3Headers) {
  expect_formula(load_npy(fixture("f32_v2.npy")), DType::f32, {2, 3});
  expect_formula(load_npy(fixture("f32_v3.npy")), DType::f32, {2, 3});
}

TEST(Npy, ReadsScalarAndEmptyArrays) {
  const Tensor s = load_npy(fixture("scalar_f64.npy"));
  EXPECT_EQ(s.dtype(), DType::f64);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.item(), 2.5);
  const Tensor e = load_npy(fixture("empty_f32.npy"));
  EXPECT_EQ(e.shape(), (Shape{0, 3}));
  EXPECT_EQ(e.numel(), 0);
}

TEST(Npy, WritesTheBytesNumpyWrites) {
  for (const auto& [name, dtype] : fixture_dtypes()) {
    SCOPED_TRACE(name);
    EXPECT_EQ(serialize_npy(formula_tensor(dtype, {2, 3})), read_bytes(fixture(name + ".npy")));
  }
  EXPECT_EQ(serialize_npy(formula_tensor(DType::f32, {2, 3, 4}), true), read_bytes(fixture("f32_fortran.npy")));
  EXPECT_EQ(serialize_npy(formula_tensor(DType::i64, {3, 2}), true), read_bytes(fixture("i64_fortran.npy")));
  EXPECT_EQ(serialize_npy(Tensor::full({}, 2.5, DType::f64)), read_bytes(fixture("scalar_f64.npy")));
  EXPECT_EQ(serialize_npy(Tensor::zeros({0, 3})), read_bytes(fixture("empty_f32.npy")));
}

TEST(Npy, RoundTripsEveryDtypeAndOrder) {
  for (const auto& [name, dtype] : fixture_dtypes()) {
    for (const Shape& shape : {Shape{}, Shape{5}, Shape{2, 3, 4}, Shape{0, 3}, Shape{1, 1, 7}}) {
      for (bool fortran : {false, true}) {
        SCOPED_TRACE(name + " " + shape_str(shape) + (fortran ? " F" : " C"));
        const Tensor back = parse_npy(serialize_npy(formula_tensor(dtype, shape), fortran), "mem.npy");
        expect_formula(back, dtype, shape);
      }
    }
  }
}

TEST(Npy, WritesNonContiguousTensors) {
  // A transposed slice: the file holds its logical (row-major) values.
  const Tensor base = formula_tensor(DType::i32, {4, 6});
  const Tensor view = base.slice(1, 1, 6, 2).transpose(0, 1);  // shape [3, 4]
  for (bool fortran : {false, true}) {
    const Tensor back = parse_npy(serialize_npy(view, fortran), "view.npy");
    EXPECT_EQ(back.to_vector<int32_t>(), view.to_vector<int32_t>());
  }
}

TEST(Npy, SaveAndLoadFile) {
  const auto path = testing::temp_path("w.npy");
  const Tensor t = formula_tensor(DType::bf16, {3, 2});
  save_npy(path, t, true);
  const Tensor back = load_npy(path);
  expect_formula(back, DType::bf16, {3, 2});
  EXPECT_EQ(back.strides(), (Strides{1, 3}));
}

TEST(Npy, BoolBytesAreNormalized) {
  const Tensor t = parse_npy(
      npy_with_header("{'descr': '|b1', 'fortran_order': False, 'shape': (4,), }", std::string("\0\1\2\xff", 4)),
      "b.npy");
  EXPECT_EQ(t.to_vector<double>(), (std::vector<double>{0, 1, 1, 1}));
  EXPECT_EQ(static_cast<int>(reinterpret_cast<const unsigned char*>(t.raw_data())[2]), 1);
}

TEST(Npy, UnalignedDataIsCopied) {
  // No padding: data starts at byte 10 + 60, not a multiple of 4.
  const std::string header = "{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }";
  const Tensor t = parse_npy(npy_with_header(header, f32_data(6), 1, true), "u.npy");
  expect_formula(t, DType::f32, {2, 3});
  EXPECT_EQ(t.offset(), 0);
  EXPECT_EQ(t.storage()->nbytes(), 24u);
}

TEST(Npy, HeaderSyntaxVariantsAreAccepted) {
  // Other key order, double quotes, no trailing comma, newlines and tabs, Python 2 longs.
  for (const std::string header : {"{\"shape\": (2, 3), \"fortran_order\": False, \"descr\": \"<f4\"}",
                                   "{\n\t'descr':'<f4',\n\t'fortran_order':False,'shape':(2,3,),}",
                                   "{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }"}) {
    SCOPED_TRACE(header);
    expect_formula(parse_npy(npy_with_header(header, f32_data(6)), "v.npy"), DType::f32, {2, 3});
  }
  // 'L' is Python 2 only: not in version 3.0 files.
  EXPECT_THROW_WITH(
      parse_npy(npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (2L, 3L), }", f32_data(6), 3),
                "v3.npy"),
      FormatError, "expected ',' or ')'");
}

TEST(Npy, DescrWithoutByteOrderIsNative) {
  // numpy's descr_to_dtype reads 'f4' as '=f4', native (here little-endian) order;
  // qkv refused the bare form. tests/python/test_py_io.py checks the same against np.load.
  for (const char* descr : {"f4", "=f4", "|f4", "<f4"}) {
    SCOPED_TRACE(descr);
    const std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (2, 3), }";
    expect_formula(parse_npy(npy_with_header(header, f32_data(6)), "n.npy"), DType::f32, {2, 3});
  }
  const Tensor flags = parse_npy(
      npy_with_header("{'descr': 'b1', 'fortran_order': False, 'shape': (2,), }", std::string("\0\1", 2)), "b.npy");
  EXPECT_EQ(flags.dtype(), DType::b8);
  EXPECT_EQ(flags.to_vector<double>(), (std::vector<double>{0, 1}));
  EXPECT_THROW_WITH(
      parse_npy(npy_with_header("{'descr': 'u1', 'fortran_order': False, 'shape': (2,), }", "ab"), "u.npy"), DTypeError,
      "dtype 'u1' is not one qkv holds");
}

TEST(Npy, UnsupportedDtypeIsDTypeError) {
  EXPECT_THROW_WITH(load_npy(fixture("u16.npy")), DTypeError, "u16.npy: dtype '<u2' is not one qkv holds");
  const auto structured =
      npy_with_header("{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': (1,), }", f32_data(1));
  EXPECT_THROW_WITH(parse_npy(structured, "s.npy"), DTypeError, "parse_npy: s.npy: structured dtypes");
}

// np.save(np.array([1, "a", None], dtype=object), allow_pickle=True) writes '|O' and a
// pickle (make_io_fixtures.py). It was refused as "bad .npy header: descr '|O' is not a
// numpy dtype string such as '<f4'": it is a dtype string, of an array qkv does not read,
// as numpy.load(allow_pickle=False) does not ("Object arrays cannot be loaded when
// allow_pickle=False"). inspect lists it, as other dtypes qkv does not hold.
TEST(Npy, ObjectArraysAreRefusedAsObjectArrays) {
  const std::string why = "dtype '|O' is an object array (pickled Python objects), which qkv does not read";
  EXPECT_THROW_WITH(load_npy(fixture("object.npy")), DTypeError,
                    "load_npy: " + fixture("object.npy").string() + ": " + why);
  EXPECT_THROW_WITH(load_npy_slice(fixture("object.npy"), 0, 0, 1), DTypeError, why);
  EXPECT_THROW_WITH(parse_npy(read_bytes(fixture("object.npy")), "o.npy"), DTypeError, "parse_npy: o.npy: " + why);
  EXPECT_THROW_WITH(load(fixture("object.npy")), DTypeError, why);
  const std::vector<TensorInfo> listed = inspect(fixture("object.npy"));
  ASSERT_EQ(listed.size(), 1u);
  EXPECT_EQ(listed[0].dtype, "|O");
  EXPECT_EQ(listed[0].shape, (Shape{3}));
}

TEST(Npy, RejectsBadMagic) {
  auto bytes = read_bytes(fixture("f32.npy"));
  bytes[1] = std::byte{'X'};
  EXPECT_THROW_WITH(parse_npy(bytes, "m.npy"), FormatError, "parse_npy: m.npy: not an .npy file: bad magic string");
  EXPECT_THROW_WITH(parse_npy(to_bytes("PK\3\4"), "zip.npy"), FormatError, "zip.npy: not an .npy file: 4 bytes");
  EXPECT_THROW_WITH(parse_npy({}, "empty.npy"), FormatError, "empty.npy: not an .npy file: 0 bytes");
}

TEST(Npy, RejectsUnsupportedVersion) {
  auto bytes = read_bytes(fixture("f32.npy"));
  bytes[6] = std::byte{4};
  EXPECT_THROW_WITH(parse_npy(bytes, "v.npy"), FormatError, "unsupported .npy format version 4.0");
}

TEST(Npy, RejectsTruncatedHeader) {
  const auto bytes = read_bytes(fixture("f32.npy"));
  EXPECT_THROW_WITH(parse_npy(std::span(bytes).first(9), "t.npy"), FormatError,
                    "t.npy: truncated .npy header: the file ends (9 bytes) inside the header length");
  EXPECT_THROW_WITH(parse_npy(std::span(bytes).first(60), "t.npy"), FormatError,
                    "truncated .npy header: 118 header bytes announced but only 50 follow");
}

TEST(Npy, RejectsHugeHeaderLength) {
  std::string raw = "\x93NUMPY\x02";
  raw += std::string("\0\xff\xff\xff\x7f", 5);
  EXPECT_THROW_WITH(parse_npy(to_bytes(raw), "h.npy"), FormatError, "header length 2147483647 exceeds");
}

TEST(Npy, RejectsWrongDataSize) {
  const auto bytes = read_bytes(fixture("f32.npy"));
  EXPECT_THROW_WITH(parse_npy(std::span(bytes).first(bytes.size() - 1), "short.npy"), FormatError,
                    "short.npy: shape [2, 3] of float32 needs 24 data bytes, but 23 follow the header");
  auto longer = bytes;
  longer.push_back(std::byte{0});
  EXPECT_THROW_WITH(parse_npy(longer, "long.npy"), FormatError, "needs 24 data bytes, but 25 follow");
}

TEST(Npy, RejectsShapeOverflow) {
  const std::string header = "{'descr': '<f8', 'fortran_order': False, 'shape': (4294967296, 4294967296), }";
  EXPECT_THROW_WITH(parse_npy(npy_with_header(header, ""), "o.npy"), FormatError,
                    "o.npy: shape [4294967296, 4294967296] has too many elements (overflow)");
  // Bytes overflow though the element count fits.
  const std::string bytes_header = "{'descr': '<f8', 'fortran_order': False, 'shape': (4611686018427387904,), }";
  EXPECT_THROW_WITH(parse_npy(npy_with_header(bytes_header, ""), "b.npy"), FormatError, "too many bytes (overflow)");
  const std::string big = "{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999999,), }";
  EXPECT_THROW_WITH(parse_npy(npy_with_header(big, ""), "i.npy"), FormatError, "integer does not fit in 64 bits");
  // Zero-size arrays still may not have overflowing extents (their strides would overflow).
  const std::string zero = "{'descr': '<f4', 'fortran_order': False, 'shape': (0, 4294967296, 4294967296), }";
  EXPECT_THROW_WITH(parse_npy(npy_with_header(zero, ""), "z.npy"), FormatError, "too many elements");
}

TEST(Npy, RejectsMalformedDicts) {
  struct Case {
    std::string header;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"", "expected the header dict"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), ", "expected a str key"},
      {"{'descr' '<f4', 'fortran_order': False, 'shape': (6,), }", "expected ':' after key 'descr'"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': (6,), }", "expected ',' or '}' after the value of 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,), 'x': 1, }", "unexpected key 'x'"},
      {"{'descr': '<f4', 'fortran_order': False, }", "no 'shape' key"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': (6,), }", "duplicate key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': 0, 'shape': (6,), }", "'fortran_order' is an int, not True or False"},
      {"{'descr': '<f4', 'fortran_order': false, 'shape': (6,), }", "expected a value"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6), }", "'shape' is an int, not a tuple of ints"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [6], }", "'shape' is a list, not a tuple of ints"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (-6,), }", "'shape' has negative dimension -6"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': ('6',), }", "'shape' holds a str, not only ints"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (06,), }", "integer with leading zeros"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,,), }", "expected a value"},
      {"{'descr': '<f\\x34', 'fortran_order': False, 'shape': (6,), }", "escape sequences"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': (6,), }", "expected ',' or '}' after the value of 'descr'"},
      {"{'descr': 'float32', 'fortran_order': False, 'shape': (6,), }", "descr 'float32' is not a numpy dtype string"},
      {"{'descr': ' f4', 'fortran_order': False, 'shape': (6,), }", "descr ' f4' is not a numpy dtype string"},
      {"{'descr': '<<f4', 'fortran_order': False, 'shape': (6,), }", "descr '<<f4' is not a numpy dtype string"},
      {"{'descr': '=', 'fortran_order': False, 'shape': (6,), }", "descr '=' is not a numpy dtype string"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (6,), } x", "unexpected text after the header dict"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': ((((((((((6,),),),),),),),),),), }", "nested too deeply"},
      {"{'descr': None, 'fortran_order': False, 'shape': (6,), }", "'descr' is None, not a str"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.header);
    EXPECT_THROW_WITH(parse_npy(npy_with_header(c.header, f32_data(6)), "bad.npy"), FormatError,
                      "parse_npy: bad.npy: bad .npy header: ");
    EXPECT_THROW_WITH(parse_npy(npy_with_header(c.header, f32_data(6)), "bad.npy"), FormatError, c.message);
  }
}

TEST(Npy, MissingFileIsIOError) {
  EXPECT_THROW_WITH(load_npy("/nonexistent/dir/w.npy"), IOError, "load_npy: /nonexistent/dir/w.npy: cannot open");
  EXPECT_THROW_WITH(save_npy("/nonexistent/dir/w.npy", Tensor::zeros({2})), IOError,
                    "save_npy: /nonexistent/dir/w.npy: cannot open for writing");
}

}  // namespace
}  // namespace qkv::io
