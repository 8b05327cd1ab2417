#!/usr/bin/env python3
"""qkv's fused CPU attention per dtype beside PyTorch SDPA in the same dtype (issue 14).

One invocation prints one Markdown table whose header names the machine (`qkv info`): the
CPU model, its AVX-512 / AMX flags from /proc/cpuinfo, Highway's target and oneDNN's ISA.
Per thread count, dtype (float32, bfloat16, float16, float32 with matmul_precision "medium", float32
with the int8 Q K^T (qk_quantization "int8", P V in float32 or, with "medium", in bf16);
float64 with --f64) and shape it times, in
this order: qkv (`qkv bench attention --dtype D --json`, a subprocess with
QKV_NUM_THREADS set) and PyTorch `F.scaled_dot_product_attention` on tensors of that
dtype (torch.set_num_threads; the int8-QK rows: torch float32 with the same
matmul precision, as torch has no int8 SDPA); and per dtype qkv::gemm's rate on 2048^3
operands of that dtype as the yardstick (16-bit operands: float32 C; the int8-QK rows: the
P V tiles' dtype, with the int8 gemm's GOP/s beside it).

    .venv-fixtures/bin/python bench/peers/precision_peers.py --qkv build/release/bin/qkv --threads 2

GFLOP/s = 4*B*H*L*L*D / time (non-causal) and 4*B*H*D*L(L+1)/2 / time (causal: the
unmasked half, the same count for both). Each time is the fastest call after one
warm-up call, calls repeated for at least --min-time seconds.
"""
import argparse
import os
import sys

from attention_peers import SHAPES, flops, run_qkv_cmd
from timing import best_seconds, machine_of_cli

# (row label, dtype, matmul_precision, qk_quantization): qkv's f32 "medium" runs bf16 tiles,
# "int8" the int8 Q K^T (qkv/attention.h); torch gets torch.set_float32_matmul_precision with
# the same name.
DTYPES = [("float32", "float32", "highest", "none"), ("bfloat16", "bfloat16", "highest", "none"),
          ("float16", "float16", "highest", "none"), ("float32 medium", "float32", "medium", "none"),
          ("int8-QK fused", "float32", "highest", "int8"), ("int8-QK fused, bf16 PV", "float32", "medium", "int8")]


def machine(qkv):
    """The table's header line: timing.machine_of_cli (`qkv info --json`)."""
    return machine_of_cli(qkv)


def run_torch(threads, shape, causal, dtype, min_time, precision="highest"):
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)
    torch.set_float32_matmul_precision(precision)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g).to(getattr(torch, dtype)) for _ in range(3))
    with torch.inference_mode():
        return best_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), min_time)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qkv", default="build/release/bin/qkv", help="the qkv CLI")
    ap.add_argument("--threads", default="2", help="comma list, e.g. 1,2")
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--shapes", default="", help="B,H,L,D;B,H,L,D (default: the issue-6 four)")
    ap.add_argument("--f64", action="store_true", help="also float64 (qkv and torch)")
    ap.add_argument("--rows", default="", help="row labels to run, ';'-separated (default: all; float32 first)")
    a = ap.parse_args()
    shapes = [tuple(map(int, s.split(","))) for s in a.shapes.split(";")] if a.shapes else SHAPES
    dtypes = DTYPES + ([("float64", "float64", "highest", "none")] if a.f64 else [])
    if a.rows:
        dtypes = [d for d in dtypes if d[0] in a.rows.split(";")]
    import torch

    header = machine(a.qkv)
    print(f"torch {torch.__version__}, load {os.getloadavg()}", file=sys.stderr)
    rows = []
    for threads in map(int, a.threads.split(",")):
        f32 = {}
        for label, dtype, precision, qk in dtypes:
            gemm_dtype = "bfloat16" if precision == "medium" else dtype  # the tiles' operand type
            qk_args = ["--qk-quantization", qk]
            gemm = run_qkv_cmd(a.qkv, threads, None, False, a.min_time, gemm_n=2048, dtype=gemm_dtype)[0]["gflops"]
            int8_gemm = ""
            if qk != "none":  # its second line: the int8 gemm (qkv bench attention --qk-quantization)
                gops = run_qkv_cmd(a.qkv, threads, None, False, a.min_time, gemm_n=2048, extra=qk_args)[1]["gflops"]
                int8_gemm = f"; int8 {gops:.0f} GOP/s"
            for shape in shapes:
                for causal in (False, True):
                    fl = flops(*shape, causal)
                    q = run_qkv_cmd(a.qkv, threads, shape, causal, a.min_time, dtype=dtype,
                                    extra=["--matmul-precision", precision, *qk_args])[0]
                    t = run_torch(threads, shape, causal, dtype, a.min_time, precision)
                    if label == "float32":
                        f32[(shape, causal)] = q["gflops"]
                    rows.append((threads, label, shape, causal, q["ms"], q["gflops"], fl / t / 1e9, gemm,
                                 q["gflops"] / f32[(shape, causal)], int8_gemm))
                    print(f"done {threads} {label} {shape} {causal}", file=sys.stderr, flush=True)
    print(f"Machine: {header}\n")
    print("| threads | dtype | (B, H, L, D) | causal | qkv ms | qkv GFLOP/s | torch GFLOP/s | qkv / torch "
          "| qkv / qkv f32 | qkv % of gemm (gemm GFLOP/s, same dtype) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for threads, dtype, shape, causal, ms, qg, tg, gemm, vs_f32, int8_gemm in rows:
        print(f"| {threads} | {dtype} | {shape} | {'yes' if causal else 'no'} | {ms:.2f} | {qg:.1f} | {tg:.1f} "
              f"| {qg / tg:.2f}× | {vs_f32:.2f}× | {100 * qg / gemm:.0f}% ({gemm:.0f}{int8_gemm}) |")


if __name__ == "__main__":
    main()
