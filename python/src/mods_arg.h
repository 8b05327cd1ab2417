// qkv.AttentionMods (python/qkv/mods.py, a dataclass) as qkv::AttentionMods: its attributes
// read by name and converted with args.h's messages ("scaled_dot_product_attention: mods.prefix
// ..."). None gives no modifier.
#pragma once

#include <nanobind/nanobind.h>

#include "qkv/attention_mods.h"

namespace qkv::python {

AttentionMods mods_arg(nanobind::handle mods, const char* op);

}  // namespace qkv::python
