// Checked geometry of one attention call, shared by every attention kernel so
// that they accept exactly the same inputs and report the same errors.
//
// The dispatcher (attention.cc) checks a call once, with make_problem, and hands the
// Problem to the kernel it picks; kernels take a Problem, never raw q, k, v, so
// that an unchecked call cannot reach them (only make_problem and with_operands
// construct one).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <vector>

#include "qkv/attention.h"

namespace qkv::attention {

class Problem {
 public:
  const char* op = "";  // the operation errors name ("scaled_dot_product_attention")
  Device device;        // of q, k, v and the mask (one device, checked)
  Shape batch;          // broadcast leading dims of q, k, v (heads included)
  int64_t batch_size = 1;
  int64_t lq = 0, lk = 0, dk = 0, dv = 0;
  int64_t heads_q = 1;    // size of dim -3 of the output (1 when rank < 3)
  int64_t gqa_group = 1;  // q heads sharing one k/v head
  double scale = 1.0;
  DType out_dtype = DType::f32;  // the dtype of the user's q
  // The operands as given (their shapes are the user's; with_operands may have
  // converted their dtype or layout).
  Tensor q_in, k_in, v_in;
  std::optional<Tensor> mask_in;
  // q, k, v and the mask expanded to the batch with zero strides (never copied).
  // With GQA, k/v keep their own head dim (batch_offset with gqa_group).
  Tensor q, k, v;
  std::optional<Tensor> mask;  // [batch..., Lq, Lk], bool or floating

 private:
  Problem() = default;
  friend Problem make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                              const char* op);
  friend Problem with_operands(const Problem& p, Tensor q, Tensor k, Tensor v, std::optional<Tensor> mask);
};

// Validates the inputs and options (ShapeError, DTypeError, ValueError naming
// `op` and the shapes) and returns the geometry. Error text is built only when a
// check fails.
Problem make_problem(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options,
                     const char* op);

// Names a public attention call in out-of-memory errors (qkv/out_of_memory.h):
// "scaled_dot_product_attention (q [...], k [...], v [...], attn_mask [...])". Copies
// the shapes (a few dozen bytes); builds no string unless an error needs it.
class CallScope {
 public:
  CallScope(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& options)
      : shapes_(shapes_of(q, k, v, options)),
        scope_(op, {}, shapes_, options.attn_mask ? "q, k, v, attn_mask" : "q, k, v") {}

 private:
  static std::vector<Shape> shapes_of(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& o) {
    std::vector<Shape> s{q.shape(), k.shape(), v.shape()};
    if (o.attn_mask) s.push_back(o.attn_mask->shape());
    return s;
  }
  std::vector<Shape> shapes_;  // q, k, v(, attn_mask)
  AllocationScope scope_;
};

// `p` with other operands of the same shapes as p.q_in, p.k_in, p.v_in and
// p.mask_in (a kernel's converted or compacted copies), expanded the same way;
// nothing is checked again. std::logic_error when a shape differs (a bug).
Problem with_operands(const Problem& p, Tensor q, Tensor k, Tensor v, std::optional<Tensor> mask);

// Dk == 0 (every score is the empty dot product 0, whatever the scale: 1/sqrt(0) = inf by
// default) as a call the fused kernels run: q and k with one zero column, and `options` (the
// caller's copy, changed in place) with scale 1 and no int8 Q K^T, so that every score is
// exactly 0 before masks and modifiers. Checked as make_problem checks any call.
Problem zero_dk_problem(const Tensor& q, const Tensor& k, const Tensor& v, AttentionOptions& options, const char* op);

// `leading` followed by `tail`: the shape [batch..., tail...] of an operand or a result.
Shape with_tail(Shape leading, std::initializer_list<int64_t> tail);

// Element offset of batch entry `b` (row-major over problem.batch) in tensor `t`,
// whose batch dims are problem.batch (or k/v's own heads under GQA: `gqa_group` > 1).
int64_t batch_offset(const Tensor& t, const Shape& batch, int64_t b, int64_t gqa_group);

}  // namespace qkv::attention
