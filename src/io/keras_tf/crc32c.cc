// crc32c (Castagnoli polynomial, reflected 0x82F63B78), byte-table implementation.
#include <array>

#include "io/keras_tf/tf_internal.h"

namespace qkv::io::detail {
namespace {

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1u) != 0 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    table[i] = c;
  }
  return table;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

}  // namespace

uint32_t crc32c_extend(uint32_t crc, const std::byte* data, size_t n) {
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ static_cast<uint32_t>(data[i])) & 0xffu] ^ (c >> 8);
  return ~c;
}

}  // namespace qkv::io::detail
