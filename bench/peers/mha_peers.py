#!/usr/bin/env python3
"""qkv::nn::MultiheadAttention beside torch.nn.MultiheadAttention, end to end, one invocation.

qkv is timed by bench/mha_bench.cc (BM_MultiheadAttention, a subprocess with
QKV_NUM_THREADS=n: one OpenMP runtime per process, so neither library's spinning
threads slow the other); torch in this process with torch.set_num_threads(n), in eval()
under torch.inference_mode() with batch_first=True, query is key is value and
need_weights=False (its fast path, torch._native_multi_head_attention). Both compute the
same call: packed in-projection with bias, attention, output projection, f32.
Rounds alternate qkv and torch per shape (--rounds); each figure is the fastest call of
any round (torch: one warm-up, then calls for >= --min-time / --rounds s per round; qkv:
Google Benchmark's real time per iteration, min over rounds). If the qkv Python package
is importable, the script also checks that qkv.nn and torch agree on one call.

    /work/fixenv/bin/python bench/peers/mha_peers.py --bench build/release/mha_bench --threads 1,2

GFLOP/s = (2*B*L*E*3E + 4*B*L*L*E + 2*B*L*E*E) / time for both libraries.
"""
import argparse
import json
import os
import subprocess

from timing import best_seconds, machine_of_benchmark

import numpy as np
import torch

SHAPES = [(8, 512, 768, 12), (1, 4096, 512, 8)]


def flops(b, l, e):
    return 2.0 * b * l * e * 3 * e + 4.0 * b * l * l * e + 2.0 * b * l * e * e


def qkv_seconds(bench, threads, shape, min_time):
    b, l, e, h = shape
    name = f"BM_MultiheadAttention/B:{b}/L:{l}/E:{e}/H:{h}/real_time"
    env = dict(os.environ, QKV_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run([bench, f"--benchmark_filter=^{name}$", f"--benchmark_min_time={min_time}",
                          "--benchmark_format=json"], check=True, capture_output=True, text=True, env=env).stdout
    doc = json.loads(out)
    runs = [r for r in doc["benchmarks"] if r["name"] == name]
    assert runs[0]["time_unit"] == "ms"
    return runs[0]["real_time"] / 1e3, machine_of_benchmark(doc["context"])


def parity(shape, ref, x):
    try:
        import qkv.nn
    except ImportError:
        return float("nan")
    mha = qkv.nn.MultiheadAttention.from_state_dict(ref.state_dict(), shape[3], batch_first=True)
    with torch.inference_mode():
        want = ref(x, x, x, need_weights=False)[0].numpy()
    xn = x.numpy()
    got = mha(xn, xn, xn, need_weights=False)[0]
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", default="build/release/mha_bench")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--min-time", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    rows, machine = [], "?"
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        for shape in SHAPES:
            b, l, e, h = shape
            torch.manual_seed(0)
            ref = torch.nn.MultiheadAttention(e, h, batch_first=True).eval()
            x = torch.randn(b, l, e)
            err = parity(shape, ref, x)
            t_qkv = t_torch = float("inf")
            for _ in range(args.rounds):  # alternate, so that a load change hits both
                seconds, machine = qkv_seconds(args.bench, threads, shape, args.min_time / args.rounds)
                t_qkv = min(t_qkv, seconds)
                with torch.inference_mode():
                    t_torch = min(t_torch, best_seconds(lambda: ref(x, x, x, need_weights=False),
                                                        args.min_time / args.rounds))
            rows.append((threads, b, l, e, h, t_qkv, t_torch, flops(b, l, e) / 1e9, err))
    print(f"Machine: {machine}; torch {torch.__version__}\n")
    print("| threads | B | L | E | H | qkv ms | torch ms | qkv GFLOP/s | torch GFLOP/s | qkv speed-up | rel. diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for threads, b, l, e, h, tq, tt, f, err in rows:
        print(f"| {threads} | {b} | {l} | {e} | {h} | {tq * 1e3:.1f} | {tt * 1e3:.1f} | {f / tq:.1f} | "
              f"{f / tt:.1f} | {tt / tq:.2f}× | {err:.1e} |")


if __name__ == "__main__":
    main()
