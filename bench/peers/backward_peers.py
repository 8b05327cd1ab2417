#!/usr/bin/env python3
"""qkv's fused CPU attention backward beside PyTorch's CPU SDPA backward (issue 15).

One invocation prints one Markdown table whose header names the machine (CPU model,
AVX-512/AMX flags, Highway's and oneDNN's ISA: `qkv info`). Per shape and causal flag it
times, f32, in this order: qkv (`qkv bench attention --backward --json`: the forward with its
logsumexp, the backward from the saved tensors, and the two together) and PyTorch
`F.scaled_dot_product_attention` forward (no grad) and forward + `.backward(dO)` on
tensors that require grad; torch's backward time is the difference. The gemm
yardstick is qkv::gemm f32 2048^3 in the same run.

    .venv-fixtures/bin/python bench/peers/backward_peers.py --qkv build/release/bin/qkv --threads 2

GFLOP/s: the forward counts 4*B*H*L*L*D (causal: the unmasked half), the backward 2.5x
that (its five products against the forward's two). Times: the fastest call after one
warm-up, calls repeated for at least --min-time seconds and at least --min-runs calls (3 by
default: at the largest shape one call outlasts --min-time, so one slow call of a VM hiccup
decided the row), in --rounds rounds that alternate qkv and torch (the best of each kept).
"""
import argparse
import os
import sys

from attention_peers import SHAPES, flops, run_qkv_cmd
from precision_peers import machine
from timing import best_seconds


def run_torch(threads, shape, causal, min_time, min_runs):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=gen).requires_grad_() for _ in range(3))
    grad = torch.randn(shape, generator=gen)

    def forward():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    def forward_backward():
        F.scaled_dot_product_attention(q, k, v, is_causal=causal).backward(grad)

    return best_seconds(forward, min_time, min_runs), best_seconds(forward_backward, min_time, min_runs)


def steal_seconds():
    """CPU time the hypervisor gave to others so far (/proc/stat's steal, all CPUs), or 0 where unknown."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def measure(a, threads, shape, causal):
    """qkv's JSON line (its times the fastest over the rounds) and torch's forward and forward +
    backward seconds, best of `a.rounds` rounds that alternate the two: a disturbance of the VM
    that lasts seconds (a neighbour's memory traffic shows no steal time) then hits one round of
    each side, not the whole of one side's measurement."""
    q, t_fwd, t_both = None, float("inf"), float("inf")
    for _ in range(a.rounds):
        r = run_qkv_cmd(a.qkv, threads, shape, causal, a.min_time,
                        extra=["--backward", "--min-runs", str(a.min_runs)])[0]
        q = r if q is None else {**q, "ms": min(q["ms"], r["ms"]), "fwd_bwd_ms": min(q["fwd_bwd_ms"], r["fwd_bwd_ms"])}
        f, b = run_torch(threads, shape, causal, a.min_time, a.min_runs)
        t_fwd, t_both = min(t_fwd, f), min(t_both, b)
    return q, t_fwd, t_both


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qkv", default="build/release/bin/qkv", help="the qkv CLI")
    ap.add_argument("--threads", default="2", help="comma list, e.g. 1,2")
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--min-runs", type=int, default=3,
                    help="timed calls at least per measurement, qkv's and torch's alike (default 3: at "
                         "(1, 8, 16384, 128) one call outlasts --min-time, and one slow call decided a row)")
    ap.add_argument("--rounds", type=int, default=2,
                    help="qkv and torch timed in turn this many times per row, the best of each kept (default 2)")
    ap.add_argument("--shapes", default="", help="B,H,L,D;B,H,L,D (default: the issue-6 four)")
    a = ap.parse_args()
    shapes = [tuple(map(int, s.split(","))) for s in a.shapes.split(";")] if a.shapes else SHAPES
    import torch

    header = machine(a.qkv)
    print(f"torch {torch.__version__}, load {os.getloadavg()}", file=sys.stderr)
    rows = []
    for threads in map(int, a.threads.split(",")):
        gemm = run_qkv_cmd(a.qkv, threads, None, False, a.min_time, gemm_n=2048)[0]["gflops"]
        for shape in shapes:
            for causal in (False, True):
                fl = flops(*shape, causal)
                steal = steal_seconds()
                q, t_fwd, t_both = measure(a, threads, shape, causal)
                rows.append((threads, shape, causal, q["fwd_bwd_ms"], q["ms"], 2.5 * fl / (q["ms"] * 1e-3) / 1e9,
                             t_both * 1e3, (t_both - t_fwd) * 1e3, gemm))
                print(f"done {threads} {shape} {causal}: steal {steal_seconds() - steal:.2f} s, "
                      f"load {os.getloadavg()[0]:.2f}", file=sys.stderr, flush=True)
    print(f"Machine: {header}\n")
    print("| threads | (B, H, L, D) | causal | qkv fwd+bwd ms | qkv bwd ms | qkv bwd GFLOP/s | torch fwd+bwd ms "
          "| torch bwd ms | fwd+bwd qkv / torch | bwd qkv / torch | qkv bwd % of gemm (gemm GFLOP/s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for threads, shape, causal, q_both, q_bwd, q_gf, t_both, t_bwd, gemm in rows:
        print(f"| {threads} | {shape} | {'yes' if causal else 'no'} | {q_both:.1f} | {q_bwd:.1f} | {q_gf:.1f} "
              f"| {t_both:.1f} | {t_bwd:.1f} | {t_both / q_both:.2f}× | {t_bwd / q_bwd:.2f}× "
              f"| {100 * q_gf / gemm:.0f}% ({gemm:.0f}) |")


if __name__ == "__main__":
    main()
