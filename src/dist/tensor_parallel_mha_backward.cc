// TensorParallelAttention::backward (qkv/dist/tensor_parallel_mha.h).
//
// Forward, per rank r (tensor_parallel_mha.cc):     Backward (the forward line it differentiates):
//   (1) q = split(x_q Wq_r^T + bq_r); k, v alike       dWq_r, dbq_r, dx_q  <- (1); dx_* all-reduced
//   (2) o = attention(q, k, v)                          dq, dk, dv          <- (2), the fused backward
//   (3) y_r = merge(o) Wo_r^T                           dmerge(o), dWo_r    <- (3), no communication
//   (4) y = all_reduce_r(y_r) + bo                      dy_r = dy, dbo = sum dy <- (4)
#include <string>

#include "nn/heads.h"
#include "qkv/attention_backward.h"
#include "qkv/device.h"
#include "qkv/dist/tensor_parallel_mha.h"
#include "qkv/error.h"

namespace qkv::dist {
namespace {

// sum of dy over every leading index: [..., E] -> [E] (the gradient of a bias added to every row).
Tensor sum_rows(const Tensor& dy) {
  const int64_t e = dy.size(-1);
  const std::vector<float> v = dy.to(DType::f32).contiguous().to_vector<float>();
  std::vector<float> out(static_cast<size_t>(e), 0.0f);
  for (size_t i = 0; i < v.size(); ++i) out[i % static_cast<size_t>(e)] += v[i];
  return Tensor::from_vector(out, {e});
}

}  // namespace

TensorParallelGradients TensorParallelAttention::backward(const Tensor& query, const Tensor& key, const Tensor& value,
                                                          const Tensor& grad_output,
                                                          const TensorParallelOptions& options) const {
  const bool bf = config_.batch_first;
  if (query.dim() == 2 && key.dim() == 2 && value.dim() == 2) {  // unbatched [L, E]
    const int64_t n = bf ? 0 : 1;
    TensorParallelGradients g =
        backward(query.unsqueeze(n), key.unsqueeze(n), value.unsqueeze(n), grad_output.unsqueeze(n), options);
    g.query = g.query.squeeze(n), g.key = g.key.squeeze(n), g.value = g.value.squeeze(n);
    return g;
  }
  check_inputs("TensorParallelAttention.backward", query, key, value, options, [&] {
    require_cpu("TensorParallelAttention.backward", {&grad_output});
    Shape out_shape = query.shape();
    out_shape.back() = config_.embed_dim;
    if (!is_floating(grad_output.dtype())) {  // a dtype error, as check_inputs reports query's
      fail<DTypeError>("TensorParallelAttention.backward: grad_output is ", dtype_name(grad_output.dtype()), " ",
                       shape_str(grad_output.shape()), "; it must be floating point, as the output");
    }
    if (grad_output.shape() != out_shape) {
      fail<ShapeError>("TensorParallelAttention.backward: grad_output is ", shape_str(grad_output.shape()),
                       ", the output ", shape_str(out_shape));
    }
  });
  TensorParallelGradients g;
  if (o_bias_) g.params["o_proj.bias"] = sum_rows(grad_output);  // (4)
  Tensor dx_q = Tensor::zeros(query.shape()), dx_k = Tensor::zeros(key.shape()), dx_v = Tensor::zeros(value.shape());
  if (hq_local_ > 0) {
    const Local a = attend(query, key, value, options);                 // (1), (2) again
    const nn::LinearGradients go = o_.backward(a.merged, grad_output);  // (3)
    g.params["o_proj.weight"] = go.dweight;
    const Tensor dheads = nn::detail::split_heads(go.dx, hq_local_, bf);  // [N, hq, L, D]
    const AttentionGradients ga =
        scaled_dot_product_attention_backward(a.q, a.k, a.v, a.heads, dheads, a.lse, a.options);  // (2)
    Tensor dk = ga.dk, dv = ga.dv;
    if (!aligned()) {  // the copies per query head fold back into their key/value head
      dk = Tensor::zeros({ga.dk.size(0), hk_local_, ga.dk.size(2), ga.dk.size(3)});
      dv = Tensor::zeros({ga.dv.size(0), hk_local_, ga.dv.size(2), ga.dv.size(3)});
      for (int64_t i = 0; i < hq_local_; ++i) {
        const Tensor dki = dk.select(1, key_head_of(i)), dvi = dv.select(1, key_head_of(i));
        dki.copy_from(nn::detail::add_broadcast(dki, ga.dk.select(1, i)));
        dvi.copy_from(nn::detail::add_broadcast(dvi, ga.dv.select(1, i)));
      }
    }
    const std::pair<const char*, nn::LinearGradients> proj[] = {
        {"q_proj", q_.backward(query, nn::detail::merge_heads(ga.dq, bf))},  // (1)
        {"k_proj", k_.backward(key, nn::detail::merge_heads(dk, bf))},
        {"v_proj", v_.backward(value, nn::detail::merge_heads(dv, bf))}};
    for (const auto& [name, lg] : proj) {
      g.params[std::string(name) + ".weight"] = lg.dweight;
      if (lg.dbias) g.params[std::string(name) + ".bias"] = *lg.dbias;
    }
    dx_q = proj[0].second.dx, dx_k = proj[1].second.dx, dx_v = proj[2].second.dx;
  }
  // (1)'s inputs reach every rank's heads: their gradients sum over ranks.
  for (Tensor* t : {&dx_q, &dx_k, &dx_v}) {
    *t = t->contiguous();
    comm_.all_reduce_sum(*t);
  }
  g.query = dx_q, g.key = dx_k, g.value = dx_v;
  return g;
}

}  // namespace qkv::dist
