// KVCache::state / from_state (qkv/kv_cache.h): a cache as named tensors, and back.
#include <algorithm>
#include <string>

#include "qkv/error.h"
#include "qkv/kv_cache.h"

namespace qkv {

namespace {

constexpr const char* kOp = "KVCache.from_state";

const Tensor& need(const std::map<std::string, Tensor>& s, const std::string& name) {
  const auto it = s.find(name);
  if (it == s.end()) fail<ValueError>(kOp, ": the state has no '", name, "'");
  return it->second;
}

}  // namespace

std::map<std::string, Tensor> KVCache::state() const {
  const int64_t used = lengths_.empty() ? 0 : *std::max_element(lengths_.begin(), lengths_.end());
  std::map<std::string, Tensor> s;
  s["keys"] = k_.slice(2, 0, used).contiguous();  // [B, Hk, used, D]
  s["values"] = v_.slice(2, 0, used).contiguous();
  s["lengths"] = Tensor::from_vector(lengths_, {config_.batch});
  s["capacity"] = Tensor::from_vector<int64_t>({config_.capacity}, {1});
  if (config_.dtype == DType::i8) {
    s["key_scales"] = k_scale_.slice(2, 0, used).contiguous();  // [B, Hk, used]
    s["value_scales"] = v_scale_.slice(2, 0, used).contiguous();
    s["key_offsets"] = k_offset_;
    s["key_spreads"] = k_spread_;
  }
  return s;
}

KVCache KVCache::from_state(const std::map<std::string, Tensor>& s) {
  const Tensor& k = need(s, "keys");
  const Tensor& v = need(s, "values");
  const auto lengths = need(s, "lengths").to_vector<int64_t>();
  const auto capacity = need(s, "capacity").to_vector<int64_t>();
  if (k.dim() != 4 || v.dim() != 4 || capacity.size() != 1 || k.size(2) != v.size(2) ||
      static_cast<int64_t>(lengths.size()) != k.size(0) || k.size(2) > capacity[0]) {
    fail<ShapeError>(kOp, ": keys ", shape_str(k.shape()), ", values ", shape_str(v.shape()), ", ", lengths.size(),
                     " lengths and the capacity do not fit together");
  }
  KVCache cache({k.size(0), k.size(1), k.size(3), capacity[0], v.size(3), k.dtype()});
  const int64_t used = k.size(2);
  for (size_t b = 0; b < lengths.size(); ++b) {
    if (lengths[b] < 0 || lengths[b] > used) fail<ValueError>(kOp, ": lengths[", b, "] = ", lengths[b], " > ", used);
    cache.lengths_[b] = lengths[b];
  }
  cache.k_.slice(2, 0, used).copy_from(k);
  cache.v_.slice(2, 0, used).copy_from(v);
  if (k.dtype() == DType::i8) {
    cache.k_scale_.slice(2, 0, used).copy_from(need(s, "key_scales"));
    cache.v_scale_.slice(2, 0, used).copy_from(need(s, "value_scales"));
    cache.k_offset_.copy_from(need(s, "key_offsets"));
    cache.k_spread_.copy_from(need(s, "key_spreads"));
  }
  return cache;
}

}  // namespace qkv
