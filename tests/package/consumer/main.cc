// A program using the public API only: SDPA and einsum on small random tensors,
// each checked against a float64 loop. Exit 0 and "consumer: ok" when both agree.
// Built against the installed package (ctest package.consumer) and, in the build
// tree, against qkv::ops alone (ctest layering.sdpa_runs: no HDF5, no zlib).
#include <cmath>
#include <cstdio>
#include <vector>

#include "qkv/attention.h"
#include "qkv/einsum.h"

namespace {

// softmax(q k^T / sqrt(D)) v for one head, in float64: out [L, D].
std::vector<double> sdpa_f64(const qkv::Tensor& q, const qkv::Tensor& k, const qkv::Tensor& v, int64_t L, int64_t D) {
  std::vector<double> out(static_cast<size_t>(L * D), 0.0);
  for (int64_t i = 0; i < L; ++i) {
    std::vector<double> s(static_cast<size_t>(L));
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < L; ++j) {
      double dot = 0.0;
      for (int64_t d = 0; d < D; ++d) dot += double(q.at<float>({0, i, d})) * double(k.at<float>({0, j, d}));
      s[size_t(j)] = dot / std::sqrt(double(D));
      mx = std::fmax(mx, s[size_t(j)]);
    }
    for (double& x : s) sum += (x = std::exp(x - mx));
    for (int64_t j = 0; j < L; ++j) {
      for (int64_t d = 0; d < D; ++d) out[size_t(i * D + d)] += s[size_t(j)] / sum * double(v.at<float>({0, j, d}));
    }
  }
  return out;
}

}  // namespace

int main() {
  const int64_t L = 5, D = 8;  // q, k, v [1, L, D]
  const qkv::Tensor q = qkv::Tensor::randn({1, L, D}, 1), k = qkv::Tensor::randn({1, L, D}, 2);
  const qkv::Tensor v = qkv::Tensor::randn({1, L, D}, 3);
  const qkv::Tensor out = qkv::scaled_dot_product_attention(q, k, v).output;  // [1, L, D]
  const std::vector<double> want = sdpa_f64(q, k, v, L, D);
  double sdpa_err = 0.0;
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t d = 0; d < D; ++d)
      sdpa_err = std::fmax(sdpa_err, std::fabs(out.at<float>({0, i, d}) - want[size_t(i * D + d)]));
  }
  const qkv::Tensor ab = qkv::einsum("ij,jk->ik", {q.reshape({L, D}), v.reshape({L, D}).transpose(0, 1)});  // [L, L]
  double einsum_err = 0.0;
  for (int64_t i = 0; i < L; ++i) {
    for (int64_t j = 0; j < L; ++j) {
      double dot = 0.0;
      for (int64_t d = 0; d < D; ++d) dot += double(q.at<float>({0, i, d})) * double(v.at<float>({0, j, d}));
      einsum_err = std::fmax(einsum_err, std::fabs(ab.at<float>({i, j}) - dot));
    }
  }
  std::printf("consumer: sdpa max error %.3g, einsum max error %.3g\n", sdpa_err, einsum_err);
  if (!(sdpa_err < 1e-5 && einsum_err < 1e-5)) return 1;
  std::printf("consumer: ok\n");
  return 0;
}
