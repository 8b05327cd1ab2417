// A Keras config.json as qkv reads and writes it (not public API): how one nested deeper
// than io::kMaxKerasConfigLevels (qkv/io_keras.h, the one place that number is written) is
// refused, and the check of the .keras reader (keras_zip.cc: load_keras_archive,
// io::check_keras_config) and writer (keras_zip_writer.cc). nn::keras_config_layer_order
// (src/nn/keras_layout.cc) reads the names through SAX events under the same limit and words.
// In qkv_io_keras, above the generic depth check (io/json_nesting.h, qkv_io: safetensors too).
#pragma once

#include <string>
#include <string_view>

#include "io/json_nesting.h"
#include "qkv/io_keras.h"

namespace qkv::io::detail {

// ", more than the 1000 qkv reads (Python's json, which Keras reads it with, refuses about 1000)":
// the first number is kMaxKerasConfigLevels; the second is Python's own limit (994 arrays at the
// top of Python 3.11), not qkv's, so it stays when qkv's moves.
inline std::string_view keras_config_too_deep() {
  static const std::string text = ", more than the " + std::to_string(kMaxKerasConfigLevels) +
                                  " qkv reads (Python's json, which Keras reads it with, refuses about 1000)";
  return text;
}

// The limit of a Keras config.json whose refusals name it `what` ("config.json", "it").
inline JsonNesting keras_config_nesting(std::string_view what) {
  return {kMaxKerasConfigLevels, what, keras_config_too_deep()};
}

// A Keras config.json checked as load_keras_archive reads it and save_keras_archive writes it
// (valid JSON nested at most kMaxKerasConfigLevels), nothing built: a deflated member
// inflates up to 1 GiB. E: FormatError for a file read, ValueError for an argument written.
template <class E = FormatError>
inline void check_keras_config(std::string_view text, std::string_view what, const Context& ctx) {
  (void)parse_json_nesting_at_most<E>(text, keras_config_nesting(what), ctx,
                                      [](int, nlohmann::json::parse_event_t, nlohmann::json&) { return false; });
}

}  // namespace qkv::io::detail
