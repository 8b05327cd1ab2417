// A Keras config.json as qkv reads and writes it (not public API): how one nested deeper
// than io::kMaxKerasConfigLevels (qkv/io_keras.h, the one place that number is written) is
// refused, and the check of the .keras reader (keras_zip.cc: load_keras_archive,
// io::check_keras_config) and writer (keras_zip_writer.cc). nn::keras_config_layer_order
// (src/nn/keras_layout.cc) reads the names through SAX events under the same limit and words.
// In qkv_io_keras, above the generic depth check (io/json_nesting.h, qkv_io: safetensors too).
#pragma once

#include <array>
#include <cstddef>
#include <string_view>

#include "io/json_nesting.h"
#include "qkv/io_keras.h"

namespace qkv::io::detail {

namespace keras_config_text {
constexpr std::string_view kBefore = ", more than the ";
// Python's own limit (994 arrays at the top of Python 3.11), not qkv's: it stays when qkv's moves.
constexpr std::string_view kAfter = " qkv reads (Python's json, which Keras reads it with, refuses about 1000)";
constexpr size_t decimal_length(int n) {
  size_t digits = 1;
  for (; n >= 10; n /= 10) ++digits;
  return digits;
}
constexpr size_t kDigits = decimal_length(kMaxKerasConfigLevels);
// kBefore, kMaxKerasConfigLevels in decimal, kAfter: the message is built from the number.
constexpr std::array<char, kBefore.size() + kDigits + kAfter.size()> too_deep() {
  std::array<char, kBefore.size() + kDigits + kAfter.size()> out{};
  size_t at = 0;
  for (const char c : kBefore) out[at++] = c;
  int n = kMaxKerasConfigLevels;
  for (size_t i = kDigits; i > 0; n /= 10) out[at + --i] = static_cast<char>('0' + n % 10);
  at += kDigits;
  for (const char c : kAfter) out[at++] = c;
  return out;
}
inline constexpr auto kTooDeep = too_deep();
}  // namespace keras_config_text

static_assert(kMaxKerasConfigLevels > 0);
// ", more than the 1000 qkv reads (Python's json, which Keras reads it with, refuses about 1000)"
inline constexpr std::string_view kKerasConfigTooDeep{keras_config_text::kTooDeep.data(),
                                                      keras_config_text::kTooDeep.size()};

// The limit of a Keras config.json whose refusals name it `what` ("config.json", "it").
constexpr JsonNesting keras_config_nesting(std::string_view what) {
  return {kMaxKerasConfigLevels, what, kKerasConfigTooDeep};
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
