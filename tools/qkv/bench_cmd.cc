// qkv bench attention: times the fused attention (scaled_dot_product_attention
// forward, f32 or --dtype) and qkv::gemm in the same dtype on this machine;
// bench/peers/attention_peers.py runs it beside PyTorch and ONNX Runtime,
// bench/peers/precision_peers.py per dtype beside PyTorch's.
//
//   qkv bench attention --shape 4,8,1024,64 [--causal] [--dtype bfloat16] [--backward] [--threads 2]
//                       [--min-time 1] [--min-runs 1] [--gemm 2048] [--json] [--matmul-precision medium]
//                       [--qk-quantization int8]
//
// --shape B,H,L,D, or B,H,Lq,Lk,D for queries and keys of different lengths (a prefill
// chunk over a long cache: 1,8,128,32768,128). GFLOP/s count 4*B*H*Lq*Lk*D (non-causal)
// or 4*B*H*D*L(L+1)/2 (causal: the unmasked half only; qkv/attention_flops.h where Lq !=
// Lk). Time per call is the fastest of the timed calls. A progress line goes out before
// each measurement: to stdout on a terminal, to stderr when stdout is a pipe or file
// (which then holds only the results). First of all goes the machine, "Machine: <qkv
// info's line>": on stdout, or on stderr with --json.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <vector>

#include "commands.h"
#include "qkv/attention.h"
#include "qkv/attention_backward.h"
#include "qkv/attention_flops.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "timing.h"

namespace qkv::cli {

namespace {

struct BenchArgs {
  std::vector<std::string> shapes;    // "B,H,L,D" or "B,H,Lq,Lk,D"
  std::string dtype = "float32";      // of q, k, v and the gemm's operands
  std::string precision = "highest";  // AttentionOptions::matmul_precision
  std::string qk = "none";            // AttentionOptions::qk_quantization (float32 inputs)
  bool causal = false, json = false, backward = false;
  int threads = 0;
  double min_time = 1.0;
  int min_runs = 1;  // timed calls at least (best of them), whatever min_time
  int64_t gemm_n = 0;
};

// "B,H,L,D" -> {B, H, L, L, D} and "B,H,Lq,Lk,D" -> {B, H, Lq, Lk, D}, each a positive
// integer (a usage error otherwise).
std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> dims;
  std::stringstream in(text);
  bool ok = !text.empty() && text.back() != ',';
  for (std::string part; ok && std::getline(in, part, ',');) {
    const std::optional<int64_t> d = to_integer(part, 1);
    ok = d.has_value();
    dims.push_back(d.value_or(0));
  }
  if (!ok || (dims.size() != 4 && dims.size() != 5)) {
    throw CLI::ValidationError("expected B,H,L,D or B,H,Lq,Lk,D (integers >= 1), got '" + text + "'");
  }
  if (dims.size() == 4) dims.insert(dims.begin() + 2, dims[2]);  // Lk = Lq
  return dims;
}

// " bfloat16" for a dtype other than float32, else "" (float32 lines as they were).
// (and " matmul_precision=medium" for a precision other than highest, " qk_quantization=int8"
// for int8 Q K^T).
std::string dtype_note(const BenchArgs& a) {
  return (a.dtype == "float32" ? "" : " " + a.dtype) +
         (a.precision == "highest" ? "" : " matmul_precision=" + a.precision) +
         (a.qk == "none" ? "" : " qk_quantization=" + a.qk);
}

// "[2/3] attention 1,8,1024,64 ...": before each measurement, which can take seconds.
void progress(size_t index, size_t count, const std::string& what) {
  static FILE* const out = isatty(fileno(stdout)) ? stdout : stderr;
  std::fprintf(out, "qkv bench: [%zu/%zu] %s ...\n", index, count, what.c_str());
  std::fflush(out);
}

// An [n, n] x [n, n] product of AB operands into C (float for 16-bit operands).
template <class AB, class C>
double bench_gemm_of(int64_t n, double min_time) {
  std::vector<AB> a(static_cast<size_t>(n * n), AB(0.5f)), b(a);  // [n, n] each
  std::vector<C> c(a.size());
  GemmShape s;
  s.m = s.n = s.k = s.lda = s.ldb = s.ldc = n;
  const double sec = best_seconds(min_time, 1, [&] { gemm(s, C(1), a.data(), b.data(), C(0), c.data()); });
  return 2.0 * static_cast<double>(n * n * n) / sec * 1e-9;
}

// The int8 x int8 -> int32 gemm (qk_quantization's Q K^T), in GOP/s.
double bench_gemm_int8(int64_t n, double min_time) {
  std::vector<int8_t> a(static_cast<size_t>(n * n), int8_t{3}), b(a);  // [n, n] each
  std::vector<int32_t> c(a.size());
  GemmShape s;
  s.m = s.n = s.k = s.lda = s.ldb = s.ldc = n;
  const double sec = best_seconds(min_time, 1, [&] { gemm(s, a.data(), b.data(), c.data()); });
  return 2.0 * static_cast<double>(n * n * n) / sec * 1e-9;
}

double bench_gemm(DType dt, int64_t n, double min_time) {
  switch (dt) {
    case DType::f64: return bench_gemm_of<double, double>(n, min_time);
    case DType::bf16: return bench_gemm_of<bfloat16, float>(n, min_time);
    case DType::f16: return bench_gemm_of<float16, float>(n, min_time);
    default: return bench_gemm_of<float, float>(n, min_time);
  }
}

// The shape as given: "B, H, L, D" where Lq = Lk, else "B, H, Lq, Lk, D" (sep between).
std::string dims_text(const std::vector<int64_t>& d, const char* sep) {
  std::string s;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i == 3 && d[2] == d[3]) continue;
    s += (s.empty() ? "" : sep) + std::to_string(d[i]);
  }
  return s;
}

// "(B,H,L,D)" or "(B,H,Lq,Lk,D)".
const char* shape_names(const std::vector<int64_t>& d) { return d[2] == d[3] ? "(B,H,L,D)" : "(B,H,Lq,Lk,D)"; }

// --backward: the backward from the forward's saved output and logsumexp, and forward
// plus backward together; GFLOP/s of the backward count its five products (2.5x the
// forward's two).
void bench_backward(const BenchArgs& a, const std::vector<int64_t>& d, const Tensor& q, const Tensor& k,
                    const Tensor& v, double gemm_gflops) {
  AttentionOptions o;
  o.is_causal = a.causal;
  o.matmul_precision = matmul_precision_from_name(a.precision);
  o.qk_quantization = qk_quantization_from_name(a.qk);
  o.return_logsumexp = true;
  const Tensor g = Tensor::randn(q.shape(), 4).to(q.dtype());  // dO [B, H, Lq, D]
  const AttentionResult fwd = scaled_dot_product_attention(q, k, v, o);
  const double sec = best_seconds(a.min_time, a.min_runs, [&] {
    (void)scaled_dot_product_attention_backward(q, k, v, fwd.output, g, *fwd.logsumexp, o);
  });
  const double both = best_seconds(a.min_time, a.min_runs, [&] {
    const AttentionResult f = scaled_dot_product_attention(q, k, v, o);
    (void)scaled_dot_product_attention_backward(q, k, v, f.output, g, *f.logsumexp, o);
  });
  const double gflops = 2.5 * attention_flops(d[0], d[1], d[2], d[3], d[4], a.causal) / sec * 1e-9;
  if (a.json) {
    std::printf(
        "{\"op\": \"attention_backward\", \"dtype\": \"%s\", \"shape\": [%s], \"causal\": %s, "
        "\"threads\": %d, \"ms\": %.4f, \"fwd_bwd_ms\": %.4f, \"gflops\": %.2f}\n",
        a.dtype.c_str(), dims_text(d, ", ").c_str(), a.causal ? "true" : "false", get_num_threads(), sec * 1e3,
        both * 1e3, gflops);
    return;
  }
  std::printf("attention backward %s=(%s)%s %s, %d thread(s): %.3f ms, %.1f GFLOP/s; forward + backward %.3f ms",
              shape_names(d), dims_text(d, ",").c_str(), dtype_note(a).c_str(), a.causal ? "causal" : "non-causal",
              get_num_threads(), sec * 1e3, gflops, both * 1e3);
  if (gemm_gflops > 0)
    std::printf(" (backward at %.0f%% of gemm's %.1f GFLOP/s)", 100.0 * gflops / gemm_gflops, gemm_gflops);
  std::printf("\n");
}

void bench_one(const BenchArgs& a, const std::string& shape_text, double gemm_gflops) {
  const std::vector<int64_t> d = parse_shape(shape_text);
  const DType dt = dtype_from_name(a.dtype);
  const Tensor q = Tensor::randn({d[0], d[1], d[2], d[4]}, 1).to(dt);  // [B, H, Lq, D]
  const Tensor k = Tensor::randn({d[0], d[1], d[3], d[4]}, 2).to(dt),
               v = Tensor::randn({d[0], d[1], d[3], d[4]}, 3).to(dt);
  if (a.backward) return bench_backward(a, d, q, k, v, gemm_gflops);
  AttentionOptions o;
  o.is_causal = a.causal;
  o.matmul_precision = matmul_precision_from_name(a.precision);
  o.qk_quantization = qk_quantization_from_name(a.qk);
  const double sec = best_seconds(a.min_time, a.min_runs, [&] { (void)scaled_dot_product_attention(q, k, v, o); });
  const double gflops = attention_flops(d[0], d[1], d[2], d[3], d[4], a.causal) / sec * 1e-9;
  if (a.json) {
    std::printf(
        "{\"op\": \"attention\", \"shape\": [%s], \"causal\": %s, \"threads\": %d, "
        "\"ms\": %.4f, \"gflops\": %.2f, \"dtype\": \"%s\", \"matmul_precision\": \"%s\", "
        "\"qk_quantization\": \"%s\"}\n",
        dims_text(d, ", ").c_str(), a.causal ? "true" : "false", get_num_threads(), sec * 1e3, gflops, a.dtype.c_str(),
        a.precision.c_str(), a.qk.c_str());
    return;
  }
  std::printf("attention %s=(%s)%s %s, %d thread(s): %.3f ms, %.1f GFLOP/s", shape_names(d), dims_text(d, ",").c_str(),
              dtype_note(a).c_str(), a.causal ? "causal" : "non-causal", get_num_threads(), sec * 1e3, gflops);
  if (gemm_gflops > 0) std::printf(" (%.0f%% of gemm's %.1f GFLOP/s)", 100.0 * gflops / gemm_gflops, gemm_gflops);
  std::printf("\n");
}

void run_bench_attention(const BenchArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  print_machine_line(a.json);
  double gemm_gflops = 0.0;
  const size_t count = a.shapes.size() + (a.gemm_n > 0 ? 1 : 0);
  if (a.gemm_n > 0) {
    progress(1, count, "gemm " + a.dtype + " " + std::to_string(a.gemm_n) + "^3");
    gemm_gflops = bench_gemm(dtype_from_name(a.dtype), a.gemm_n, a.min_time);
    if (a.json) {
      std::printf("{\"op\": \"gemm\", \"n\": %ld, \"threads\": %d, \"gflops\": %.2f, \"dtype\": \"%s\"}\n",
                  static_cast<long>(a.gemm_n), get_num_threads(), gemm_gflops, a.dtype.c_str());
    } else {
      std::printf("gemm %s %ld^3, %d thread(s): %.1f GFLOP/s\n", a.dtype.c_str(), static_cast<long>(a.gemm_n),
                  get_num_threads(), gemm_gflops);
    }
    if (a.qk != "none") {  // the yardstick of the int8 Q K^T: the int8 gemm as well
      const double gops = bench_gemm_int8(a.gemm_n, a.min_time);
      if (a.json) {
        std::printf("{\"op\": \"gemm\", \"n\": %ld, \"threads\": %d, \"gflops\": %.2f, \"dtype\": \"int8\"}\n",
                    static_cast<long>(a.gemm_n), get_num_threads(), gops);
      } else {
        std::printf("gemm int8 %ld^3, %d thread(s): %.1f GOP/s\n", static_cast<long>(a.gemm_n), get_num_threads(),
                    gops);
      }
    }
  }
  for (size_t i = 0; i < a.shapes.size(); ++i) {
    progress(count - a.shapes.size() + i + 1, count,
             "attention" + dtype_note(a) + " " + (a.causal ? "causal " : "") + a.shapes[i]);
    bench_one(a, a.shapes[i], gemm_gflops);
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Time qkv kernels on this machine");
  bench->require_subcommand(1);
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = bench->add_subcommand("attention", "Fused attention forward (and qkv::gemm) GFLOP/s");
  cmd->add_option("--shape", args->shapes, "B,H,L,D or B,H,Lq,Lk,D (repeatable; default 1,8,1024,64)")
      ->each([](const std::string& text) { (void)parse_shape(text); });
  cmd->add_flag("--causal", args->causal, "causal attention (GFLOP/s count the unmasked half)");
  cmd->add_flag("--backward", args->backward,
                "time the backward (from the forward's saved output and logsumexp) and forward + backward");
  cmd->add_option("--matmul-precision", args->precision,
                  "float32 inputs: highest (default), high or medium (bf16 tiles)")
      ->check(CLI::IsMember({"highest", "high", "medium"}));
  cmd->add_option("--qk-quantization", args->qk,
                  "float32 inputs: none (default), int8 (SageAttention's smoothed int8 Q K^T) or int8_unsmoothed")
      ->check(CLI::IsMember({"none", "int8", "int8_unsmoothed"}));
  cmd->add_option("--dtype", args->dtype, "dtype of q, k, v and of the gemm's operands (default float32)")
      ->check(CLI::IsMember({"float32", "float64", "bfloat16", "float16"}));
  cmd->add_option("--threads", args->threads, "threads (default QKV_NUM_THREADS, else OMP_NUM_THREADS, else cores)")
      ->check(integer_in(1, 4096));
  cmd->add_option("--min-time", args->min_time, "seconds to time each measurement (default 1; 0: one call, no warm-up)")
      ->check(real_in(0.0, 86400.0));
  cmd->add_option("--min-runs", args->min_runs,
                  "timed calls at least, the best of them reported (default 1; e.g. 3 where one call outlasts "
                  "--min-time)")
      ->check(integer_in(1, 1000000));
  cmd->add_option("--gemm", args->gemm_n, "also time an N x N x N gemm in --dtype (e.g. 2048) and report % of it")
      ->check(integer_in(1, 65536));
  cmd->add_flag("--json", args->json, "one JSON object per line");
  cmd->callback([args] {
    if (args->shapes.empty()) args->shapes = {"1,8,1024,64"};
    run_bench_attention(*args);
  });
  register_bench_decode(bench);
  register_bench_peak(bench);
}

}  // namespace qkv::cli
