// merge_partial: attention over a split key axis, recombined by logsumexp (dist/internal.h).
//
// Attention over keys K = K1 ∪ K2 is softmax-weighted, so with m_i = logsumexp of row i's
// scores over K_i and o_i its normalised output, the whole row is
//   o = (exp(m1) o1 + exp(m2) o2) / (exp(m1) + exp(m2)),  m = log(exp(m1) + exp(m2));
// the same merge as FlashAttention's tiles and the split-KV decode (docs/distributed.md).
#include <cmath>
#include <limits>
#include <string>

#include "dist/internal.h"
#include "dist/ring_plan.h"
#include "qkv/attention.h"
#include "qkv/error.h"
#include "qkv/parallel.h"

namespace qkv::dist {

void merge_partial(const Tensor& out, const Tensor& lse, const Tensor& part, const Tensor& lse_part) {
  const int64_t dv = out.size(-1);
  const int64_t rows = lse.numel();
  if (part.shape() != out.shape() || lse_part.shape() != lse.shape() || rows * dv != out.numel() ||
      !out.is_contiguous() || !part.is_contiguous() || !lse.is_contiguous() || !lse_part.is_contiguous()) {
    fail<ShapeError>("merge_partial: out ", shape_str(out.shape()), ", part ", shape_str(part.shape()), ", lse ",
                     shape_str(lse.shape()), ", lse_part ", shape_str(lse_part.shape()), " (contiguous, alike)");
  }
  float* o = out.data<float>();
  float* m = lse.data<float>();
  const float* p = part.data<float>();
  const float* mp = lse_part.data<float>();
  parallel_for(0, rows, 64, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (mp[i] == -std::numeric_limits<float>::infinity()) continue;  // nothing allowed in this part
      const float m_new =
          m[i] > mp[i] ? m[i] + std::log1p(std::exp(mp[i] - m[i])) : mp[i] + std::log1p(std::exp(m[i] - mp[i]));
      const float a = std::exp(m[i] - m_new);  // exp(-inf) = 0 for a row with nothing yet
      const float b = std::exp(mp[i] - m_new);
      float* oi = o + i * dv;
      const float* pi = p + i * dv;
      for (int64_t d = 0; d < dv; ++d) oi[d] = a * oi[d] + b * pi[d];
      m[i] = m_new;
    }
  });
}

void check_kernel_shapes(const char* op, const Tensor& q, const Tensor& k, const Tensor& v, std::optional<double> scale,
                         bool enable_gqa, const std::optional<Tensor>& attn_mask) {
  if (q.dim() < 2 || k.dim() < 2 || v.dim() < 2) return;  // the callers' own checks report ranks
  AttentionOptions o;
  o.scale = scale;
  o.enable_gqa = enable_gqa;
  if (attn_mask && attn_mask->dim() >= 2) {  // attend (True, or 0 added): only shapes matter here
    const Shape ms = with_last2(*attn_mask, 1, 1);
    o.attn_mask = attn_mask->dtype() == DType::b8 ? Tensor::ones(ms, DType::b8) : Tensor::zeros(ms, attn_mask->dtype());
  }
  try {
    (void)scaled_dot_product_attention(
        Tensor::zeros(with_last2(q, 1, q.size(-1)), q.dtype()), Tensor::zeros(with_last2(k, 1, k.size(-1)), k.dtype()),
        Tensor::zeros(with_last2(v, k.size(-2) == v.size(-2) ? 1 : 2, v.size(-1)), v.dtype()), o);
  } catch (const Interrupted&) {  // not the shapes' fault: as they are
    throw;
  } catch (const OutOfMemoryError&) {
    throw;
  } catch (const Error& e) {
    fail<ShapeError>(op, ": q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()),
                     (attn_mask ? ", attn_mask " + shape_str(attn_mask->shape()) : std::string()),
                     " do not fit the attention kernel: ", e.what());
  }
}

}  // namespace qkv::dist
