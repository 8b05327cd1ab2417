#!/usr/bin/env python3
"""The attention family against the sequence length (issue 16 item 9): time and peak RSS.

One invocation prints one Markdown table whose header names the machine. Every case runs at
B = 1, H = 8, D = 64, float32, in a fresh process (so that its peak RSS is its own), for L from
--lengths until a case's time passes --budget seconds (then its longer lengths are skipped):

  qkv full           qkv.scaled_dot_product_attention, no mask (the fused kernel)
  qkv window         causal sliding window of 512 keys (mods, empty tiles skipped)
  qkv bigbird        BigBird blocks of 64, one block each side, 2 random, first/last global
  qkv linear         linear attention, elu + 1 (O(L))
  qkv favor          Performer FAVOR+, 128 random features (O(L))
  qkv lsh            Reformer LSH attention, q as the shared query-key: 2 hash rounds, chunks of 64
                     seeing the chunk before, Reformer's default bucket count for L (O(L))
  torch dense        torch F.scaled_dot_product_attention with the window as a dense bool mask
  torch flex         torch flex_attention (torch.compile'd) with the window's block mask

Needs qkv importable beside torch: run it as `make` stages it for test-torch,
    PYTHONPATH=build/release/torch_stage .venv-fixtures/bin/python bench/peers/variants_peers.py
(`make test-torch` leaves the staged package there). Times: the fastest call after one warm-up,
calls repeated for at least --min-time seconds.
"""
import argparse
import json
import os
import resource
import subprocess
import sys

from precision_peers import machine
from timing import best_seconds

H, D, WINDOW, BLOCK = 8, 64, 512, 64
QUADRATIC = {"qkv full", "torch dense"}  # time grows as L^2: their next L is projected 16x
CASES = ["qkv full", "qkv window", "qkv bigbird", "qkv linear", "qkv favor", "qkv lsh", "torch dense", "torch flex"]


def pairs(case, length):
    """Allowed (query, key) pairs, for GFLOP/s (linear variants: None)."""
    if case in ("qkv full",):
        return length * length
    if case in ("qkv window", "torch dense", "torch flex"):
        w = min(WINDOW, length)
        return w * (w + 1) // 2 + (length - w) * w
    return None


def qkv_case(case, length, q, k, v):
    import qkv

    if case == "qkv full":
        return lambda: qkv.scaled_dot_product_attention(q, k, v)
    if case == "qkv window":
        mods = qkv.AttentionMods.sliding_window(WINDOW - 1, 0)
        return lambda: qkv.scaled_dot_product_attention(q, k, v, mods=mods)
    if case == "qkv bigbird":
        mods = qkv.AttentionMods.bigbird(BLOCK, 1, 2, 0, length)
        return lambda: qkv.scaled_dot_product_attention(q, k, v, mods=mods)
    if case == "qkv linear":
        return lambda: qkv.linear_attention(q, k, v)
    if case == "qkv lsh":
        return lambda: qkv.attention.lsh(q, v, n_hashes=2, chunk_length=64)
    return lambda: qkv.linear_attention(q, k, v, feature_map="favor", num_features=128)


def torch_case(case, length, q, k, v):
    import torch
    import torch.nn.functional as F

    i = torch.arange(length)
    if case == "torch dense":
        mask = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - WINDOW)
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    def window(b, h, qi, kj):
        return (kj <= qi) & (kj > qi - WINDOW)

    block_mask = create_block_mask(window, None, None, length, length, device="cpu")
    flex = torch.compile(flex_attention)
    return lambda: flex(q, k, v, block_mask=block_mask)


def one(case, length, threads, min_time):
    """Times one case in this process; prints {"seconds", "rss_mb"} or {"error"}."""
    import numpy as np

    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, H, length, D), dtype=np.float32) for _ in range(3))
    try:
        if case.startswith("torch"):
            import torch

            torch.set_num_threads(threads)
            q, k, v = (torch.from_numpy(x) for x in (q, k, v))
            fn = torch_case(case, length, q, k, v)
            with torch.inference_mode():
                seconds = best_seconds(fn, min_time)
        else:
            import qkv

            qkv.set_num_threads(threads)
            seconds = best_seconds(qkv_case(case, length, q, k, v), min_time)
    except Exception as e:  # noqa: BLE001  (reported in the table: "does not run")
        print(json.dumps({"error": f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"}))
        return
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": seconds, "rss_mb": rss}))


def cell(result, case, length):
    if "error" in result:
        return f"does not run ({result['error']})"
    n = pairs(case, length)
    rate = f", {4 * H * D * n / result['seconds'] / 1e9:.0f} GFLOP/s" if n else ""
    return f"{result['seconds'] * 1e3:.1f} ms{rate}, {result['rss_mb']:.0f} MB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qkv", default="build/release/bin/qkv", help="the qkv CLI (for the machine line)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--lengths", default="1024,4096,16384,65536,262144,1048576")
    ap.add_argument("--budget", type=float, default=20.0,
                    help="skip the next L once its projected time (x4 for the linear cases, x16 for the quadratic "
                         "ones) passes 4x this")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--one", nargs=2, metavar=("CASE", "L"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        one(a.one[0], int(a.one[1]), a.threads, a.min_time)
        return
    lengths = [int(x) for x in a.lengths.split(",")]
    cases = a.cases.split(",")
    print(f"{machine(a.qkv)}; {a.threads} threads; B=1, H={H}, D={D}, float32\n")
    print("| case | " + " | ".join(f"L = {n}" for n in lengths) + " |")
    print("|---|" + "---|" * len(lengths))
    for case in cases:
        cells, stopped = [], False
        for n in lengths:
            if stopped:
                cells.append("skipped (budget)")
                continue
            out = subprocess.run([sys.executable, __file__, "--one", case, str(n), "--threads", str(a.threads),
                                  "--min-time", str(a.min_time)], capture_output=True, text=True, env=os.environ)
            lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
            result = json.loads(lines[-1]) if lines else {"error": (out.stderr.strip().splitlines() or ["?"])[-1][:80]}
            cells.append(cell(result, case, n))
            growth = 16 if case in QUADRATIC else 4
            stopped = "error" in result or result["seconds"] * growth > a.budget * 4
            print(f"{case} L={n}: {cells[-1]}", file=sys.stderr)
        print(f"| {case} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
