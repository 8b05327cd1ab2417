// libFuzzer target: qkv::io::parse_keras_h5 (libhdf5 on an in-memory image, then the
// Keras 3 / tf.keras layout readers) on arbitrary bytes. A malformed input must end
// in a qkv::Error; anything else is a finding (see docs/formats.md for what libhdf5
// itself does on hostile files). Seeds: fuzz/corpus/keras_h5 (real Keras files).
#include <cstddef>
#include <cstdint>
#include <span>

#include "qkv/io_keras.h"

// libhdf5 sizes some allocations from file metadata; on a hostile file it may ask
// malloc for ~2^64 bytes. Outside ASan malloc returns null and libhdf5 reports an
// error, which qkv turns into a FormatError; this makes ASan behave the same way
// instead of aborting (an attempted huge allocation is not a memory error).
// Leak detection is off: libhdf5 1.10.8 leaks small blocks (56 bytes) inside H5Fopen
// when it rejects a file; well-formed files leak nothing (docs/formats.md).
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1:detect_leaks=0"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const qkv::io::WeightFile w = qkv::io::parse_keras_h5(std::as_bytes(std::span(data, size)), "fuzz.h5");
    volatile double sink = 0;
    for (const auto& [name, t] : w.tensors) {
      for (double v : t.to_vector<double>()) sink = sink + v;
    }
  } catch (const qkv::Error&) {
  }
  return 0;
}
