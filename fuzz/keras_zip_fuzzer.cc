// libFuzzer target: the .keras zip reader (central directory, local headers,
// stored/deflated members, crc32) on arbitrary bytes, through zip_member, which
// does not go on into HDF5 (keras_h5_fuzzer covers that). A malformed input must
// end in a qkv::Error. Seeds: fuzz/corpus/keras_zip.
#include <cstddef>
#include <cstdint>
#include <span>

#include "qkv/io_keras.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  for (const char* name : {"config.json", "metadata.json", "model.weights.h5"}) {
    try {
      const auto member = qkv::io::zip_member(bytes, name, "fuzz.keras");
      volatile size_t sink = member.size();
      (void)sink;
    } catch (const qkv::Error&) {
    }
  }
  return 0;
}
