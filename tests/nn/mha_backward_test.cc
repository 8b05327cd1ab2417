// MultiheadAttention::backward against torch.nn.MultiheadAttention's float64 autograd
// (tests/fixtures/mha_grad, from tests/nn/make_torch_mha_grad_fixtures.py): self-attention
// batch-first, cross-attention with kdim/vdim (separate projection weights), key padding +
// float attn masks without bias, the is_causal hint, unbatched inputs, a 3-D bool mask, 44
// random configurations of those options (one key, one query, no batch dim among them), and 11
// with add_bias_kv and/or add_zero_attn (masks, kdim/vdim, batch_first, unbatched, the causal
// hint, a batch entry whose keys are all padded, one key).
// Criterion: every gradient within 1e-5 of its largest magnitude (float32 layer against
// float64 torch; issue 15's f32 criterion; measured worst 3.1e-7).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "common/sdpa_fixtures.h"
#include "qkv/io_tensor_files.h"
#include "qkv/nn/mha.h"

#include <nlohmann/json.hpp>

namespace qkv::nn {
namespace {

// max |got - want| over max(max |want|, floor): `floor` is 1e-2 of the largest gradient of the
// configuration, for gradients that are exactly 0 in torch (one key: the softmax is constant,
// so dq and dk vanish) and float32 rounding noise in qkv.
double relative_error(const Tensor& got, const Tensor& want, double floor) {
  EXPECT_EQ(got.shape(), want.shape());
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  double err = 0.0, scale = floor;
  for (size_t i = 0; i < w.size() && i < g.size(); ++i) {
    const double d = std::fabs(g[i] - w[i]);
    err = std::isnan(d) ? INFINITY : std::max(err, d);  // a NaN on either side fails
    scale = std::max(scale, std::fabs(w[i]));
  }
  return err / std::max(scale, 1e-30);
}

TEST(MultiheadAttentionBackward, MatchesTorchAutograd) {
  const auto files = sdpa_fixtures::fixture_files(sdpa_fixtures::fixture_dir("mha_grad"));
  ASSERT_EQ(files.size(), 61u);
  double worst = 0.0, worst_extra = 0.0;  // all; those with add_bias_kv / add_zero_attn
  for (const auto& path : files) {
    SCOPED_TRACE(path.stem().string());
    const io::SafetensorsFile f = io::load_safetensors(path);
    const nlohmann::json opts = nlohmann::json::parse(f.metadata.at("options"));
    const nlohmann::json& c = opts.at("ctor");
    MultiheadAttentionConfig cfg;
    cfg.embed_dim = c.at("embed_dim");
    cfg.num_heads = c.at("num_heads");
    cfg.bias = c.value("bias", true);
    cfg.batch_first = c.value("batch_first", false);
    cfg.add_bias_kv = c.value("add_bias_kv", false);
    cfg.add_zero_attn = c.value("add_zero_attn", false);
    if (c.contains("kdim")) cfg.kdim = c.at("kdim").get<int64_t>();
    if (c.contains("vdim")) cfg.vdim = c.at("vdim").get<int64_t>();
    std::map<std::string, Tensor> sd;
    for (const auto& [key, t] : f.tensors) {
      if (key.rfind("param/", 0) == 0) sd[key.substr(6)] = t;
    }
    const MultiheadAttention layer = MultiheadAttention::from_state_dict(cfg, sd);
    MultiheadAttentionOptions o;
    const nlohmann::json& fwd = opts.at("forward");
    o.is_causal = fwd.value("is_causal", false);
    o.need_weights = fwd.value("need_weights", true);
    if (auto it = f.tensors.find("key_padding_mask"); it != f.tensors.end()) o.key_padding_mask = it->second;
    if (auto it = f.tensors.find("attn_mask"); it != f.tensors.end()) o.attn_mask = it->second;
    const bool same = opts.at("same_input");
    const Tensor& q = f.tensors.at("query");
    const Tensor& k = same ? q : f.tensors.at("key");
    const Tensor& v = same ? q : f.tensors.at("value");
    const MultiheadAttentionGradients g = layer.backward(q, k, v, f.tensors.at("grad_out"), o);
    double floor = 0.0;  // 1e-2 of the configuration's largest gradient
    for (const auto& [key, t] : f.tensors) {
      if (key.rfind("d", 0) != 0) continue;
      for (double x : t.to_vector<double>()) floor = std::max(floor, 1e-2 * std::fabs(x));
    }
    auto check = [&](const Tensor& got, const Tensor& want, const std::string& what) {
      const double e = relative_error(got, want, floor);
      EXPECT_LE(e, 1e-5) << what;
      worst = std::max(worst, e);
      if (cfg.add_bias_kv || cfg.add_zero_attn) worst_extra = std::max(worst_extra, e);
    };
    if (same) {  // one tensor in three roles: torch's gradient is the sum
      const Tensor sum = Tensor::from_vector(
          [&] {
            auto a = g.query.to_vector<float>();
            const auto b = g.key.to_vector<float>(), cc = g.value.to_vector<float>();
            for (size_t i = 0; i < a.size(); ++i) a[i] += b[i] + cc[i];
            return a;
          }(),
          g.query.shape());
      check(sum, f.tensors.at("d_query"), "d_query");
    } else {
      check(g.query, f.tensors.at("d_query"), "d_query");
      check(g.key, f.tensors.at("d_key"), "d_key");
      check(g.value, f.tensors.at("d_value"), "d_value");
    }
    int params = 0;
    for (const auto& [key, t] : f.tensors) {
      if (key.rfind("dparam/", 0) != 0) continue;
      const std::string name = key.substr(7);
      ASSERT_TRUE(g.params.count(name)) << name;
      check(g.params.at(name), t, name);
      ++params;
    }
    EXPECT_EQ(params, static_cast<int>(g.params.size()));
  }
  std::printf(
      "MultiheadAttention.backward vs torch float64 autograd: worst %.2e of each gradient's scale (%.2e with "
      "add_bias_kv / add_zero_attn)\n",
      worst, worst_extra);
}

TEST(MultiheadAttentionBackward, BadShapesAndQuantizedLayersAreErrors) {
  MultiheadAttentionConfig c;
  c.embed_dim = 8, c.num_heads = 2, c.add_bias_kv = true, c.add_zero_attn = true;
  const Tensor x = Tensor::randn({3, 1, 8}, 1);
  const MultiheadAttention m(c);
  const MultiheadAttentionGradients g = m.backward(x, x, x, x);
  EXPECT_EQ(g.params.at("bias_k").shape(), (Shape{1, 1, 8}));
  EXPECT_EQ(g.params.at("bias_v").shape(), (Shape{1, 1, 8}));
  EXPECT_EQ(g.params.size(), 6u);  // + in_proj_weight, in_proj_bias, out_proj.weight, out_proj.bias
  EXPECT_THROW((void)m.backward(x, x, x, Tensor::randn({3, 1, 4}, 2)), ShapeError);
  EXPECT_THROW((void)m.quantize_dynamic().backward(x, x, x, x), ValueError);
}

}  // namespace
}  // namespace qkv::nn
