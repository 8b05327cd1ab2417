#!/usr/bin/env python3
"""qkv.nn.MultiheadAttention beside torch.nn.MultiheadAttention, end to end, one process.

Both layers get the same weights and input; torch runs in eval() under
torch.inference_mode() with batch_first=True, query is key is value and
need_weights=False (its fast path, torch._native_multi_head_attention); qkv runs the same
call. Threads: torch.set_num_threads(n) and qkv.set_num_threads(n), per thread count.
Each time is the fastest call after one warm-up, calls repeated for at least --min-time s,
qkv and torch alternating per shape. Prints one Markdown table (ms, GFLOP/s, ratio).

    PYTHONPATH=<dir holding the qkv package> /work/fixenv/bin/python bench/peers/mha_peers.py --threads 1,2

GFLOP/s = (2*B*L*E*3E + 4*B*L*L*E + 2*B*L*E*E) / time for both libraries.
"""
import argparse
import time

import numpy as np
import torch

import qkv
import qkv.nn

SHAPES = [(8, 512, 768, 12), (1, 4096, 512, 8)]


def flops(b, l, e):
    return 2.0 * b * l * e * 3 * e + 4.0 * b * l * l * e + 2.0 * b * l * e * e


def best_seconds(fn, min_time):
    fn()
    best, total = float("inf"), 0.0
    while True:
        t0 = time.perf_counter()
        fn()
        s = time.perf_counter() - t0
        best, total = min(best, s), total + s
        if total >= min_time:
            return best


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--min-time", type=float, default=3.0)
    args = ap.parse_args()
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        qkv.set_num_threads(threads)
        for b, l, e, h in SHAPES:
            torch.manual_seed(0)
            ref = torch.nn.MultiheadAttention(e, h, batch_first=True).eval()
            mha = qkv.nn.MultiheadAttention.from_state_dict(ref.state_dict(), h, batch_first=True)
            x = torch.randn(b, l, e)
            xn = x.numpy()
            with torch.inference_mode():
                want = ref(x, x, x, need_weights=False)[0].numpy()
                got = mha(xn, xn, xn, need_weights=False)[0]
                err = float(np.max(np.abs(got - want)) / np.max(np.abs(want)))

                def run_torch():
                    ref(x, x, x, need_weights=False)

                def run_qkv():
                    mha(xn, xn, xn, need_weights=False)

                t_qkv = best_seconds(run_qkv, args.min_time)
                t_torch = best_seconds(run_torch, args.min_time)
            f = flops(b, l, e) / 1e9
            rows.append((threads, b, l, e, h, t_qkv, t_torch, f, err))
    print(f"torch {torch.__version__}, qkv {qkv.__version__}")
    print("| threads | B | L | E | H | qkv ms | torch ms | qkv GFLOP/s | torch GFLOP/s | torch / qkv | rel. diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for threads, b, l, e, h, tq, tt, f, err in rows:
        print(f"| {threads} | {b} | {l} | {e} | {h} | {tq * 1e3:.1f} | {tt * 1e3:.1f} | {f / tq:.1f} | "
              f"{f / tt:.1f} | {tt / tq:.2f}x | {err:.1e} |")


if __name__ == "__main__":
    main()
