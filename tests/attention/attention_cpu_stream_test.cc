// The fused forward's streamed output (attention_cpu.cc, run_all): an output larger than the
// workers' L2 is accumulated item by item in the worker's scratch and stored once with
// streamed stores. Each batch entry of such a call must give the same bits as the entry
// called alone, whose smaller output is accumulated in place (an item's arithmetic does not
// depend on the call around it); the in-place path is checked against the references
// elsewhere (attention_cpu_test.cc, mods_test.cc), and here once more against the float64
// reference.
#include <gtest/gtest.h>

#include <string>

#include "attention/flash_tiles.h"
#include "common/relative_error.h"
#include "common/thread_guard.h"
#include "qkv/attention.h"
#include "qkv/parallel.h"

namespace qkv {
namespace {

using testing::max_abs_error;

// q, k, v [B, 1, L, D] with B entries enough that the output [B, 1, L, D] outgrows the L2
// of `workers` workers while one entry's does not.
struct Inputs {
  Tensor q, k, v;
};

Inputs streamed_inputs(int64_t workers, int64_t l, int64_t d, DType dt) {
  const int64_t entry = l * d * static_cast<int64_t>(dt == DType::f64 ? 8 : 4);  // bytes of one entry's output
  const int64_t entries = workers * attention::l2_cache_bytes() / entry + 1;
  EXPECT_LE(entry, workers * attention::l2_cache_bytes());  // one entry alone: accumulated in place
  return {Tensor::randn({entries, 1, l, d}, 61).to(dt), Tensor::randn({entries, 1, l, d}, 62).to(dt),
          Tensor::randn({entries, 1, l, d}, 63).to(dt)};
}

void expect_entries_match(const Inputs& in, const AttentionOptions& o) {
  const AttentionResult all = scaled_dot_product_attention(in.q, in.k, in.v, o);
  for (int64_t b = 0; b < in.q.size(0); ++b) {
    SCOPED_TRACE("entry " + std::to_string(b));
    const AttentionResult one =
        scaled_dot_product_attention(in.q.slice(0, b, b + 1), in.k.slice(0, b, b + 1), in.v.slice(0, b, b + 1), o);
    EXPECT_EQ(max_abs_error(all.output.slice(0, b, b + 1), one.output), 0.0);
    EXPECT_EQ(max_abs_error(all.logsumexp->slice(0, b, b + 1), *one.logsumexp), 0.0);
  }
  const AttentionResult ref = attention_reference(in.q.slice(0, 0, 2), in.k.slice(0, 0, 2), in.v.slice(0, 0, 2), o);
  EXPECT_LE(max_abs_error(all.output.slice(0, 0, 2), ref.output), in.q.dtype() == DType::f64 ? 1e-12 : 3e-6);
}

TEST(StreamedOutput, FullAttentionEntriesMatchTheirOwnCalls) {
  const test::ThreadCountGuard guard;
  set_num_threads(2);
  AttentionOptions o;
  o.return_logsumexp = true;
  expect_entries_match(streamed_inputs(2, 1024, 64, DType::f32), o);
}

// BigBird on two workers: the gathered tiles' slots are a function of the tiles alone
// (place_gathered), so an item's columns, and the bits of its P V, do not depend on which
// worker runs it or what that worker ran before (its global blocks stay in their slots).
TEST(StreamedOutput, BigBirdAndCausalWindowEntriesMatchTheirOwnCalls) {
  const test::ThreadCountGuard guard;
  set_num_threads(2);
  AttentionOptions bigbird;
  bigbird.return_logsumexp = true;
  bigbird.mods = AttentionMods::bigbird(64, 1, 2, 3, 1024);  // gathered tiles, global rows
  const Inputs in = streamed_inputs(2, 1024, 64, DType::f32);
  expect_entries_match(in, bigbird);
  const AttentionResult two = scaled_dot_product_attention(in.q, in.k, in.v, bigbird);
  set_num_threads(1);
  const AttentionResult one = scaled_dot_product_attention(in.q, in.k, in.v, bigbird);
  EXPECT_EQ(max_abs_error(two.output, one.output), 0.0);  // thread-count independent, bit for bit
  set_num_threads(2);
  AttentionOptions window;
  window.return_logsumexp = true;
  window.is_causal = true;
  window.mods = AttentionMods::sliding_window(100, 0);  // the window's run path, float64 accumulators
  expect_entries_match(streamed_inputs(2, 512, 48, DType::f64), window);
}

}  // namespace
}  // namespace qkv
