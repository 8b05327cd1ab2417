// The CUDA attention backward (scaled_dot_product_attention_backward on cuda:0, from the
// GPU forward's output and logsumexp) against qkv's CPU float64 reference
// (attention_backward_reference on the same bf16/f16-rounded inputs). ctest label cuda:
// runs only on a machine with a GPU (docs/cuda.md).
//
// The criterion is FlashAttention's (tests/test_flash_attn.py): each gradient's largest
// error against the float64 result may be at most twice that of the backward computed
// step by step in the inputs' precision (scores, weights, dP, dS and every product
// rounded to bf16/f16, as PyTorch's math backend does in that dtype), plus
// FlashAttention's absolute floor (rounding_floor, below).
#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/relative_error.h"
#include "cuda/cuda_oracle.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/cuda.h"
#include "qkv/tensor.h"

namespace qkv {
namespace {

using cuda_test::Config;
using cuda_test::make_mask;
using cuda_test::round_to;
using testing::max_abs_error;

class CudaAttentionBackward : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_FAIL() << "no GPU: run these tests only where one is (ctest -L cuda)";
  }
};

// float64 gradients [B, Hq, Lq, D], [B, Hk, Lk, D], [B, Hk, Lk, D].
struct Grads {
  Tensor dq, dk, dv;
};

// One (batch, q head) of the step-by-step backward: P as lowp_attention computes it,
// then dP, dS = P (dP - D) and scale dS, each rounded; dq rows rounded; the head's dk,
// dv sums added (rounded) to `dk`, `dv` of its k/v head.
struct LowpHead {
  const double *q, *k, *v, *dout, *mask;  // rows of this head; mask [Lq, Lk] additive or null
  double *dq, *dk, *dv;
};

void lowp_head(const LowpHead& h, const Config& c, double scale) {
  auto r = [&](double x) { return round_to(c.dtype, x); };
  const auto lk = static_cast<size_t>(c.lk), d = static_cast<size_t>(c.d);
  std::vector<double> p(lk), dp(lk), dk(lk * d, 0.0), dv(lk * d, 0.0), dq(d);
  for (int64_t i = 0; i < c.lq; ++i) {
    const double* qi = h.q + static_cast<size_t>(i) * d;
    const double* gi = h.dout + static_cast<size_t>(i) * d;
    double mx = -INFINITY;
    for (size_t j = 0; j < lk; ++j) {
      double dot = 0;
      for (size_t x = 0; x < d; ++x) dot += qi[x] * h.k[j * d + x];
      double s = r(r(dot) * scale);
      if (c.causal && static_cast<int64_t>(j) > i) s = -INFINITY;
      if (h.mask != nullptr) s += h.mask[static_cast<size_t>(i) * lk + j];
      p[j] = s;
      mx = std::max(mx, s);
    }
    double sum = 0;
    for (double& x : p) sum += (x = mx == -INFINITY ? 0.0 : std::exp(x - mx));
    double delta = 0;
    for (size_t j = 0; j < lk; ++j) {
      p[j] = sum > 0 ? r(p[j] / sum) : 0.0;
      double dot = 0;
      for (size_t x = 0; x < d; ++x) dot += gi[x] * h.v[j * d + x];
      dp[j] = r(dot);
      delta += p[j] * dp[j];
    }
    std::fill(dq.begin(), dq.end(), 0.0);
    for (size_t j = 0; j < lk; ++j) {
      const double ds = r(r(p[j] * (dp[j] - delta)) * scale);
      for (size_t x = 0; x < d; ++x) {
        dq[x] += ds * h.k[j * d + x];
        dk[j * d + x] += ds * qi[x];
        dv[j * d + x] += p[j] * gi[x];
      }
    }
    for (size_t x = 0; x < d; ++x) h.dq[static_cast<size_t>(i) * d + x] = r(dq[x]);
  }
  for (size_t e = 0; e < lk * d; ++e) {
    h.dk[e] += r(dk[e]);
    h.dv[e] += r(dv[e]);
  }
}

// The yardstick: the backward step by step in c.dtype's precision. Float64 q [B, Hq, Lq, D],
// k/v [B, Hk, Lk, D], dout [B, Hq, Lq, D], mask [B, Hq, Lq, Lk] additive (0 / -inf / bias).
Grads lowp_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                    const std::optional<Tensor>& mask, const Config& c, double scale) {
  Grads g{Tensor::zeros({c.b, c.hq, c.lq, c.d}, DType::f64), Tensor::zeros({c.b, c.hk, c.lk, c.d}, DType::f64),
          Tensor::zeros({c.b, c.hk, c.lk, c.d}, DType::f64)};
  for (int64_t b = 0; b < c.b; ++b) {
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t qh = (b * c.hq + h) * c.lq, kh = (b * c.hk + h / (c.hq / c.hk)) * c.lk;
      const LowpHead head{q.data<double>() + qh * c.d,
                          k.data<double>() + kh * c.d,
                          v.data<double>() + kh * c.d,
                          dout.data<double>() + qh * c.d,
                          mask ? mask->data<double>() + qh * c.lk : nullptr,
                          g.dq.data<double>() + qh * c.d,
                          g.dk.data<double>() + kh * c.d,
                          g.dv.data<double>() + kh * c.d};
      lowp_head(head, c, scale);
    }
  }
  for (Tensor* t : {&g.dk, &g.dv}) {  // a GQA group's heads summed, then rounded
    for (int64_t e = 0; e < t->numel(); ++e) t->data<double>()[e] = round_to(c.dtype, t->data<double>()[e]);
  }
  return g;
}

// FlashAttention's absolute floor (hopper/test_flash_attn.py: dq_atol = 2 * (dq_ref + 0.3 -
// 0.3 - dq_ref).abs().max()), but taken in `t` (FlashAttention's reference is float32):
// twice the rounding error of `t` at the reference's values moved by 0.3, about one ulp
// of `t` at the largest gradient. Needed where the exact dS is 0 (one visible key: P = 1,
// dP = D): the step-by-step yardstick is then exact, while the kernel's dP - D is float32
// noise (dP from the tensor cores, D from the preprocess, two summation orders).
double rounding_floor(const Tensor& want, DType t) {
  double e = 0;
  for (const double x : want.to_vector<double>()) e = std::max(e, std::fabs(round_to(t, x + 0.3) - 0.3 - x));
  return 2 * e;
}

void expect_close(const Tensor& got, const Tensor& want, const Tensor& lowp, DType t, const char* name) {
  const double err = max_abs_error(got, want), base = max_abs_error(lowp, want), floor = rounding_floor(want, t);
  EXPECT_LE(err, 2 * base + floor + 1e-6)
      << name << ": kernel error " << err << ", step-by-step error " << base << ", rounding floor " << floor;
}

// The forward on the GPU (its output and logsumexp), then the backward there; the
// gradients copied to the host.
AttentionGradients gpu_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                AttentionOptions o) {
  const Device gpu = Device::cuda();
  const Tensor gq = q.to(gpu), gk = k.to(gpu), gv = v.to(gpu);
  if (o.attn_mask) o.attn_mask = o.attn_mask->to(gpu);
  o.return_logsumexp = true;
  const AttentionResult fwd = scaled_dot_product_attention(gq, gk, gv, o);
  o.return_logsumexp = false;
  const AttentionGradients g =
      scaled_dot_product_attention_backward(gq, gk, gv, fwd.output, dout.to(gpu), *fwd.logsumexp, o);
  EXPECT_EQ(g.dq.device(), gpu);
  EXPECT_EQ(g.dk.dtype(), q.dtype());
  return {g.dq.to(Device::cpu()), g.dk.to(Device::cpu()), g.dv.to(Device::cpu())};
}

// make_mask's mask, with every fifth query row (from row 2) hidden whole when `empty_rows`.
Tensor backward_mask(const Config& c, uint64_t seed, bool empty_rows) {
  Tensor m = make_mask(c, seed);
  if (!empty_rows) return m;
  for (int64_t row = 0; row < c.b * c.hq * c.lq; ++row) {
    if (row % c.lq % 5 != 2) continue;
    for (int64_t j = 0; j < c.lk; ++j) {
      if (c.mask == 1) {
        m.data<bool>()[row * c.lk + j] = false;
      } else {
        m.data<float>()[row * c.lk + j] = -INFINITY;
      }
    }
  }
  return m;
}

// The mask as the yardstick adds it (float64; bool False -> -inf).
Tensor additive(const Tensor& m) {
  Tensor out = Tensor::empty(m.shape(), DType::f64);
  const Tensor m64 = m.to(DType::f64);
  for (int64_t i = 0; i < m.numel(); ++i) {
    const double x = m64.data<double>()[i];
    out.data<double>()[i] = m.dtype() == DType::b8 ? (x != 0 ? 0.0 : -INFINITY) : x;
  }
  return out;
}

// `scale`: the options' (unset: 1 / sqrt(D)).
void check_config(const Config& c, uint64_t seed, bool empty_rows = false, std::optional<double> scale = {}) {
  SCOPED_TRACE(c.name() + (empty_rows ? " empty rows" : "") + (scale ? " scale " + std::to_string(*scale) : ""));
  const Tensor q = Tensor::randn({c.b, c.hq, c.lq, c.d}, seed, c.dtype);
  const Tensor k = Tensor::randn({c.b, c.hk, c.lk, c.d}, seed + 1, c.dtype);
  const Tensor v = Tensor::randn({c.b, c.hk, c.lk, c.d}, seed + 2, c.dtype);
  const Tensor dout = Tensor::randn({c.b, c.hq, c.lq, c.d}, seed + 3, c.dtype);
  AttentionOptions o;
  o.is_causal = c.causal;
  o.enable_gqa = c.hq != c.hk;
  o.scale = scale;
  std::optional<Tensor> mask64;
  AttentionOptions o64 = o;
  if (c.mask != 0) {
    const Tensor m = backward_mask(c, seed + 4, empty_rows);
    o.attn_mask = m;
    o64.attn_mask = m.dtype() == DType::b8 ? m : m.to(DType::f64);
    mask64 = additive(m);
  }
  const AttentionGradients got = gpu_backward(q, k, v, dout, o);
  const Tensor q64 = q.to(DType::f64), k64 = k.to(DType::f64), v64 = v.to(DType::f64), g64 = dout.to(DType::f64);
  const AttentionGradients want = attention_backward_reference(q64, k64, v64, g64, o64);
  const Grads lowp = lowp_backward(q64, k64, v64, g64, mask64, c, scale.value_or(1.0 / std::sqrt(double(c.d))));
  expect_close(got.dq, want.dq, lowp.dq, c.dtype, "dq");
  expect_close(got.dk, want.dk, lowp.dk, c.dtype, "dk");
  expect_close(got.dv, want.dv, lowp.dv, c.dtype, "dv");
}

TEST_F(CudaAttentionBackward, SmallEdgeShapes) {
  const Config configs[] = {
      {1, 1, 1, 1, 1, 64},                         // Lq = Lk = 1
      {1, 1, 1, 1, 1, 128, DType::f16},            //
      {1, 2, 2, 1, 150, 64},                       // Lq = 1
      {1, 2, 2, 150, 1, 128},                      // Lk = 1
      {1, 2, 2, 127, 129, 64},                     // tiles that end mid-way
      {2, 3, 3, 128, 64, 128},                     // whole tiles
      {1, 1, 1, 200, 33, 128, DType::f16},         //
      {1, 4, 2, 130, 130, 128},                    // GQA 2
      {1, 4, 1, 100, 257, 64, DType::f16},         // GQA 4
      {1, 1, 1, 300, 300, 128, DType::f16, true},  // causal
      {1, 2, 2, 129, 257, 64, DType::bf16, true},  // causal, Lq < Lk
      {1, 2, 2, 257, 70, 128, DType::bf16, true},  // causal, Lq > Lk
      {1, 4, 2, 190, 190, 64, DType::bf16, true},  // causal GQA
  };
  uint64_t seed = 10;
  for (const Config& c : configs) check_config(c, seed += 10);
}

TEST_F(CudaAttentionBackward, Masks) {
  check_config({1, 2, 2, 150, 190, 128, DType::bf16, false, 1}, 81);
  check_config({2, 1, 1, 70, 260, 64, DType::f16, false, 2}, 82);
  check_config({1, 4, 2, 100, 80, 64, DType::bf16, false, 2}, 83);  // with GQA
}

// Rows that see no key (lse -inf) get zero gradient and add nothing to dk, dv.
TEST_F(CudaAttentionBackward, FullyMaskedRows) {
  check_config({1, 2, 2, 90, 70, 64, DType::bf16, false, 1}, 91, true);
  check_config({1, 2, 1, 66, 130, 128, DType::f16, false, 2}, 92, true);
}

TEST_F(CudaAttentionBackward, RandomConfigs) {
  std::mt19937_64 rng(2027);
  auto pick = [&](int64_t lo, int64_t hi) { return std::uniform_int_distribution<int64_t>(lo, hi)(rng); };
  for (int t = 0; t < 14; ++t) {
    Config c;
    c.b = pick(1, 2);
    c.hk = pick(1, 2);
    c.hq = c.hk * (pick(0, 2) == 0 ? 4 : pick(1, 2));
    c.lq = pick(1, 200);
    c.lk = pick(1, 200);
    c.d = pick(0, 1) ? 64 : 128;
    c.dtype = pick(0, 1) ? DType::bf16 : DType::f16;
    c.causal = pick(0, 2) == 0;
    c.mask = c.causal ? 0 : static_cast<int>(pick(0, 2));
    check_config(c, 2000 + static_cast<uint64_t>(t) * 7);
  }
}

TEST_F(CudaAttentionBackward, Scale) {
  check_config({1, 2, 2, 70, 90, 64, DType::bf16}, 101, false, 0.3);
  check_config({1, 2, 1, 90, 70, 128, DType::f16, true}, 102, false, 0.05);
}

// k and v shared by the batch (leading dim 1, broadcast: dk, dv are sums over it) and q a
// transposed view on the GPU ([B, Lq, Hq, D] in memory, read in place through its strides).
TEST_F(CudaAttentionBackward, BroadcastAndStridedOperands) {
  const Config c{2, 2, 2, 100, 90, 64};
  const Device gpu = Device::cuda();
  const Tensor q = Tensor::randn({c.b, c.lq, c.hq, c.d}, 111, c.dtype).to(gpu).transpose(1, 2);  // [B, Hq, Lq, D]
  const Tensor k = Tensor::randn({1, c.hk, c.lk, c.d}, 112, c.dtype).to(gpu);
  const Tensor v = Tensor::randn({1, c.hk, c.lk, c.d}, 113, c.dtype).to(gpu);
  const Tensor dout = Tensor::randn({c.b, c.hq, c.lq, c.d}, 114, c.dtype).to(gpu);
  AttentionOptions o;
  o.return_logsumexp = true;
  const AttentionResult fwd = scaled_dot_product_attention(q, k, v, o);
  o.return_logsumexp = false;
  const AttentionGradients got = scaled_dot_product_attention_backward(q, k, v, fwd.output, dout, *fwd.logsumexp, o);
  ASSERT_EQ(got.dk.shape(), k.shape());
  const Tensor q64 = q.to(Device::cpu()).to(DType::f64).contiguous(), g64 = dout.to(Device::cpu()).to(DType::f64);
  const Tensor k64 = k.to(Device::cpu()).to(DType::f64), v64 = v.to(Device::cpu()).to(DType::f64);
  const AttentionGradients want = attention_backward_reference(q64, k64, v64, g64, o);
  // The yardstick on the batch-expanded k, v; its dk, dv summed over the batch, rounded.
  const Shape full{c.b, c.hk, c.lk, c.d};
  const Grads lowp = lowp_backward(q64, k64.expand(full).contiguous(), v64.expand(full).contiguous(), g64, {}, c,
                                   1.0 / std::sqrt(double(c.d)));
  Tensor dk = Tensor::zeros(k.shape(), DType::f64), dv = Tensor::zeros(k.shape(), DType::f64);
  const int64_t n = dk.numel();
  for (int64_t e = 0; e < n; ++e) {
    for (int64_t b = 0; b < c.b; ++b) {
      dk.data<double>()[e] += lowp.dk.data<double>()[b * n + e];
      dv.data<double>()[e] += lowp.dv.data<double>()[b * n + e];
    }
    dk.data<double>()[e] = round_to(c.dtype, dk.data<double>()[e]);
    dv.data<double>()[e] = round_to(c.dtype, dv.data<double>()[e]);
  }
  expect_close(got.dq.to(Device::cpu()), want.dq, lowp.dq, c.dtype, "dq");
  expect_close(got.dk.to(Device::cpu()), want.dk, dk, c.dtype, "dk");
  expect_close(got.dv.to(Device::cpu()), want.dv, dv, c.dtype, "dv");
}

// `call` throws E whose message names the backward and contains `what`.
template <class E, class Fn>
void expect_error(Fn&& call, const std::string& what) {
  try {
    call();
    ADD_FAILURE() << "no error; expected one containing: " << what;
  } catch (const E& e) {
    const std::string text = e.what();
    EXPECT_NE(text.find("scaled_dot_product_attention_backward"), std::string::npos) << text;
    EXPECT_NE(text.find(what), std::string::npos) << text;
  }
}

// Empty problems: no query rows (dq empty, dk = dv = 0), no keys (dq = 0, dk, dv
// empty), no batch entries; the gradients keep the operands' shapes.
TEST_F(CudaAttentionBackward, EmptyLengthsGiveEmptyOrZeroGradients) {
  const Device gpu = Device::cuda();
  struct Lengths {
    int64_t b, lq, lk;
  };
  for (const Lengths n : {Lengths{1, 0, 5}, Lengths{1, 5, 0}, Lengths{0, 5, 5}}) {
    SCOPED_TRACE("b " + std::to_string(n.b) + " lq " + std::to_string(n.lq) + " lk " + std::to_string(n.lk));
    const Tensor q = Tensor::randn({n.b, 2, n.lq, 64}, 5, DType::bf16).to(gpu);  // [B, H, Lq, D]
    const Tensor k = Tensor::randn({n.b, 2, n.lk, 64}, 6, DType::bf16).to(gpu);  // [B, H, Lk, D]
    AttentionOptions o;
    o.return_logsumexp = true;
    const AttentionResult f = scaled_dot_product_attention(q, k, k, o);
    const AttentionGradients g = scaled_dot_product_attention_backward(q, k, k, f.output, f.output, *f.logsumexp, o);
    ASSERT_EQ(g.dq.shape(), q.shape());
    ASSERT_EQ(g.dk.shape(), k.shape());
    ASSERT_EQ(g.dv.shape(), k.shape());
    for (const Tensor* t : {&g.dq, &g.dk, &g.dv}) {
      const Tensor host = t->to(Device::cpu()).to(DType::f64);
      for (const double x : host.to_vector<double>()) EXPECT_EQ(x, 0.0);
    }
  }
}

// GQA with no q heads (torch: each of the Hk k/v heads repeated 0 times): an empty output
// and dk, dv zeros of k's and v's shapes, as on the CPU (AttentionFuzzRegression.GqaWithZeroQueryHeads).
TEST_F(CudaAttentionBackward, GqaWithNoQueryHeadsGivesZeroKeyAndValueGradients) {
  const Device gpu = Device::cuda();
  const Tensor q = Tensor::randn({2, 0, 3, 64}, 5, DType::f16).to(gpu);  // [B, Hq = 0, Lq, D]
  const Tensor k = Tensor::randn({2, 2, 5, 64}, 6, DType::f16).to(gpu);  // [B, Hk, Lk, D]
  AttentionOptions o;
  o.enable_gqa = true;
  o.return_logsumexp = true;
  const AttentionResult f = scaled_dot_product_attention(q, k, k, o);
  ASSERT_EQ(f.output.shape(), (Shape{2, 0, 3, 64}));
  const AttentionGradients g = scaled_dot_product_attention_backward(q, k, k, f.output, f.output, *f.logsumexp, o);
  ASSERT_EQ(g.dq.shape(), q.shape());
  ASSERT_EQ(g.dk.shape(), k.shape());
  ASSERT_EQ(g.dv.shape(), k.shape());
  for (const Tensor* t : {&g.dk, &g.dv}) {
    const Tensor host = t->to(Device::cpu()).to(DType::f64);
    for (const double x : host.to_vector<double>()) EXPECT_EQ(x, 0.0);
  }
}

TEST_F(CudaAttentionBackward, UnsupportedOptionsAreClearErrors) {
  const Device gpu = Device::cuda();
  const Tensor q = Tensor::randn({1, 2, 8, 64}, 1, DType::bf16).to(gpu);  // [B, H, L, D]
  const Tensor lse = Tensor::zeros({1, 2, 8}).to(gpu);                    // [B, H, L] float32
  auto backward = [&](const Tensor& x, const Tensor& out, const Tensor& l, const AttentionOptions& o) {
    return [&x, &out, &l, o] { (void)scaled_dot_product_attention_backward(x, x, x, out, x, l, o); };
  };
  AttentionOptions dropout;
  dropout.dropout_p = 0.1;
  expect_error<ValueError>(backward(q, q, lse, dropout), "dropout_p");
  AttentionOptions softcap;
  softcap.mods.softcap = 30.0;
  expect_error<ValueError>(backward(q, q, lse, softcap), "mods");
  const Tensor f32 = Tensor::randn({1, 2, 8, 64}, 2).to(gpu);
  expect_error<DTypeError>(backward(f32, f32, lse, {}), "bfloat16 or float16");
  const Tensor d32 = Tensor::randn({1, 2, 8, 32}, 3, DType::bf16).to(gpu);
  expect_error<ValueError>(backward(d32, d32, lse, {}), "head dims");
  const Tensor f16 = Tensor::randn({1, 2, 8, 64}, 4, DType::f16).to(gpu);
  expect_error<DTypeError>(backward(q, f16, lse, {}), "out in q's dtype");
  const Tensor lse_bf16 = Tensor::zeros({1, 2, 8}, DType::bf16).to(gpu);
  expect_error<DTypeError>(backward(q, q, lse_bf16, {}), "float32 logsumexp");
  const Tensor host_out = q.to(Device::cpu());
  expect_error<DeviceError>(backward(q, host_out, lse, {}), "cuda:0");
}

}  // namespace
}  // namespace qkv
