// qkv bench decode: one decode step (decode_attention, Lq = 1) against a KV cache on this machine:
// time and bandwidth (bytes of K and V read per step / time). bench/decode_bench.cc has the
// table with memcpy beside it; bench/peers/decode_peers.py puts PyTorch beside it. The machine
// line (qkv info) goes first, as for qkv bench attention.
//
//   qkv bench decode --cache-len 32768 [--cache-len ...] [--batch 1] [--heads 32 --kv-heads 8
//                    --head-dim 128] [--dtype bfloat16] [--matmul-precision medium] [--threads 2]
//                    [--window W] [--page-size P] [--min-time 1] [--json]
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "qkv/kv_cache.h"
#include "qkv/parallel.h"
#include "timing.h"

namespace qkv::cli {

namespace {

struct DecodeArgs {
  std::vector<int64_t> lengths;
  int64_t batch = 1, heads = 32, kv_heads = 8, head_dim = 128, window = 0, page_size = 0;
  std::string dtype = "float32", precision = "highest";
  int threads = 0;
  double min_time = 1.0;
  bool json = false;
};

void bench_one(const DecodeArgs& a, int64_t len) {
  KVCacheConfig c{a.batch, a.kv_heads, a.head_dim, len, a.head_dim, dtype_from_name(a.dtype)};
  c.page_size = a.page_size;
  if (a.window > 0) c.window = a.window, c.capacity = a.window;  // a ring of the window
  KVCache cache(c);
  // A ring keeps only its last `capacity` positions: it starts there (filling all of them took
  // len / 4096 appends, forever at --cache-len 2^63 - 1, to keep the last `window`).
  const int64_t from = a.window > 0 ? std::max<int64_t>(0, len - c.capacity) : 0;
  for (int64_t b = 0; b < a.batch && from > 0; ++b) cache.set_length(b, from);
  for (int64_t at = from, n = 0; at < len; at += n) {  // filled in slices: the random tensors stay small
    n = std::min<int64_t>(4096, len - at);             // at + n <= len: no overflow at --cache-len 2^63 - 1
    cache.append(Tensor::randn({a.batch, a.kv_heads, n, a.head_dim}, static_cast<uint64_t>(at)),
                 Tensor::randn({a.batch, a.kv_heads, n, a.head_dim}, static_cast<uint64_t>(at) + 1));
  }
  const Tensor q = Tensor::randn({a.batch, a.heads, 1, a.head_dim}, 7);  // [B, Hq, 1, D]
  DecodeOptions o;
  o.matmul_precision = matmul_precision_from_name(a.precision);
  const double s = best_seconds(a.min_time, 1, [&] { (void)decode_attention(q, cache, o); });
  const int64_t keys = a.window > 0 ? std::min(len, a.window) : len;  // read per step
  // an int8 row also reads its bfloat16 scales, one per KVCache::kInt8Group channels
  const int64_t groups = (a.head_dim + KVCache::kInt8Group - 1) / KVCache::kInt8Group;
  const int64_t row = cache.config().dtype == DType::i8
                          ? a.head_dim + 2 * groups
                          : a.head_dim * static_cast<int64_t>(itemsize(cache.config().dtype));
  const double bytes = 2.0 * static_cast<double>(a.batch * a.kv_heads * keys * row);
  if (a.json) {
    std::printf(
        "{\"op\": \"decode\", \"cache_len\": %lld, \"batch\": %lld, \"heads\": %lld, \"kv_heads\": %lld, "
        "\"head_dim\": %lld, \"dtype\": \"%s\", \"window\": %lld, \"page_size\": %lld, \"threads\": %d, \"ms\": %.6g, "
        "\"gb_per_s\": %.6g}\n",
        static_cast<long long>(len), static_cast<long long>(a.batch), static_cast<long long>(a.heads),
        static_cast<long long>(a.kv_heads), static_cast<long long>(a.head_dim), a.dtype.c_str(),
        static_cast<long long>(a.window), static_cast<long long>(a.page_size), get_num_threads(), s * 1e3,
        bytes / s / 1e9);
  } else {
    std::printf("decode cache %lld x B %lld (Hq %lld, Hk %lld, D %lld, %s): %.3f ms per step, %.1f GB/s of K and V\n",
                static_cast<long long>(len), static_cast<long long>(a.batch), static_cast<long long>(a.heads),
                static_cast<long long>(a.kv_heads), static_cast<long long>(a.head_dim), a.dtype.c_str(), s * 1e3,
                bytes / s / 1e9);
  }
  std::fflush(stdout);
}

}  // namespace

void register_bench_decode(CLI::App* bench) {
  auto a = std::make_shared<DecodeArgs>();
  CLI::App* cmd = bench->add_subcommand("decode", "One decode step (Lq = 1) against a KV cache: ms and GB/s");
  cmd->add_option("--cache-len", a->lengths, "cache length (repeatable; default 8192)")->check(integer_in(1));
  cmd->add_option("--batch", a->batch, "sequences (default 1)")->check(integer_in(1, 4096));
  cmd->add_option("--heads", a->heads, "query heads (default 32)")->check(integer_in(1, 4096));
  cmd->add_option("--kv-heads", a->kv_heads, "cache heads, dividing --heads (default 8)")->check(integer_in(1, 4096));
  cmd->add_option("--head-dim", a->head_dim, "D (default 128)")->check(integer_in(1, 4096));
  cmd->add_option("--dtype", a->dtype, "cache dtype (default float32)")
      ->check(CLI::IsMember({"float32", "bfloat16", "float16", "int8"}));
  cmd->add_option("--matmul-precision", a->precision,
                  "accepted and ignored: every cache is read exactly (docs/decode.md)")
      ->check(CLI::IsMember({"highest", "high", "medium"}));
  cmd->add_option("--window", a->window, "sliding-window cache of W positions (a ring; default 0: off)")
      ->check(integer_in(0));
  cmd->add_option("--page-size", a->page_size, "paged cache with pages of P positions (default 0: contiguous)")
      ->check(integer_in(0));
  cmd->add_option("--threads", a->threads, "threads (default QKV_NUM_THREADS, else OMP_NUM_THREADS, else cores)")
      ->check(integer_in(1, 4096));
  cmd->add_option("--min-time", a->min_time, "seconds to time each measurement (default 1)")
      ->check(real_in(0.0, 86400.0));
  cmd->add_flag("--json", a->json, "one JSON object per line");
  cmd->callback([a] {
    if (a->heads % a->kv_heads != 0) {  // else an error from decode_attention after the whole cache was filled
      throw CLI::ValidationError("--heads", "--heads " + std::to_string(a->heads) +
                                                " must be a multiple of --kv-heads " + std::to_string(a->kv_heads));
    }
    if (a->threads > 0) set_num_threads(a->threads);
    print_machine_line(a->json);
    if (a->lengths.empty()) a->lengths = {8192};
    for (int64_t len : a->lengths) bench_one(*a, len);
  });
}

}  // namespace qkv::cli
