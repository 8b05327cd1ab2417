// The one best-of timing loop of the qkv tool (qkv bench, the speed line of qkv demo).
#pragma once

#include <algorithm>
#include <chrono>

namespace qkv::cli {

// Fastest seconds per call of fn over at least `min_reps` calls and `min_time`
// seconds (one untimed warm-up call first, except for a single call with
// min_time 0, e.g. to measure memory). The best, not the mean: the machine may
// be shared, and interference only ever adds time.
template <class Fn>
double best_seconds(double min_time, int min_reps, Fn&& fn) {
  using clock = std::chrono::steady_clock;
  if (min_time > 0 || min_reps > 1) fn();
  double best = 1e300, total = 0.0;
  int reps = 0;
  do {
    const auto t0 = clock::now();
    fn();
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::min(best, s);
    total += s;
  } while (++reps < min_reps || total < min_time);
  return best;
}

}  // namespace qkv::cli
