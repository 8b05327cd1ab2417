// libFuzzer target: qkv::io::parse_tf_checkpoint on arbitrary bytes, laid out as
// [u32 little-endian n][n bytes of .index][the rest: shard 0]. A malformed input
// must end in a qkv::Error; anything else (a crash, a sanitizer report, another
// exception) is a finding. Seeds: fuzz/corpus/tf_checkpoint (tests/io/make_keras_tf_fixtures.py).
#include <cstddef>
#include <cstdint>
#include <span>

#include "qkv/io_tf.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const size_t n = static_cast<size_t>(data[0]) | static_cast<size_t>(data[1]) << 8 |
                   static_cast<size_t>(data[2]) << 16 | static_cast<size_t>(data[3]) << 24;
  const auto rest = std::as_bytes(std::span(data + 4, size - 4));
  const auto index = rest.first(n < rest.size() ? n : rest.size());
  const std::span<const std::byte> shards[] = {rest.subspan(index.size())};
  try {
    const qkv::io::WeightFile ck = qkv::io::parse_tf_checkpoint(index, shards, "fuzz");
    // Reading every element lets ASan check each view's geometry against its storage.
    volatile double sink = 0;
    for (const auto& [name, t] : ck.tensors) {
      for (double v : t.to_vector<double>()) sink = sink + v;
    }
    for (const auto& e : ck.entries) sink = sink + static_cast<double>(e.name.size() + e.shape.size());
  } catch (const qkv::Error&) {
  }
  return 0;
}
