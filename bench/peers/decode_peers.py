#!/usr/bin/env python3
"""One decode step (Lq = 1) against a KV cache, qkv beside PyTorch, same run (issue 17 item 6).

One invocation prints one Markdown table whose header names the machine. Per cache length and
batch (Hq = 32, Hk = 8, D = 128, float32 and bfloat16 caches): qkv.decode_attention on a
qkv.KVCache, PyTorch F.scaled_dot_product_attention(q [B, Hq, 1, D], K, V [B, Hk, L, D],
enable_gqa=True) on the same keys, and a 2-thread memcpy of the same bytes (numpy.copyto on two
threads) as the bandwidth yardstick. Bandwidth = bytes of K and V read per step / time. ONNX
Runtime's GroupQueryAttention is not in the fixtures venv: not measured.

    PYTHONPATH=build/release/torch_stage .venv-fixtures/bin/python bench/peers/decode_peers.py
"""
import argparse
import os
import sys
import threading

import numpy as np

from precision_peers import machine
from timing import best_seconds

HQ, HK, D = 32, 8, 128


def memcpy_seconds(nbytes, threads, min_time):
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(src.size), threads)

    def copy():
        ts = [threading.Thread(target=np.copyto, args=(dst[p[0]:p[-1] + 1], src[p[0]:p[-1] + 1])) for p in parts]
        for t in ts:
            t.start()
        for t in ts:
            t.join()

    return best_seconds(copy, min_time)


def row(length, batch, dtype, threads, min_time):
    import torch
    import torch.nn.functional as F

    import qkv

    qkv.set_num_threads(threads)
    torch.set_num_threads(threads)
    rng = np.random.default_rng(0)
    k = rng.standard_normal((batch, HK, length, D), dtype=np.float32)
    v = rng.standard_normal((batch, HK, length, D), dtype=np.float32)
    q = rng.standard_normal((batch, HQ, 1, D), dtype=np.float32)
    cache = qkv.KVCache(batch, HK, D, length, dtype=dtype)
    cache.append(k, v)
    ours = best_seconds(lambda: qkv.decode_attention(q, cache), min_time)
    tdtype = torch.float32 if dtype == "float32" else torch.bfloat16
    tq, tk, tv = (torch.from_numpy(x).to(tdtype) for x in (q, k, v))
    with torch.inference_mode():
        theirs = best_seconds(lambda: F.scaled_dot_product_attention(tq, tk, tv, enable_gqa=True), min_time)
    nbytes = 2 * batch * HK * length * D * (4 if dtype == "float32" else 2)
    copy = memcpy_seconds(nbytes, threads, min_time)
    gb = lambda s: nbytes / s / 1e9  # noqa: E731
    return (f"| {length} | {batch} | {dtype} | {ours * 1e3:.2f} ms, {gb(ours):.1f} GB/s | "
            f"{theirs * 1e3:.2f} ms, {gb(theirs):.1f} GB/s | {theirs / ours:.2f}× | {gb(copy):.1f} GB/s | "
            f"{copy / ours * 100:.0f}% |")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qkv", default="build/release/bin/qkv", help="the qkv CLI (for the machine line)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--lengths", default="1024,8192,32768,131072")
    ap.add_argument("--batches", default="1,8")
    a = ap.parse_args()
    import torch

    print(f"{machine(a.qkv)}; {a.threads} threads; Hq={HQ}, Hk={HK}, D={D}, Lq=1; torch {torch.__version__}\n")
    print("| cache length | B | cache dtype | qkv decode_attention | torch SDPA (enable_gqa) | qkv / torch | "
          "memcpy (same bytes) | qkv % of memcpy |")
    print("|---|---|---|---|---|---|---|---|")
    for batch in map(int, a.batches.split(",")):
        for length in map(int, a.lengths.split(",")):
            if batch * length > 8 * 32768:  # the cache's K and V stay under ~4 GB f32
                continue
            for dtype in ("float32", "bfloat16"):
                print(row(length, batch, dtype, a.threads, a.min_time), flush=True)
                print(f"L={length} B={batch} {dtype} done, load {os.getloadavg()}", file=sys.stderr)


if __name__ == "__main__":
    main()
