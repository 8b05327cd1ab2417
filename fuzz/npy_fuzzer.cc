// libFuzzer target: qkv::io::parse_npy on arbitrary bytes. A malformed input must
// end in a qkv::Error; anything else (a crash, a sanitizer report, another
// exception, a broken round trip) is a finding.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "qkv/io.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const qkv::Tensor t = qkv::io::parse_npy(std::as_bytes(std::span(data, size)), "fuzz.npy");
    // Reading every element lets ASan check the view's geometry against its storage.
    volatile double sink = 0;
    for (double v : t.to_vector<double>()) sink = sink + v;
    // What we read we must write back and read again identically.
    const auto bytes = qkv::io::serialize_npy(t);
    if (qkv::io::serialize_npy(qkv::io::parse_npy(bytes, "roundtrip.npy")) != bytes) std::abort();
    // Written column-major, it must read back (as a strided view) to the same values.
    const auto fortran = qkv::io::serialize_npy(t, /*fortran_order=*/true);
    if (qkv::io::serialize_npy(qkv::io::parse_npy(fortran, "fortran.npy")) != bytes) std::abort();
  } catch (const qkv::Error&) {
  }
  return 0;
}
