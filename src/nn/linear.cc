// qkv::nn::Linear: y = x @ W + b through one qkv::gemm call (bias pre-filled, beta = 1).
#include "qkv/nn/linear.h"

#include <vector>

#include "qkv/gemm.h"

namespace qkv::nn {

namespace {

// f32 with the last dim contiguous and rows at a uniform distance (a GEMM operand).
Tensor as_gemm_matrix(const Tensor& t) {
  Tensor f = t.dtype() == DType::f32 ? t : t.to(DType::f32);
  const bool ok = f.dim() == 2 && (f.size(1) <= 1 || f.stride(1) == 1) && (f.size(0) <= 1 || f.stride(0) >= f.size(1));
  return ok ? f : f.contiguous();
}

int64_t product(const Shape& s, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= s[i];
  return n;
}

}  // namespace

Tensor parameter(const Tensor& t, const Shape& shape, const char* what) {
  if (t.shape() != shape) {
    fail<ShapeError>(what, ": expected shape ", shape_str(shape), ", got ", shape_str(t.shape()));
  }
  if (t.dtype() != DType::f32 && t.dtype() != DType::f64 && t.dtype() != DType::f16 && t.dtype() != DType::bf16) {
    fail<DTypeError>(what, ": expected a floating-point tensor");
  }
  return t.dtype() == DType::f32 ? t : t.to(DType::f32);
}

Linear Linear::torch(const Tensor& weight, const std::optional<Tensor>& bias) {
  if (weight.dim() != 2) fail<ShapeError>("Linear: weight must be [out, in], got ", shape_str(weight.shape()));
  Linear l;
  l.out_ = weight.size(0);
  l.in_ = weight.size(1);
  l.weight_ = as_gemm_matrix(parameter(weight, weight.shape(), "Linear: weight"));
  l.transposed_ = true;
  if (bias) l.bias_ = parameter(*bias, {l.out_}, "Linear: bias").contiguous();
  return l;
}

Linear Linear::keras(const Tensor& kernel, const std::optional<Tensor>& bias, int in_dims) {
  if (in_dims < 1 || kernel.dim() <= in_dims) {
    fail<ShapeError>("EinsumDense: kernel ", shape_str(kernel.shape()), " needs more than ", in_dims, " dims");
  }
  const size_t split = static_cast<size_t>(in_dims);
  Linear l;
  l.in_ = product(kernel.shape(), 0, split);
  l.out_ = product(kernel.shape(), split, kernel.shape().size());
  const Tensor k = parameter(kernel, kernel.shape(), "EinsumDense: kernel");
  l.weight_ = as_gemm_matrix(k.reshape({l.in_, l.out_}));
  l.transposed_ = false;
  if (bias) {
    const Shape out_shape(kernel.shape().begin() + in_dims, kernel.shape().end());
    l.bias_ = parameter(*bias, out_shape, "EinsumDense: bias").reshape({l.out_}).contiguous();
  }
  return l;
}

Tensor Linear::forward(const Tensor& x) const {
  require_cpu("Linear", {&x, &weight_});
  if (x.dim() < 1 || x.size(-1) != in_) {
    fail<ShapeError>("Linear: input ", shape_str(x.shape()), " does not end in in_features ", in_);
  }
  if (quant_) return forward_int8(x);
  Shape out_shape = x.shape();
  out_shape.back() = out_;
  const int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  Tensor y = Tensor::empty(out_shape);  // [..., out]
  if (rows == 0 || out_ == 0) return y;
  const Tensor a = as_gemm_matrix(x.reshape({rows, in_}));  // [rows, in]
  float* c = y.data<float>();
  const int64_t m = a.size(0);
  if (bias_) y.copy_from(*bias_);  // every row starts as the bias (broadcast rows, beta = 1 below)
  GemmShape g;
  g.trans_b = transposed_;
  g.m = m;
  g.n = out_;
  g.k = in_;
  g.lda = a.size(0) <= 1 ? in_ : a.stride(0);
  g.ldb = weight_.size(0) <= 1 ? weight_.size(1) : weight_.stride(0);
  g.ldc = out_;
  gemm(g, 1.0f, a.data<float>(), weight_.data<float>(), bias_ ? 1.0f : 0.0f, c);
  return y;
}

LinearGradients Linear::backward(const Tensor& x, const Tensor& dy) const {
  require_cpu("Linear.backward", {&x, &dy, &weight_});
  if (quant_) fail<ValueError>("Linear.backward: the layer is quantized (int8); backward needs the float32 layer");
  Shape out_shape = x.shape();
  if (x.dim() < 1 || x.size(-1) != in_) {
    fail<ShapeError>("Linear.backward: input ", shape_str(x.shape()), " does not end in in_features ", in_);
  }
  out_shape.back() = out_;
  if (dy.shape() != out_shape) {
    fail<ShapeError>("Linear.backward: dy must have shape ", shape_str(out_shape), ", got ", shape_str(dy.shape()));
  }
  const int64_t rows = shape_numel(Shape(x.shape().begin(), x.shape().end() - 1));
  LinearGradients g;
  g.dx = Tensor::zeros(x.shape());                                               // [..., in]
  g.dweight = Tensor::zeros(transposed_ ? Shape{out_, in_} : Shape{in_, out_});  // as weight_
  if (bias_) g.dbias = Tensor::zeros({out_});
  if (rows == 0 || in_ == 0 || out_ == 0) return g;
  const Tensor a = as_gemm_matrix(x.reshape({rows, in_}));    // [rows, in]
  const Tensor d = as_gemm_matrix(dy.reshape({rows, out_}));  // [rows, out]
  const int64_t lda = a.size(0) <= 1 ? in_ : a.stride(0), ldd = d.size(0) <= 1 ? out_ : d.stride(0);
  const int64_t ldw = weight_.size(0) <= 1 ? weight_.size(1) : weight_.stride(0);
  // dx [rows, in] = dy [rows, out] W^T: W stored [out, in] (torch) or [in, out] (keras).
  gemm({false, !transposed_, rows, in_, out_, ldd, ldw, in_}, 1.0f, d.data<float>(), weight_.data<float>(), 0.0f,
       g.dx.data<float>());
  // dW: torch [out, in] = dy^T x; keras [in, out] = x^T dy.
  if (transposed_) {
    gemm({true, false, out_, in_, rows, ldd, lda, in_}, 1.0f, d.data<float>(), a.data<float>(), 0.0f,
         g.dweight.data<float>());
  } else {
    gemm({true, false, in_, out_, rows, lda, ldd, out_}, 1.0f, a.data<float>(), d.data<float>(), 0.0f,
         g.dweight.data<float>());
  }
  if (g.dbias) {  // db = sum over rows of dy, in double (one rounding per element)
    std::vector<double> sum(static_cast<size_t>(out_), 0.0);
    const float* dp = d.data<float>();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t n = 0; n < out_; ++n) sum[static_cast<size_t>(n)] += dp[r * ldd + n];
    }
    float* db = g.dbias->data<float>();
    for (int64_t n = 0; n < out_; ++n) db[n] = static_cast<float>(sum[static_cast<size_t>(n)]);
  }
  return g;
}

Tensor Linear::to_torch_layout() const {
  return transposed_ ? weight_.contiguous() : weight_.transpose(0, 1).contiguous();
}

Tensor Linear::to_keras_layout() const {
  return transposed_ ? weight_.transpose(0, 1).contiguous() : weight_.contiguous();
}

}  // namespace qkv::nn
