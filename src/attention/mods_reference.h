// AttentionMods for the float64 references (attention_reference.cc and
// attention_backward_reference.cc), written from qkv/attention_mods.h's definitions
// element by element, apart from the kernels' plan (attention/mods.h), which it checks.
#pragma once

#include <cstdint>
#include <vector>

#include "qkv/attention.h"

namespace qkv::attention {

class ReferenceMods {
 public:
  ReferenceMods(const AttentionMods& mods, int64_t lq, int64_t lk, int64_t heads);
  bool active() const { return active_; }
  // allowed(b, h, i, j) of the header, for flat batch entry `entry` (heads included).
  bool allowed(int64_t entry, int64_t i, int64_t j) const;
  // The modified score of scale q.k = s; *cap_grad (when given) = d score / d s through softcap.
  double score(double s, int64_t entry, int64_t i, int64_t j, double* cap_grad = nullptr) const;
  // The value of a key that is not allowed: masked_fill, or -inf.
  double masked() const;

 private:
  const AttentionMods& m_;
  bool active_;
  int64_t lq_, lk_, heads_;
  std::vector<double> qdoc_, kdoc_, alibi_, relative_, pattern_;
  std::vector<std::vector<int64_t>> random_;  // [query block] -> its random key blocks
};

}  // namespace qkv::attention
