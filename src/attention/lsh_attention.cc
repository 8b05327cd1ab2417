// lsh_attention: checks the call, lays out the operands, draws the rotations, runs the kernel.
#include "qkv/lsh_attention.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "attention/lsh_attention_cpu.h"
#include "attention/qkv_geometry.h"
#include "qkv/error.h"
#include "qkv/size.h"

namespace qkv::attention {

namespace {

std::string qk_v_shapes(const Tensor& qk, const Tensor& v) {
  return "(qk " + shape_str(qk.shape()) + ", v " + shape_str(v.shape()) + ")";
}

// The bucket factors: the given ones (each even, >= 2) or Reformer's default for L
// (_set_num_buckets with max_position_embeddings = L): n = 2^floor(log2(2 L / chunk)), at
// least 2, factorized as [2^floor(e/2), 2^ceil(e/2)] (n = 2^e) past 2 max(sqrt(L / chunk), chunk).
void set_buckets(LshProblem& p, const std::vector<int64_t>& given, const char* op) {
  p.factors = given;
  if (p.factors.empty()) {
    int64_t e = 1;
    while ((int64_t{2} << e) <= 2 * (p.l / p.chunk)) ++e;
    // 2^e > 2 max(..., chunk) as 2^(e-1) > max(..., chunk): 2 chunk overflows for a chunk_length
    // past 2^62 (a "no chunking" length), which gave the factors [1, 2].
    const auto limit = std::max(static_cast<int64_t>(std::sqrt(static_cast<double>(p.l / p.chunk))), p.chunk);
    p.factors = (int64_t{1} << (e - 1)) > limit ? std::vector<int64_t>{int64_t{1} << (e / 2), int64_t{1} << (e - e / 2)}
                                                : std::vector<int64_t>{int64_t{1} << e};
  }
  p.n_buckets = 1;
  int64_t sum = 0;
  for (const int64_t f : p.factors) {
    if (f < 2 || f % 2 != 0) {
      fail<ValueError>(op, ": every bucket count (or factor) must be even and >= 2, got ", shape_str(p.factors));
    }
    const auto prod = checked_mul(p.n_buckets, f);
    if (!prod || *prod >= (int64_t{1} << 40)) fail<ValueError>(op, ": too many buckets ", shape_str(p.factors));
    p.n_buckets = *prod;
    sum += f;
  }
  p.half = sum / 2;
}

void set_rotations(LshProblem& p, const LshAttentionOptions& o, const char* op, DType compute) {
  // No heads (an empty batch): one rotation set, which serves every head there is.
  const Tensor rot = o.rotations.numel() == 0 && o.rotations.dim() <= 1
                         ? lsh_random_rotations(std::max<int64_t>(p.heads, 1), p.d, p.n_hashes, p.half, o.seed)
                         : o.rotations;
  require_cpu(op, {&rot});
  const bool ok = rot.dim() == 4 && (rot.size(0) == 1 || rot.size(0) == p.heads) && rot.size(1) == p.d &&
                  rot.size(2) == p.n_hashes && rot.size(3) == p.half;
  if (!ok || !is_floating(rot.dtype())) {
    fail<ShapeError>(op, ": rotations must be floating [", p.heads, " or 1, D = ", p.d, ", n_hashes = ", p.n_hashes,
                     ", sum(n_buckets) / 2 = ", p.half, "], got ", shape_str(rot.shape()));
  }
  p.rotations = rot.to(compute).contiguous();
}

void set_mask(LshProblem& p, const Tensor& mask, const char* op) {
  if (mask.numel() == 0 && mask.dim() <= 1) return;
  require_cpu(op, {&mask});
  Shape want = p.lead;
  want.push_back(p.l);
  bool ok = mask.dim() <= static_cast<int64_t>(want.size());
  for (int64_t i = 1; ok && i <= mask.dim(); ++i) {
    ok = mask.size(-i) == 1 || mask.size(-i) == want[want.size() - static_cast<size_t>(i)];
  }
  if (!ok) {
    fail<ShapeError>(op, ": attention_mask ", shape_str(mask.shape()), " does not broadcast to qk's [..., L] ",
                     shape_str(want));
  }
  const std::vector<double> m = mask.expand(want).to_vector<double>();
  p.mask.resize(m.size());
  for (size_t i = 0; i < m.size(); ++i) p.mask[i] = m[i] != 0.0 ? 1 : 0;
}

}  // namespace

LshProblem make_lsh_problem(const Tensor& qk, const Tensor& v, const LshAttentionOptions& o, const char* op,
                            DType compute) {
  // qk serves as q and k: say so in terms of qk and v (check_qkv would name a k never passed).
  // (Ranks are check_qkv's to report.)
  if (qk.dim() >= 2 && v.dim() == qk.dim() &&
      (v.size(-2) != qk.size(-2) || !std::equal(qk.shape().begin(), qk.shape().end() - 2, v.shape().begin()))) {
    fail<ShapeError>(op, ": qk [..., L, D] and v [..., L, Dv] must have the same leading dims and L ",
                     qk_v_shapes(qk, v));
  }
  const QkvGeometry g = check_qkv(op, qk, qk, v);
  if (o.n_hashes < 1) fail<ValueError>(op, ": n_hashes must be >= 1, got ", o.n_hashes);
  if (o.chunk_length < 1) fail<ValueError>(op, ": chunk_length must be >= 1, got ", o.chunk_length);
  if (o.num_chunks_before < 0 || o.num_chunks_after < 0) {
    fail<ValueError>(op, ": num_chunks_before and num_chunks_after must be >= 0, got ", o.num_chunks_before, ", ",
                     o.num_chunks_after);
  }
  LshProblem p;
  p.batch = g.batch, p.l = g.lq, p.d = g.d, p.dv = g.dv;
  p.heads = qk.dim() >= 3 ? qk.size(-3) : 1;
  p.lead = g.lead;
  p.out_shape = g.out_shape;
  p.out_dtype = qk.dtype();
  p.n_hashes = o.n_hashes, p.chunk = o.chunk_length;
  p.before = o.num_chunks_before, p.after = o.num_chunks_after;
  p.causal = o.is_causal;
  if (p.d < 1)
    fail<ShapeError>(op, ": qk's last dim D must be >= 1 (keys are scaled by 1/sqrt(D)) ", qk_v_shapes(qk, v));
  p.standard = p.l <= p.chunk;
  if (!p.standard && p.l % p.chunk != 0) {
    fail<ValueError>(op, ": the length L = ", p.l, " must be a multiple of chunk_length = ", p.chunk,
                     " (pad the sequence, as Reformer does) ", qk_v_shapes(qk, v));
  }
  // Each query chunk's keys: (before + 1 + after) chunks (repeats included, as Reformer's
  // _look_adjacent concatenates them), with D + Dv values per key in the kernel's buffers; a
  // count that overflows wrapped the kernel's sizes (a crash for num_chunks_before = 2^62).
  if (!p.standard) {
    const auto span =
        p.before < INT64_MAX - p.after - 1 ? std::optional<int64_t>(p.before + p.after + 1) : std::nullopt;
    const auto keys = span ? checked_mul(*span, p.chunk) : std::nullopt;
    if (!keys || !checked_mul(*keys, p.d + p.dv + 2)) {
      fail<ValueError>(op, ": num_chunks_before = ", p.before, " and num_chunks_after = ", p.after,
                       " give more keys per chunk of ", p.chunk, " than can be counted ", qk_v_shapes(qk, v));
    }
  }
  if (!checked_mul(p.n_hashes, p.l) || !checked_mul(p.n_hashes * p.l, p.batch)) {
    fail<ValueError>(op, ": n_hashes = ", p.n_hashes, " rounds of ", qk_v_shapes(qk, v), " overflow");
  }
  set_buckets(p, o.n_buckets, op);
  set_rotations(p, o, op, compute);
  set_mask(p, o.attention_mask, op);
  p.qk = qk.to(compute).contiguous().reshape({p.batch, p.l, p.d});
  p.v = v.to(compute).contiguous().reshape({p.batch, p.l, p.dv});
  return p;
}

}  // namespace qkv::attention

namespace qkv {

Tensor lsh_random_rotations(int64_t heads, int64_t d, int64_t n_hashes, int64_t half, uint64_t seed) {
  if (heads < 1 || d < 1 || n_hashes < 1 || half < 1) {
    fail<ValueError>("lsh_random_rotations: every size must be >= 1, got [", heads, ", ", d, ", ", n_hashes, ", ", half,
                     "]");
  }
  return Tensor::randn({heads, d, n_hashes, half}, seed, DType::f64);
}

Tensor lsh_buckets(const Tensor& qk, const LshAttentionOptions& options) {
  const DType compute = qk.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const attention::LshProblem p = attention::make_lsh_problem(qk, qk, options, "lsh_buckets", compute);
  Shape shape = p.lead;
  shape.insert(shape.end(), {p.n_hashes, p.l});
  return attention::lsh_buckets_cpu(p).reshape(shape);
}

Tensor lsh_attention(const Tensor& qk, const Tensor& v, const LshAttentionOptions& options) {
  const DType compute = qk.dtype() == DType::f64 ? DType::f64 : DType::f32;
  const attention::LshProblem p = attention::make_lsh_problem(qk, v, options, "lsh_attention", compute);
  return attention::lsh_attention_cpu(p).reshape(p.out_shape).to(p.out_dtype);
}

}  // namespace qkv
