// The Keras HDF5 readers' libhdf5 calls in a child process (io/isolated.h): libhdf5
// 1.10.8 crashes, hangs or allocates without bound on hostile files, and a crash in
// the child is a FormatError here instead of the end of the caller's process.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "io/keras_tf/hdf5_internal.h"
#include "io/keras_tf/isolated.h"
#include "io/keras_tf/weight_file_wire.h"

namespace qkv::io::detail {
namespace {

// QKV_HDF5_TIMEOUT_S: seconds the reader process may take (default 120).
std::chrono::milliseconds reader_timeout(const Context& ctx) {
  const char* text = std::getenv("QKV_HDF5_TIMEOUT_S");
  if (text == nullptr || *text == '\0') return std::chrono::seconds(120);
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (*end != '\0' || !(seconds > 0) || seconds > 1e6) {
    fail_at<ValueError>(ctx, "QKV_HDF5_TIMEOUT_S=", quote_excerpt(text), " is not a number of seconds in (0, 1e6]");
  }
  return std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)));
}

bool read_in_process() {
  const char* flag = std::getenv("QKV_HDF5_IN_PROCESS");
  return flag != nullptr && std::string_view(flag) == "1";
}

}  // namespace

WeightFile read_keras_h5_isolated(std::span<const std::byte> bytes, bool data, const Context& ctx) {
  check_hdf5_signature(bytes, ctx);  // no process for what is not HDF5 at all
  if (read_in_process()) {
    auto lock = hdf5_lock();
    return read_keras_h5(bytes, data, ctx);
  }
  IsolationOptions options;
  options.failure = "libhdf5 failed on this file";
  options.hint = "the file is malformed or not a Keras weight file";
  options.timeout = reader_timeout(ctx);
  options.timeout_setting = "QKV_HDF5_TIMEOUT_S";
  // Generous: read_keras_h5 lets each dataset claim 64x the file; libhdf5's own
  // metadata for a real file is small. What a hostile file asks beyond it fails.
  options.memory_bytes = std::max(size_t{4} << 30, std::min(bytes.size(), SIZE_MAX / 128) * 64);
  options.fork_lock = hdf5_lock;
  const auto reply = run_isolated(ctx, options, [&] { return encode_weight_file(read_keras_h5(bytes, data, ctx)); });
  return decode_weight_file(reply, ctx);
}

}  // namespace qkv::io::detail
