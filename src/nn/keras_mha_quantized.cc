// KerasMultiHeadAttention::quantize_dynamic (qkv/nn/keras_mha.h): int8 projections.
#include "qkv/error.h"
#include "qkv/nn/keras_mha.h"

namespace qkv::nn {

KerasMultiHeadAttention KerasMultiHeadAttention::quantize_dynamic() const {
  if (!built()) fail<ValueError>("KerasMultiHeadAttention.quantize_dynamic: the layer is not built");
  KerasMultiHeadAttention q = *this;
  for (Linear* l : {&q.query_, &q.key_, &q.value_, &q.output_, &q.gate_}) {
    if (l->defined()) *l = l->quantize_dynamic();
  }
  return q;
}

}  // namespace qkv::nn
