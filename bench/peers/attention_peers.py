#!/usr/bin/env python3
"""qkv's fused CPU attention beside PyTorch SDPA and ONNX Runtime MultiHeadAttention.

One invocation times, per thread count and shape, in this order: qkv (through
`qkv bench attention --json`, a subprocess with QKV_NUM_THREADS set), PyTorch
`F.scaled_dot_product_attention` (torch.set_num_threads) and ONNX Runtime's
com.microsoft.MultiHeadAttention (intra_op_num_threads), all f32 forward, and
qkv::gemm's f32 GFLOP/s (2048^3) as the yardstick, and the cores' float32 FMA peak
(`qkv bench peak`) as the ceiling above it; then prints one Markdown table.

    /work/fixenv/bin/python bench/peers/attention_peers.py --qkv build/release/bin/qkv --threads 1,2

GFLOP/s = 4*B*H*L*L*D / time (non-causal) and 4*B*H*D*L(L+1)/2 / time (causal,
the unmasked half, the same count for every library). Each time is the fastest
call after one warm-up call, calls repeated for at least --min-time seconds.
Layouts: qkv and torch take q, k, v as [B, H, L, D]; ORT MHA takes [B, L, H*D]
(its native 3-D layout). ORT's causal (unidirectional) MHA is its unfused path,
which stores [B, H, L, L] scores: skipped where that exceeds --ort-max-gb.
"""
import argparse
import json
import os
import subprocess
import sys

from timing import best_seconds, machine_of_cli

import numpy as np

SHAPES = [(1, 8, 512, 64), (4, 8, 1024, 64), (1, 16, 4096, 64), (1, 8, 16384, 128)]


def flops(b, h, l, d, causal):
    pairs = l * (l + 1) / 2 if causal else l * l
    return 4.0 * b * h * d * pairs


def run_qkv_cmd(qkv, threads, shape, causal, min_time, gemm_n=0, dtype="float32", extra=()):
    """`qkv bench attention --json` in a subprocess with QKV_NUM_THREADS set: its JSON lines."""
    cmd = [qkv, "bench", "attention", "--json", "--threads", str(threads), "--min-time", str(min_time),
           "--dtype", dtype, *extra]
    if shape:
        cmd += ["--shape", ",".join(map(str, shape))]
    if causal:
        cmd.append("--causal")
    if gemm_n:
        cmd += ["--gemm", str(gemm_n)]
    env = dict(os.environ, QKV_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def run_peak(qkv, threads, min_time):
    """`qkv bench peak --json`: the float32 multiply-add peak of `threads` workers, GFLOP/s."""
    cmd = [qkv, "bench", "peak", "--json", "--threads", str(threads), "--min-time", str(min_time)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")][0]["gflops"]


def run_torch(threads, shape, causal, min_time):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g) for _ in range(3))
    with torch.inference_mode():
        return best_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), min_time)


def ort_session(b, h, l, d, causal, threads):
    import onnx
    import onnxruntime as ort
    from onnx import TensorProto, helper

    e = h * d
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [b, l, e]) for n in ("q", "k", "v")]
    output = helper.make_tensor_value_info("out", TensorProto.FLOAT, [b, l, e])
    node = helper.make_node("MultiHeadAttention", ["q", "k", "v"], ["out"], domain="com.microsoft",
                            num_heads=h, unidirectional=1 if causal else 0)
    graph = helper.make_graph([node], "mha", inputs, [output])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 10  # what every recent onnxruntime accepts
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])


def run_ort(threads, shape, causal, min_time, max_gb):
    b, h, l, d = shape
    if causal and b * h * l * l * 4 / 1e9 > max_gb:
        return None
    sess = ort_session(b, h, l, d, causal, threads)
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal((b, l, h * d), dtype=np.float32) for n in ("q", "k", "v")}
    return best_seconds(lambda: sess.run(None, feeds), min_time)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qkv", default="build/release/bin/qkv", help="the qkv CLI")
    ap.add_argument("--threads", default="2", help="comma list, e.g. 1,2")
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--shapes", default="", help="B,H,L,D;B,H,L,D (default: the issue's four)")
    ap.add_argument("--ort-max-gb", type=float, default=2.0, help="skip ORT causal above this score size")
    ap.add_argument("--no-ort", action="store_true")
    a = ap.parse_args()
    shapes = [tuple(map(int, s.split(","))) for s in a.shapes.split(";")] if a.shapes else SHAPES
    import torch

    ort_version = "skipped"
    if not a.no_ort:
        import onnxruntime

        ort_version = onnxruntime.__version__
    print(f"torch {torch.__version__}, onnxruntime {ort_version}, load {os.getloadavg()}", file=sys.stderr)
    rows = []
    for threads in map(int, a.threads.split(",")):
        gemm = run_qkv_cmd(a.qkv, threads, None, False, a.min_time, gemm_n=2048)[0]["gflops"]
        peak = run_peak(a.qkv, threads, a.min_time)
        for shape in shapes:
            for causal in (False, True):
                fl = flops(*shape, causal)
                q = run_qkv_cmd(a.qkv, threads, shape, causal, a.min_time)[0]
                t = run_torch(threads, shape, causal, a.min_time)
                o = None if a.no_ort else run_ort(threads, shape, causal, a.min_time, a.ort_max_gb)
                rows.append((threads, shape, causal, q["ms"], q["gflops"], fl / t / 1e9,
                             None if o is None else fl / o / 1e9, gemm, peak))
                print(f"done {threads} {shape} {causal}", file=sys.stderr, flush=True)
    print(f"Machine: {machine_of_cli(a.qkv)}; torch {torch.__version__}, onnxruntime {ort_version}\n")
    print("| threads | (B, H, L, D) | causal | qkv ms | qkv GFLOP/s | torch GFLOP/s | ORT GFLOP/s "
          "| qkv / torch | qkv / ORT | qkv % of gemm (gemm GFLOP/s) | % of FMA peak: qkv / torch / ORT (peak GFLOP/s) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for threads, shape, causal, ms, qg, tg, og, gemm, peak in rows:
        ort_cell = f"{og:.1f}" if og else "—"
        ort_ratio = f"{qg / og:.2f}×" if og else "—"
        ort_peak = f"{100 * og / peak:.0f}%" if og else "—"
        print(f"| {threads} | {shape} | {'yes' if causal else 'no'} | {ms:.2f} | {qg:.1f} | {tg:.1f} | {ort_cell} "
              f"| {qg / tg:.2f}× | {ort_ratio} | {100 * qg / gemm:.0f}% ({gemm:.0f}) "
              f"| {100 * qg / peak:.0f}% / {100 * tg / peak:.0f}% / {ort_peak} ({peak:.0f}) |")


if __name__ == "__main__":
    main()
