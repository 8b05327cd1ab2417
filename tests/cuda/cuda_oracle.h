// Shared by the CUDA tests (tests/cuda/): a test configuration, the FlashAttention
// error criterion's yardstick (attention step by step in the inputs' precision) and
// the largest difference between two tensors.
#pragma once

#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "qkv/half.h"
#include "qkv/tensor.h"

namespace qkv::cuda_test {

struct Config {
  int64_t b = 1, hq = 1, hk = 1, lq = 1, lk = 1, d = 64;
  DType dtype = DType::bf16;
  bool causal = false;
  int mask = 0;  // 0 none, 1 bool, 2 float32
  std::string name() const {
    std::ostringstream out;  // (not operator+: gcc 12 warns -Wrestrict on such chains)
    out << "b" << b << " hq" << hq << " hk" << hk << " lq" << lq << " lk" << lk << " d" << d << " " << dtype_name(dtype)
        << (causal ? " causal" : "");
    if (mask != 0) out << " mask" << mask;
    return out.str();
  }
};

inline double round_to(DType t, double x) {
  const auto f = static_cast<float>(x);
  return t == DType::bf16 ? static_cast<float>(bfloat16(f)) : static_cast<float>(float16(f));
}

// Attention step by step in `t`'s precision (the criterion's yardstick), float64 math
// between the roundings. q [B, Hq, Lq, D], k/v [B, Hk, Lk, D] as float64 tensors.
inline Tensor lowp_attention(const Tensor& q, const Tensor& k, const Tensor& v, const std::optional<Tensor>& mask,
                             const Config& c) {
  Tensor out = Tensor::zeros({c.b, c.hq, c.lq, c.d}, DType::f64);
  const double scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  const double *Q = q.data<double>(), *K = k.data<double>(), *V = v.data<double>();
  double* O = out.data<double>();
  std::vector<double> s(static_cast<size_t>(c.lk));
  for (int64_t b = 0; b < c.b; ++b) {
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t hk = h / (c.hq / c.hk);
      for (int64_t i = 0; i < c.lq; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < c.lk; ++j) {
          double dot = 0;
          for (int64_t x = 0; x < c.d; ++x)
            dot += Q[((b * c.hq + h) * c.lq + i) * c.d + x] * K[((b * c.hk + hk) * c.lk + j) * c.d + x];
          double sc = round_to(c.dtype, round_to(c.dtype, dot) * scale);
          if (c.causal && j > i) sc = -INFINITY;
          if (mask) sc += mask->data<double>()[((b * c.hq + h) * c.lq + i) * c.lk + j];
          s[static_cast<size_t>(j)] = sc;
          mx = std::max(mx, sc);
        }
        double sum = 0;
        for (auto& x : s) sum += (x = mx == -INFINITY ? 0.0 : std::exp(x - mx));
        for (int64_t x = 0; x < c.d; ++x) {
          double acc = 0;
          for (int64_t j = 0; j < c.lk; ++j) {
            const double p = sum > 0 ? round_to(c.dtype, s[static_cast<size_t>(j)] / sum) : 0.0;
            acc += p * V[((b * c.hk + hk) * c.lk + j) * c.d + x];
          }
          O[((b * c.hq + h) * c.lq + i) * c.d + x] = round_to(c.dtype, acc);
        }
      }
    }
  }
  return out;
}

// A mask [B, Hq, Lq, Lk] with about a fifth of the keys hidden (float: -inf or a bias),
// never a whole row.
inline Tensor make_mask(const Config& c, uint64_t seed) {
  const Tensor u = Tensor::uniform({c.b, c.hq, c.lq, c.lk}, seed);
  Tensor m = Tensor::empty({c.b, c.hq, c.lq, c.lk}, c.mask == 1 ? DType::b8 : DType::f32);
  for (int64_t i = 0; i < u.numel(); ++i) {
    const float x = u.data<float>()[i];
    const bool keep = x > 0.2f || i % c.lk == 0;
    if (c.mask == 1) {
      m.data<bool>()[i] = keep;
    } else {
      m.data<float>()[i] = keep ? x - 0.5f : -INFINITY;
    }
  }
  return m;
}

}  // namespace qkv::cuda_test
