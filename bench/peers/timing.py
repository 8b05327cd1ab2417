"""The peer scripts' one timing loop (they import it as `timing`: Python puts the
script's own folder, bench/peers, first on sys.path)."""
import time


def best_seconds(fn, min_time, min_runs=1, warm_up=True):
    """Best wall time of repeated calls of fn: at least min_runs calls and at least
    min_time seconds of timed calls, after one untimed warm-up call if warm_up."""
    if warm_up:
        fn()
    best, total, runs = float("inf"), 0.0, 0
    while runs < min_runs or total < min_time:
        t0 = time.perf_counter()
        fn()
        s = time.perf_counter() - t0
        best, total, runs = min(best, s), total + s, runs + 1
    return best
