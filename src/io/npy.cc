// NumPy .npy files: magic "\x93NUMPY", version, header length, a Python dict
// literal header, then the raw array data (numpy/lib/format.py is the reference).
#include <algorithm>
#include <array>
#include <bit>
#include <cstdio>
#include <cstring>
#include <string>

#include "io/io_internal.h"

namespace qkv::io {
namespace detail {
namespace {

static_assert(std::endian::native == std::endian::little, "qkv's file formats assume a little-endian host");
static_assert(sizeof(bool) == 1, "bool tensors are stored as one byte per element");

constexpr std::array<unsigned char, 6> kMagic = {0x93, 'N', 'U', 'M', 'P', 'Y'};
// numpy refuses headers over 10,000 bytes unless told to trust the file; we allow
// more (long shapes) but still bound what a hostile length can make us read.
constexpr uint64_t kMaxHeaderBytes = uint64_t{1} << 20;
constexpr size_t kMaxDims = 64;       // numpy's NPY_MAXDIMS
constexpr size_t kArrayAlign = 64;    // numpy's ARRAY_ALIGN: data starts on this boundary
constexpr size_t kGrowthDigits = 21;  // numpy's GROWTH_AXIS_MAX_DIGITS (spare header space)

// What the file's 'descr' means to qkv.
struct Descr {
  bool supported = false;  // false: a numpy dtype qkv does not hold (inspect still lists it)
  DType dtype = DType::f32;
  bool big_endian = false;
  bool object = false;  // '|O': Python objects, pickled after the header
};

struct Preamble {
  int major = 0;
  uint64_t header_offset = 0;  // where the dict text starts
  uint64_t header_len = 0;
};

struct Layout {
  NpyHeader header;
  Descr descr;
  uint64_t data_offset = 0;
  uint64_t data_bytes = 0;  // only meaningful when descr.supported
};

std::string hex_prefix(std::span<const std::byte> bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size() && i < 8; ++i) {
    char buf[4];
    std::snprintf(buf, sizeof buf, "%02x", static_cast<unsigned>(bytes[i]));
    if (i > 0) out += ' ';
    out += buf;
  }
  return out;
}

// `bytes` holds at least the first 12 bytes of the file when it has them.
Preamble read_preamble(std::span<const std::byte> bytes, uint64_t file_size, const Context& ctx) {
  if (bytes.size() < 8 || std::memcmp(bytes.data(), kMagic.data(), kMagic.size()) != 0) {
    if (bytes.size() < 8) fail_at(ctx, "not an .npy file: ", file_size, " bytes, too short for the magic string");
    fail_at(ctx, "not an .npy file: bad magic string (starts with ", hex_prefix(bytes), ")");
  }
  Preamble p;
  p.major = static_cast<int>(bytes[6]);
  const int minor = static_cast<int>(bytes[7]);
  if (p.major < 1 || p.major > 3 || minor != 0) {
    fail_at(ctx, "unsupported .npy format version ", p.major, ".", minor, " (qkv reads 1.0, 2.0 and 3.0)");
  }
  const size_t len_bytes = p.major == 1 ? 2 : 4;
  p.header_offset = 8 + len_bytes;
  if (bytes.size() < p.header_offset) {
    fail_at(ctx, "truncated .npy header: the file ends (", file_size, " bytes) inside the header length");
  }
  for (size_t i = 0; i < len_bytes; ++i) p.header_len |= static_cast<uint64_t>(bytes[8 + i]) << (8 * i);
  if (p.header_len > kMaxHeaderBytes) {
    fail_at(ctx, "header length ", p.header_len, " exceeds qkv's limit of ", kMaxHeaderBytes, " bytes");
  }
  if (p.header_offset + p.header_len > file_size) {
    fail_at(ctx, "truncated .npy header: ", p.header_len, " header bytes announced but only ",
            file_size - p.header_offset, " follow");
  }
  return p;
}

Descr parse_descr(const std::string& descr, const Context& ctx) {
  struct Known {
    std::string_view code;
    DType dtype;
  };
  // bfloat16 as V2: what np.save writes for ml_dtypes.bfloat16 (numpy has no bf16).
  static constexpr std::array<Known, 8> kKnown{{{"f4", DType::f32},
                                                {"f8", DType::f64},
                                                {"f2", DType::f16},
                                                {"V2", DType::bf16},
                                                {"i1", DType::i8},
                                                {"i4", DType::i32},
                                                {"i8", DType::i64},
                                                {"b1", DType::b8}}};
  // The byte-order character is optional: numpy reads a bare 'f4' (as it does '=f4')
  // in native order, which the static_assert above makes little-endian.
  const bool has_order = !descr.empty() && std::string_view("<>|=").find(descr[0]) != std::string_view::npos;
  const char order = has_order ? descr[0] : '=';
  const std::string_view code = std::string_view(descr).substr(has_order ? 1 : 0);
  // An object array: np.save writes '|O' (its only kind without a size) and a pickle as
  // the data. It was refused as "descr '|O' is not a numpy dtype string".
  if (code == "O" || code == "O8") return Descr{.object = true};
  if (code.size() < 2) {
    fail_at(ctx, "bad .npy header: descr ", quote_name(descr), " is not a numpy dtype string such as '<f4'");
  }
  for (const Known& k : kKnown) {
    if (code == k.code) return Descr{true, k.dtype, order == '>' && qkv::itemsize(k.dtype) > 1};
  }
  // Other numpy kinds (uint, int16, complex, strings, datetimes, ...) are well-formed
  // files qkv cannot hold; anything else is not a dtype at all.
  // (numpy's dtype strings are printable ASCII, a kind then a size: '<U5', '<M8[ns]'; the
  // size keeps a bare name such as 'float32' out, which is no dtype string of that form.)
  const bool printable = std::all_of(code.begin(), code.end(), [](char c) { return c > ' ' && c < 0x7f; });
  if (!printable || std::string_view("biufcmMOSUV").find(code[0]) == std::string_view::npos || code[1] < '0' ||
      code[1] > '9') {
    fail_at(ctx, "bad .npy header: descr ", quote_name(descr), " is not a numpy dtype string such as '<f4'");
  }
  return Descr{};
}

std::string_view listed_dtype(const Layout& layout) {
  return layout.descr.supported ? dtype_name(layout.descr.dtype) : std::string_view(layout.header.descr);
}

[[noreturn]] void fail_unsupported(const Layout& layout, const Context& ctx) {
  if (layout.descr.object) {
    fail_at<DTypeError>(ctx, "dtype ", quote_name(layout.header.descr),
                        " is an object array (pickled Python objects), which qkv does not read (as "
                        "numpy.load(allow_pickle=False) refuses it)");
  }
  fail_at<DTypeError>(ctx, "dtype ", quote_name(layout.header.descr),
                      " is not one qkv holds (qkv reads b1, i1, i4, i8, f2, f4, f8 and V2 as bfloat16)");
}

// Parses everything up to the data; `head` holds at least the preamble and the
// header when the file has them. Data size is checked against `file_size`.
Layout read_layout(std::span<const std::byte> head, uint64_t file_size, const Context& ctx) {
  const Preamble p = read_preamble(head, file_size, ctx);
  if (head.size() < p.header_offset + p.header_len) fail_at<IOError>(ctx, "the file shrank while being read");
  const std::string_view text(reinterpret_cast<const char*>(head.data()) + p.header_offset,
                              static_cast<size_t>(p.header_len));
  Layout layout;
  layout.header = parse_npy_header(text, p.major < 3, ctx);
  layout.descr = parse_descr(layout.header.descr, ctx);
  layout.data_offset = p.header_offset + p.header_len;
  const Shape& shape = layout.header.shape;
  if (shape.size() > kMaxDims) fail_at(ctx, "shape has ", shape.size(), " dims, more than numpy's ", kMaxDims);
  const int64_t numel = checked_numel(shape).value_or(-1);
  if (numel < 0) fail_at(ctx, "shape ", shape_str(shape), " has too many elements (overflow)");
  if (!layout.descr.supported) return layout;
  const auto itemsize = static_cast<uint64_t>(qkv::itemsize(layout.descr.dtype));
  if (__builtin_mul_overflow(static_cast<uint64_t>(numel), itemsize, &layout.data_bytes)) {
    fail_at(ctx, "shape ", shape_str(shape), " has too many bytes (overflow)");
  }
  const uint64_t available = file_size - layout.data_offset;
  if (available != layout.data_bytes) {
    fail_at(ctx, "shape ", shape_str(shape), " of ", listed_dtype(layout), " needs ", layout.data_bytes,
            " data bytes, but ", available, " follow the header");
  }
  return layout;
}

Strides fortran_strides(const Shape& shape) {
  Strides strides(shape.size());
  int64_t running = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    strides[i] = running;
    running *= std::max<int64_t>(shape[i], 1);  // checked_numel bounded the product
  }
  return strides;
}

// What np.save writes as 'descr' (for bf16: what it writes for ml_dtypes.bfloat16).
std::string_view descr_of(DType dtype) {
  switch (dtype) {
    case DType::f32: return "<f4";
    case DType::f64: return "<f8";
    case DType::f16: return "<f2";
    case DType::bf16: return "<V2";
    case DType::i8: return "|i1";
    case DType::i32: return "<i4";
    case DType::i64: return "<i8";
    case DType::b8: return "|b1";
  }
  fail<DTypeError>("save_npy: invalid dtype code ", static_cast<int>(dtype));
}

// The header numpy writes for this array, magic to newline, version 1.0 unless
// the header does not fit its 16-bit length.
std::string npy_prefix(const Tensor& t, bool fortran_order) {
  std::string shape = "(";
  for (size_t i = 0; i < t.shape().size(); ++i) {
    if (i > 0) shape += ", ";
    shape += std::to_string(t.shape()[i]);
  }
  shape += t.dim() == 1 ? ",)" : ")";
  std::string dict = "{'descr': '" + std::string(descr_of(t.dtype())) +
                     "', 'fortran_order': " + (fortran_order ? "True" : "False") + ", 'shape': " + shape + ", }";
  if (t.dim() > 0) {  // numpy's spare room for growing the first (C) or last (F) axis in place
    const int64_t grow = fortran_order ? t.shape().back() : t.shape().front();
    dict.append(kGrowthDigits - std::to_string(grow).size(), ' ');
  }
  const size_t hlen = dict.size() + 1;  // + the final newline
  int major = 1;
  size_t pad = kArrayAlign - (8 + 2 + hlen) % kArrayAlign;
  if (hlen + pad > 0xffff) {
    major = 2;
    pad = kArrayAlign - (8 + 4 + hlen) % kArrayAlign;
  }
  const size_t total = hlen + pad;
  std::string out(kMagic.begin(), kMagic.end());
  out += static_cast<char>(major);
  out += '\0';
  for (size_t i = 0; i < (major == 1 ? 2u : 4u); ++i) out += static_cast<char>((total >> (8 * i)) & 0xff);
  return out + dict + std::string(pad, ' ') + "\n";
}

// The data in file order: row-major, or row-major of the reversed dims for Fortran.
Tensor file_order(const Tensor& given, bool fortran_order) {
  const Tensor t = given.to(Device::cpu());  // a GPU tensor is copied to the host first
  if (!fortran_order || t.dim() < 2) return t.contiguous();
  std::vector<int64_t> reversed(static_cast<size_t>(t.dim()));
  for (size_t i = 0; i < reversed.size(); ++i) reversed[i] = t.dim() - 1 - static_cast<int64_t>(i);
  return t.permute(reversed).contiguous();
}

}  // namespace

Tensor npy_from_storage(std::shared_ptr<Storage> file, const Context& ctx) {
  const std::span<const std::byte> bytes(file->data(), file->nbytes());
  const Layout layout = read_layout(bytes, bytes.size(), ctx);
  if (!layout.descr.supported) fail_unsupported(layout, ctx);
  const DType dtype = layout.descr.dtype;
  // The storage is ours (a copy or the file just read), so fixes happen in place.
  std::byte* data = file->data() + layout.data_offset;
  const auto nbytes = static_cast<size_t>(layout.data_bytes);
  if (layout.descr.big_endian) byteswap_inplace(data, nbytes, qkv::itemsize(dtype));
  if (dtype == DType::b8) normalize_bools(data, nbytes);
  const Shape& shape = layout.header.shape;
  const Strides strides = layout.header.fortran_order ? fortran_strides(shape) : contiguous_strides(shape);
  return view_or_copy(std::move(file), static_cast<size_t>(layout.data_offset), dtype, shape, strides);
}

// The header of a .npy file, validated against its size, reading only the header's bytes.
Layout read_file_layout(const std::filesystem::path& path, const Context& ctx) {
  const uint64_t size = file_size(path, ctx);
  std::vector<std::byte> head = read_range(path, 0, 12, ctx);
  const Preamble p = read_preamble(head, size, ctx);
  head = read_range(path, 0, static_cast<size_t>(p.header_offset + p.header_len), ctx);
  return read_layout(head, size, ctx);
}

std::vector<TensorInfo> inspect_npy(const std::filesystem::path& path, const Context& ctx) {
  const Layout layout = read_file_layout(path, ctx);
  return {
      TensorInfo{path.stem().string(), path.stem().string(), std::string(listed_dtype(layout)), layout.header.shape}};
}

}  // namespace detail

Tensor parse_npy(std::span<const std::byte> bytes, const std::string& source) {
  return detail::npy_from_storage(detail::copy_to_storage(bytes), detail::Context{"parse_npy", source});
}

Tensor load_npy(const std::filesystem::path& path) {
  const detail::Context ctx{"load_npy", path.string()};
  return detail::npy_from_storage(detail::read_file(path, ctx), ctx);
}

Tensor load_npy_slice(const std::filesystem::path& path, int64_t dim, int64_t start, int64_t stop) {
  const detail::Context ctx{"load_npy_slice", path.string()};
  const detail::Layout layout = detail::read_file_layout(path, ctx);
  if (!layout.descr.supported) detail::fail_unsupported(layout, ctx);
  const Shape& shape = layout.header.shape;
  const int64_t axis = dim < 0 ? dim + static_cast<int64_t>(shape.size()) : dim;
  if (axis < 0 || axis >= static_cast<int64_t>(shape.size()) || start < 0 || start > stop ||
      stop > shape[static_cast<size_t>(axis)]) {
    fail<IndexError>("load_npy_slice: [", start, ", ", stop, ") along dim ", dim, " of ", shape_str(shape), " in ",
                     path.string());
  }
  if (layout.header.fortran_order) return load_npy(path).slice(axis, start, stop).contiguous();  // runs are columns
  const DType dtype = layout.descr.dtype;
  Shape out_shape = shape;
  out_shape[static_cast<size_t>(axis)] = stop - start;
  Tensor out = Tensor::empty(out_shape, dtype);
  // C order: the slice is prod(shape[:axis]) runs of (stop - start) * prod(shape[axis+1:]) elements.
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[static_cast<size_t>(d)];
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  const auto item = static_cast<uint64_t>(qkv::itemsize(dtype));
  const auto run = static_cast<size_t>(static_cast<uint64_t>((stop - start) * inner) * item);
  auto* dst = static_cast<std::byte*>(out.raw_data());
  for (int64_t o = 0; o < outer && run > 0; ++o) {
    const uint64_t at = layout.data_offset + static_cast<uint64_t>(o * shape[static_cast<size_t>(axis)] + start) *
                                                 static_cast<uint64_t>(inner) * item;
    const std::vector<std::byte> bytes = detail::read_range(path, at, run, ctx);
    std::memcpy(dst + static_cast<size_t>(o) * run, bytes.data(), run);
  }
  if (layout.descr.big_endian) detail::byteswap_inplace(dst, out.nbytes(), qkv::itemsize(dtype));
  if (dtype == DType::b8) detail::normalize_bools(dst, out.nbytes());
  return out;
}

std::vector<std::byte> serialize_npy(const Tensor& tensor, bool fortran_order) {
  const std::string prefix = detail::npy_prefix(tensor, fortran_order);
  const Tensor data = detail::file_order(tensor, fortran_order);
  std::vector<std::byte> out(prefix.size() + data.nbytes());
  std::memcpy(out.data(), prefix.data(), prefix.size());
  if (data.nbytes() > 0) std::memcpy(out.data() + prefix.size(), data.raw_data(), data.nbytes());
  return out;
}

void save_npy(const std::filesystem::path& path, const Tensor& tensor, bool fortran_order) {
  const std::string prefix = detail::npy_prefix(tensor, fortran_order);
  const Tensor data = detail::file_order(tensor, fortran_order);
  const std::span<const std::byte> chunks[] = {std::as_bytes(std::span(prefix)), detail::tensor_bytes(data)};
  detail::write_file(path, chunks, detail::Context{"save_npy", path.string()});
}

}  // namespace qkv::io
