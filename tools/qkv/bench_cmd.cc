// qkv bench attention: times the fused attention (scaled_dot_product_attention,
// f32 forward) and qkv::gemm on this machine; bench/peers/attention_peers.py
// runs it beside PyTorch and ONNX Runtime.
//
//   qkv bench attention --shape 4,8,1024,64 [--causal] [--threads 2] [--min-time 1] [--gemm 2048] [--json]
//
// GFLOP/s count 4*B*H*L*L*D (non-causal) or 4*B*H*D*L(L+1)/2 (causal: the
// unmasked half only). Time per call is the fastest of the timed calls. A progress
// line goes out before each measurement: to stdout on a terminal, to stderr when
// stdout is a pipe or file (which then holds only the results).
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <vector>

#include "commands.h"
#include "qkv/attention.h"
#include "qkv/attention_flops.h"
#include "qkv/gemm.h"
#include "qkv/parallel.h"
#include "timing.h"

namespace qkv::cli {

namespace {

struct BenchArgs {
  std::vector<std::string> shapes;  // "B,H,L,D"
  bool causal = false, json = false;
  int threads = 0;
  double min_time = 1.0;
  int64_t gemm_n = 0;
};

// "B,H,L,D" -> {B, H, L, D}, each a positive integer (a usage error otherwise).
std::vector<int64_t> parse_shape(const std::string& text) {
  std::vector<int64_t> dims;
  std::stringstream in(text);
  bool ok = !text.empty() && text.back() != ',';
  for (std::string part; ok && std::getline(in, part, ',');) {
    const std::optional<int64_t> d = to_integer(part, 1);
    ok = d.has_value();
    dims.push_back(d.value_or(0));
  }
  if (!ok || dims.size() != 4) {
    throw CLI::ValidationError("expected B,H,L,D (four integers >= 1), got '" + text + "'");
  }
  return dims;
}

// "[2/3] attention 1,8,1024,64 ...": before each measurement, which can take seconds.
void progress(size_t index, size_t count, const std::string& what) {
  static FILE* const out = isatty(fileno(stdout)) ? stdout : stderr;
  std::fprintf(out, "qkv bench: [%zu/%zu] %s ...\n", index, count, what.c_str());
  std::fflush(out);
}

double bench_gemm(int64_t n, double min_time) {
  std::vector<float> a(static_cast<size_t>(n * n), 0.5f), b(a), c(a);  // [n, n] each
  GemmShape s;
  s.m = s.n = s.k = s.lda = s.ldb = s.ldc = n;
  const double sec = best_seconds(min_time, 1, [&] { gemm(s, 1.0f, a.data(), b.data(), 0.0f, c.data()); });
  return 2.0 * static_cast<double>(n * n * n) / sec * 1e-9;
}

void bench_one(const BenchArgs& a, const std::string& shape_text, double gemm_gflops) {
  const std::vector<int64_t> d = parse_shape(shape_text);
  const Shape shape = {d[0], d[1], d[2], d[3]};  // [B, H, L, D]
  const Tensor q = Tensor::randn(shape, 1), k = Tensor::randn(shape, 2), v = Tensor::randn(shape, 3);
  AttentionOptions o;
  o.is_causal = a.causal;
  const double sec = best_seconds(a.min_time, 1, [&] { (void)scaled_dot_product_attention(q, k, v, o); });
  const double gflops = attention_flops(d[0], d[1], d[2], d[3], a.causal) / sec * 1e-9;
  if (a.json) {
    std::printf(
        "{\"op\": \"attention\", \"shape\": [%ld, %ld, %ld, %ld], \"causal\": %s, \"threads\": %d, "
        "\"ms\": %.4f, \"gflops\": %.2f}\n",
        static_cast<long>(d[0]), static_cast<long>(d[1]), static_cast<long>(d[2]), static_cast<long>(d[3]),
        a.causal ? "true" : "false", get_num_threads(), sec * 1e3, gflops);
    return;
  }
  std::printf("attention (B,H,L,D)=(%s) %s, %d thread(s): %.3f ms, %.1f GFLOP/s", shape_text.c_str(),
              a.causal ? "causal" : "non-causal", get_num_threads(), sec * 1e3, gflops);
  if (gemm_gflops > 0) std::printf(" (%.0f%% of gemm's %.1f GFLOP/s)", 100.0 * gflops / gemm_gflops, gemm_gflops);
  std::printf("\n");
}

void run_bench_attention(const BenchArgs& a) {
  if (a.threads > 0) set_num_threads(a.threads);
  double gemm_gflops = 0.0;
  const size_t count = a.shapes.size() + (a.gemm_n > 0 ? 1 : 0);
  if (a.gemm_n > 0) {
    progress(1, count, "gemm f32 " + std::to_string(a.gemm_n) + "^3");
    gemm_gflops = bench_gemm(a.gemm_n, a.min_time);
    if (a.json) {
      std::printf("{\"op\": \"gemm\", \"n\": %ld, \"threads\": %d, \"gflops\": %.2f}\n", static_cast<long>(a.gemm_n),
                  get_num_threads(), gemm_gflops);
    } else {
      std::printf("gemm f32 %ld^3, %d thread(s): %.1f GFLOP/s\n", static_cast<long>(a.gemm_n), get_num_threads(),
                  gemm_gflops);
    }
  }
  for (size_t i = 0; i < a.shapes.size(); ++i) {
    progress(count - a.shapes.size() + i + 1, count,
             std::string("attention ") + (a.causal ? "causal " : "") + a.shapes[i]);
    bench_one(a, a.shapes[i], gemm_gflops);
  }
}

}  // namespace

void register_bench(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "Time qkv kernels on this machine");
  bench->require_subcommand(1);
  auto args = std::make_shared<BenchArgs>();
  CLI::App* cmd = bench->add_subcommand("attention", "Fused f32 attention forward (and qkv::gemm) GFLOP/s");
  cmd->add_option("--shape", args->shapes, "B,H,L,D (repeatable; default 1,8,1024,64)")
      ->each([](const std::string& text) { (void)parse_shape(text); });
  cmd->add_flag("--causal", args->causal, "causal attention (GFLOP/s count the unmasked half)");
  cmd->add_option("--threads", args->threads, "threads (default QKV_NUM_THREADS, else OMP_NUM_THREADS, else cores)")
      ->check(integer_in(1, 4096));
  cmd->add_option("--min-time", args->min_time, "seconds to time each measurement (default 1; 0: one call, no warm-up)")
      ->check(real_in(0.0, 86400.0));
  cmd->add_option("--gemm", args->gemm_n, "also time an N x N x N f32 gemm (e.g. 2048) and report % of it")
      ->check(integer_in(1, 65536));
  cmd->add_flag("--json", args->json, "one JSON object per line");
  cmd->callback([args] {
    if (args->shapes.empty()) args->shapes = {"1,8,1024,64"};
    run_bench_attention(*args);
  });
}

}  // namespace qkv::cli
