// KerasMultiHeadAttention::quantize_dynamic (qkv/nn/keras_mha.h): int8 projections.
#include "qkv/error.h"
#include "qkv/nn/keras_mha.h"

namespace qkv::nn {

KerasMultiHeadAttention KerasMultiHeadAttention::quantize_dynamic(int weight_bits) const {
  constexpr const char* kOp = "KerasMultiHeadAttention.quantize_dynamic";
  if (!built()) fail<ValueError>(kOp, ": the layer is not built");
  const int bits = int8_weight_bits(weight_bits, kOp);
  KerasMultiHeadAttention q = *this;
  for (Linear* l : {&q.query_, &q.key_, &q.value_, &q.output_, &q.gate_}) {
    if (l->defined()) *l = l->quantize_dynamic(bits);
  }
  return q;
}

}  // namespace qkv::nn
