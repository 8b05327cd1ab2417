// Checked geometry of one attention call, shared by every attention kernel so
// that they accept exactly the same inputs and report the same errors.
#pragma once

#include <cstdint>
#include <optional>

#include "qkv/attention.h"

namespace qkv::attention {

struct Problem {
  Shape batch;         // broadcast leading dims of q, k, v (heads included)
  int64_t batch_size = 1;
  int64_t lq = 0, lk = 0, dk = 0, dv = 0;
  int64_t heads_q = 1;  // size of dim -3 of the output (1 when rank < 3)
  int64_t gqa_group = 1;  // q heads sharing one k/v head
  double scale = 1.0;
  DType out_dtype = DType::f32;
  // q, k, v and the mask expanded to the batch with zero strides (never copied).
  // With GQA, k/v keep their own head dim; use kv_batch_offset.
  Tensor q, k, v;
  std::optional<Tensor> mask;  // [batch..., Lq, Lk], bool or floating
};

// Validates the inputs and options (ShapeError, DTypeError, ValueError naming
// "scaled_dot_product_attention" and the shapes) and returns the geometry.
Problem make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                     const char* op);

// Element offset of batch entry `b` (row-major over problem.batch) in tensor `t`,
// whose batch dims are problem.batch (or k/v's own heads under GQA: `gqa_group` > 1).
int64_t batch_offset(const Tensor& t, const Shape& batch, int64_t b, int64_t gqa_group);

}  // namespace qkv::attention
