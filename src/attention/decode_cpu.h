// decode_attention's checked geometry and its CPU kernel and reference (qkv/kv_cache.h).
#pragma once

#include <cstdint>

#include "qkv/kv_cache.h"

namespace qkv::attention {

struct DecodeCall {
  int64_t b = 0, hq = 0, hk = 0, lq = 0, dk = 0, dv = 0;
  int64_t group = 1;  // query heads per cache head
  double scale = 1.0;
  int64_t window = 0;  // the options', or the cache's own (KVCacheConfig::window)
};

// ShapeError / DTypeError / ValueError naming `op` (kv_cache.cc).
DecodeCall check_decode(const Tensor& q, const KVCache& cache, const DecodeOptions& options, const char* op);

// The keys query t of sequence b sees: [first, last) (decode_cpu.cc; the reference has its own loop).
struct KeyRange {
  int64_t first = 0, last = 0;
};
KeyRange decode_keys(const DecodeCall& d, bool causal, int64_t length, int64_t t);

// q [B, Hq, Lq, D] rotated at its positions length(b) - Lq + t by the cache's rotary settings
// (apply_rotary, or apply_rotary_reference for the reference).
Tensor rotate_queries(const Tensor& q, const KVCache& cache, bool reference);

AttentionResult decode_attention_cpu(const DecodeCall& d, const Tensor& q, const KVCache& cache,
                                     const DecodeOptions& options);

}  // namespace qkv::attention
