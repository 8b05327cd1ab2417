// Small helpers of the file readers: checked shape arithmetic, message text, byte fixes.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>

#include "io/io_internal.h"

namespace qkv::io::detail {

std::string quote_excerpt(std::string_view text, size_t max_chars, char quote) {
  std::string out(1, quote);
  for (size_t i = 0; i < text.size() && i < max_chars; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c == static_cast<unsigned char>(quote) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  out += quote;
  if (text.size() > max_chars) out += "...";
  return out;
}

std::string printable(std::string_view text) {
  std::string out;
  for (const char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    if ((c >= 0x20 && c < 0x7f) || c == '\n') {
      out += ch;
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

void byteswap_inplace(std::byte* data, size_t nbytes, size_t itemsize) {
  if (itemsize <= 1) return;
  for (size_t i = 0; i + itemsize <= nbytes; i += itemsize) std::reverse(data + i, data + i + itemsize);
}

void normalize_bools(std::byte* data, size_t nbytes) {
  for (size_t i = 0; i < nbytes; ++i) {
    if (data[i] != std::byte{0}) data[i] = std::byte{1};
  }
}

std::shared_ptr<Storage> copy_to_storage(std::span<const std::byte> bytes) {
  auto storage = Storage::allocate(bytes.size());
  if (!bytes.empty()) std::memcpy(storage->data(), bytes.data(), bytes.size());
  return storage;
}

Tensor view_or_copy(std::shared_ptr<Storage> file, size_t byte_offset, DType dtype, const Shape& shape,
                    const Strides& strides) {
  const int64_t numel = shape_numel(shape);
  if (numel == 0) return Tensor::empty(shape, dtype);
  const size_t itemsize = qkv::itemsize(dtype);
  if (byte_offset % itemsize != 0) {
    // Span of the elements addressed: strides are non-negative here (C or Fortran order).
    size_t span = 1;
    for (size_t i = 0; i < shape.size(); ++i) span += static_cast<size_t>((shape[i] - 1) * strides[i]);
    const size_t nbytes = span * itemsize;
    file = copy_to_storage(std::span<const std::byte>(file->data() + byte_offset, nbytes));
    byte_offset = 0;
  }
  return Tensor::view_of(std::move(file), dtype, shape, strides, static_cast<int64_t>(byte_offset / itemsize));
}

}  // namespace qkv::io::detail
