// libFuzzer target: qkv::io::parse_safetensors on arbitrary bytes. A malformed
// input must end in a qkv::Error; anything else (a crash, a sanitizer report,
// another exception, a broken round trip) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "qkv/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const qkv::io::SafetensorsFile f =
        qkv::io::parse_safetensors(std::as_bytes(std::span(data, size)), "fuzz.safetensors");
    // Reading every element lets ASan check each view's geometry against its storage.
    volatile double sink = 0;
    for (const auto& [name, t] : f.tensors) {
      for (double v : t.to_vector<double>()) sink = sink + v;
    }
    // What we read we must write back and read again identically.
    const auto bytes = qkv::io::serialize_safetensors(f.tensors, f.metadata);
    const qkv::io::SafetensorsFile back = qkv::io::parse_safetensors(bytes, "roundtrip.safetensors");
    if (back.metadata != f.metadata || qkv::io::serialize_safetensors(back.tensors, back.metadata) != bytes) {
      std::abort();
    }
  } catch (const qkv::Error&) {
  }
  return 0;
}
