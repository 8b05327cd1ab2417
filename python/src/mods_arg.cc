// mods_arg (mods_arg.h): a qkv.AttentionMods read attribute by attribute.
#include "mods_arg.h"

#include <nanobind/stl/string.h>

#include <cstdint>
#include <limits>
#include <string>

#include "args.h"
#include "tensor_convert.h"

namespace qkv::python {

namespace nb = nanobind;

AttentionMods mods_arg(nb::handle mods, const char* op) {
  AttentionMods m;
  if (mods.is_none()) return m;
  if (!nb::hasattr(mods, "window_left") || !nb::hasattr(mods, "masked_fill")) {
    throw nb::type_error((std::string(op) + ": mods must be a qkv.AttentionMods, got " +
                          nb::cast<std::string>(nb::str(mods.type().attr("__name__"))))
                             .c_str());
  }
  auto name = [op](const char* field) { return std::string(op) + ": mods." + field; };
  auto get = [&](const char* field) { return nb::getattr(mods, field); };
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max() / 4;
  const std::string align = str_arg(get("align"), name("align"));
  if (align != "top_left" && align != "bottom_right") {
    throw nb::value_error((name("align") + " must be 'top_left' or 'bottom_right', got '" + align + "'").c_str());
  }
  m.align = align == "bottom_right" ? AttentionMods::Align::bottom_right : AttentionMods::Align::top_left;
  m.window_left = optional_int_arg(get("window_left"), name("window_left"), 0, kMax);
  m.window_right = optional_int_arg(get("window_right"), name("window_right"), 0, kMax);
  m.dilation = int_arg(get("dilation"), name("dilation"), 1, kMax);
  m.block_size = int_arg(get("block_size"), name("block_size"), 1, kMax);
  m.prefix = int_arg(get("prefix"), name("prefix"), 0, kMax);
  m.global_tokens = int_list_arg(get("global_tokens"), name("global_tokens"), 0, kMax);
  m.block_pattern = to_optional_tensor(get("block_pattern"), name("block_pattern").c_str());
  m.random_blocks = int_arg(get("random_blocks"), name("random_blocks"), 0, kMax);
  m.random_seed = uint64_arg(get("random_seed"), name("random_seed"));
  m.document_ids = to_optional_tensor(get("document_ids"), name("document_ids").c_str());
  m.key_document_ids = to_optional_tensor(get("key_document_ids"), name("key_document_ids").c_str());
  m.softcap = float_arg(get("softcap"), name("softcap"));
  m.alibi_slopes = to_optional_tensor(get("alibi_slopes"), name("alibi_slopes").c_str());
  m.relative_bias = to_optional_tensor(get("relative_bias"), name("relative_bias").c_str());
  m.masked_fill = optional_float_arg(get("masked_fill"), name("masked_fill"));
  return m;
}

}  // namespace qkv::python
