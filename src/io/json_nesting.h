// JSON of a file refused when nested too deep, while nlohmann parses it and before it
// builds the container: nlohmann builds any depth (20M levels of '[' in a 40 MB
// safetensors header took 1.5 GB and 5.3 s). Used by the safetensors header
// (src/io/safetensors.cc) and, through io/keras_tf/keras_config.h (qkv_io_keras: the Keras
// limit and its check), by the .keras reader and writer and nn::keras_config_layer_order.
// Header-only: nlohmann is each layer's private dependency.
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "io/io_internal.h"

namespace qkv::io::detail {

// How deep a file's JSON may nest, and how a refusal reads:
// "<what> nests JSON <max_levels + 1> levels deep<why>".
struct JsonNesting {
  int max_levels;         // objects and arrays inside one another, the outermost counted
  std::string_view what;  // "header", "config.json"
  std::string_view why;   // ", which the reference (serde_json) refuses"
};

// First thing in a parser callback: FormatError (fail_at; E: a writer's ValueError) at the
// start of an object or array with `depth` (nlohmann's: the containers around it) = limit.max_levels.
template <class E = FormatError>
inline void check_json_nesting(int depth, nlohmann::json::parse_event_t event, const JsonNesting& limit,
                               const Context& ctx) {
  if ((event == nlohmann::json::parse_event_t::object_start || event == nlohmann::json::parse_event_t::array_start) &&
      depth >= limit.max_levels) {
    fail_at<E>(ctx, limit.what, " nests JSON ", limit.max_levels + 1, " levels deep", limit.why);
  }
}

// nlohmann's own error `e` as the refusal of limit.what: FormatError (E) "<what> is not valid
// JSON: <its message, printable>" (it quotes the bytes read). Also a SAX handler's parse_error.
template <class E = FormatError>
[[noreturn]] inline void fail_invalid_json(const nlohmann::json::exception& e, const JsonNesting& limit,
                                           const Context& ctx) {
  fail_at<E>(ctx, limit.what, " is not valid JSON: ", printable(e.what()));
}

// nlohmann::json::parse with check_json_nesting before `keep` (its callback: what to keep;
// nullptr keeps everything, a callback returning false builds nothing). nlohmann's own
// errors are FormatError (E) "<what> is not valid JSON: <its message, printable>".
template <class E = FormatError>
inline nlohmann::json parse_json_nesting_at_most(std::string_view text, const JsonNesting& limit, const Context& ctx,
                                                 const nlohmann::json::parser_callback_t& keep = nullptr) {
  const nlohmann::json::parser_callback_t checked = [&](int depth, nlohmann::json::parse_event_t event,
                                                        nlohmann::json& parsed) {
    check_json_nesting<E>(depth, event, limit, ctx);
    return keep ? keep(depth, event, parsed) : true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), checked);
  } catch (const nlohmann::json::exception& e) {
    fail_invalid_json<E>(e, limit, ctx);
  }
}

}  // namespace qkv::io::detail
