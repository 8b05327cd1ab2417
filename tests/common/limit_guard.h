// Sets qkv's allocation limit (QKV_MAX_ALLOC_BYTES) for one scope of a test and restores
// the process default after it, so a small limit never leaks into the next test.
#pragma once

#include <cstddef>
#include <optional>

#include "qkv/size.h"

namespace qkv {

struct LimitGuard {
  explicit LimitGuard(std::optional<size_t> limit) { set_max_alloc_bytes(limit); }
  ~LimitGuard() { set_max_alloc_bytes(std::nullopt); }
  LimitGuard(const LimitGuard&) = delete;
  LimitGuard& operator=(const LimitGuard&) = delete;
};

}  // namespace qkv
