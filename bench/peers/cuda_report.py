#!/usr/bin/env python3
"""qkv's CUDA attention beside PyTorch's flash SDPA: one Markdown table (issue 19).

    python3 bench/peers/cuda_report.py --qkv qkv_bench.json --torch torch_bench.json
    python3 bench/peers/cuda_report.py --backward --qkv qkv_backward.json --torch torch_backward.json

--qkv: attention_cuda_bench's `--benchmark_format=json` (or `--benchmark_out=`) output:
benchmarks named `BM_AttentionCuda/B:4/H:16/L:4096/D:128/causal:0[/...]` and
`BM_CublasGemmBf16/M:8192[/N:8192/K:8192][/...]` (N and K default to M), each with the
user counter TFLOPs.
With --benchmark_repetitions the "median" aggregate is taken, else the median of the
iteration rows of that name. Context keys read when present: gpu, cuda_driver,
cuda_runtime (benchmark::AddCustomContext; CUDA's integers, 13000, print as 13.0).
--torch: bench/peers/sdpa_cuda.py's JSON ({"context": ..., "rows": [...]}).

Columns: shape, causal, qkv TFLOP/s, torch flash TFLOP/s, qkv / torch, and each as a
percentage of the cuBLAS bf16 GEMM yardstick (qkv's BM_CublasGemmBf16 where it ran,
else torch.matmul's). Either file may be missing or broken (a step that failed on the
GPU machine): its columns then read "-". Both count causal FLOPs as the computed half.
--backward: the backward's files instead (attention_backward_cuda_bench's
BM_AttentionBackwardCuda, sdpa_cuda.py --backward's torch_sdpa_flash_backward rows;
FLOPs 2.5 times the forward's on both sides).
"""
import argparse
import json
import statistics
import sys

TARGET = 0.70  # issue 19: forward >= 70% of torch's flash SDPA at D = 128, L >= 4096
# (qkv benchmark family, torch row name) of each direction
KINDS = {"forward": ("BM_AttentionCuda", "torch_sdpa_flash"),
         "backward": ("BM_AttentionBackwardCuda", "torch_sdpa_flash_backward")}


def parse_name(name):
    """'BM_AttentionCuda/B:4/H:16/causal:0/manual_time' -> ('BM_AttentionCuda', {'B': 4, ...});
    segments without ':' (real_time, manual_time, min_time's) are ignored."""
    family, *parts = name.split("/")
    params = {}
    for part in parts:
        key, sep, value = part.partition(":")
        if sep and value.lstrip("-").isdigit():
            params[key] = int(value)
    return family, params


def attention_key(p):
    return (p["B"], p["H"], p["L"], p["D"], int(bool(p["causal"])))


def load_json(path, what):
    """The parsed file, or None with a note on stderr (a missing or truncated file)."""
    if not path:
        return None
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        print(f"cuda_report: no {what} results from {path}: {e}", file=sys.stderr)
        return None


def load_qkv(path, kind="forward"):
    """(context, {(B, H, L, D, causal): TFLOP/s}, {(M, N, K): TFLOP/s}) of attention_cuda_bench's JSON."""
    doc = load_json(path, "qkv")
    if doc is None:
        return {}, {}, {}
    samples, medians = {}, {}
    for bench in doc.get("benchmarks", []):
        if bench.get("error_occurred"):
            print(f"cuda_report: {bench.get('name')}: {bench.get('error_message')}", file=sys.stderr)
            continue
        value = bench.get("TFLOPs")
        run_name = bench.get("run_name", bench["name"])
        if value is None:
            continue
        if bench.get("run_type") == "aggregate":
            if bench.get("aggregate_name") == "median":
                medians[run_name] = value
        else:
            samples.setdefault(run_name, []).append(value)
    attention, gemm = {}, {}
    for run_name in dict.fromkeys([*samples, *medians]):
        value = medians.get(run_name, statistics.median(samples.get(run_name, [0.0])))
        family, p = parse_name(run_name)
        if family.startswith(KINDS[kind][0]) and {"B", "H", "L", "D", "causal"} <= p.keys():
            attention[attention_key(p)] = value
        elif family.startswith("BM_CublasGemmBf16") and "M" in p:  # N and K default to M (square)
            gemm[(p["M"], p.get("N", p["M"]), p.get("K", p["M"]))] = value
    return doc.get("context", {}), attention, gemm


def load_torch(path, kind="forward"):
    """(context, {(B, H, L, D, causal): TFLOP/s}, {(M, N, K): TFLOP/s}) of sdpa_cuda.py's JSON."""
    doc = load_json(path, "torch")
    if doc is None:
        return {}, {}, {}
    attention, gemm = {}, {}
    for row in doc.get("rows", []):
        if row.get("tflops") is None:
            print(f"cuda_report: torch {row}", file=sys.stderr)
        elif row["name"] == KINDS[kind][1]:
            attention[attention_key(row)] = row["tflops"]
        elif row["name"] == "torch_matmul_bf16":
            gemm[(row["M"], row["N"], row["K"])] = row["tflops"]
    return doc.get("context", {}), attention, gemm


def cuda_version(value):
    """CUDA's integer versions (cudaRuntimeGetVersion's 13000) as '13.0'; other text as it is."""
    if str(value).isdigit() and int(value) >= 1000:
        return f"{int(value) // 1000}.{int(value) % 1000 // 10}"
    return value


def header(qctx, tctx, cuda_runtime=None):
    """One line naming the GPU, driver, CUDA runtimes and torch version (what each side reported)."""
    gpu = qctx.get("gpu") or tctx.get("gpu") or "unknown GPU"
    extra = [f"cc {tctx['compute_capability']}"] if tctx.get("compute_capability") else []
    extra += [f"{tctx['multiprocessors']} SMs"] if tctx.get("multiprocessors") else []
    driver = tctx.get("driver") or "?"
    api = tctx.get("cuda_driver_api") or qctx.get("cuda_driver")
    qkv_rt = cuda_version(qctx.get("cuda_runtime") or cuda_runtime or "?")
    return (f"GPU: {gpu}{' (' + ', '.join(extra) + ')' if extra else ''}; driver {driver}"
            f"{f' (CUDA {cuda_version(api)})' if api else ''}; "
            f"CUDA runtime: qkv {qkv_rt}, torch {tctx.get('torch_cuda_runtime', '?')}; "
            f"torch {tctx.get('torch', '?')}")


def fmt(x, spec=".1f", suffix=""):
    return "-" if x is None else f"{x:{spec}}{suffix}"


def rows(qatt, tatt, yardstick):
    """Per shape (qkv's order, then torch-only ones): (key, qkv, torch, ratio, qkv %, torch %)."""
    out = []
    for key in dict.fromkeys([*qatt, *tatt]):
        q, t = qatt.get(key), tatt.get(key)
        ratio = q / t if q is not None and t else None
        pct = [100 * x / yardstick if x is not None and yardstick else None for x in (q, t)]
        out.append((key, q, t, ratio, *pct))
    return out


def yardstick(qgemm, tgemm):
    """(TFLOP/s, label) of the GEMM the percentages use: qkv's cuBLAS, else torch.matmul's."""
    for gemm, who in ((qgemm, "qkv BM_CublasGemmBf16"), (tgemm, "torch.matmul")):
        if gemm:
            (m, n, k), value = max(gemm.items())
            return value, f"{who} {m}x{n}x{k}"
    return None, "none"


def report(qkv_path, torch_path, cuda_runtime=None, kind="forward"):
    qctx, qatt, qgemm = load_qkv(qkv_path, kind)
    tctx, tatt, tgemm = load_torch(torch_path, kind)
    gemm, label = yardstick(qgemm, tgemm)
    lines = [header(qctx, tctx, cuda_runtime), "",
             f"bf16 {kind}, TFLOP/s (causal counted as the computed half); yardstick: cuBLAS bf16 GEMM "
             + ", ".join([f"{v:.1f} (qkv {m}x{n}x{k})" for (m, n, k), v in qgemm.items()]
                         + [f"{v:.1f} (torch.matmul {m}x{n}x{k})" for (m, n, k), v in tgemm.items()] or ["-"])
             + f"; percentages of {label}", "",
             "| B, H, L, D | causal | qkv TFLOP/s | torch flash TFLOP/s | qkv / torch | qkv % GEMM | torch % GEMM |",
             "|---|---|---|---|---|---|---|"]
    table = rows(qatt, tatt, gemm)
    for (b, h, length, d, causal), q, t, ratio, qpct, tpct in table:
        lines.append(f"| {b}, {h}, {length}, {d} | {causal} | {fmt(q)} | {fmt(t)} | {fmt(ratio, '.2f')} | "
                     f"{fmt(qpct, '.0f', '%')} | {fmt(tpct, '.0f', '%')} |")
    shapes = [r[3] for r in table if r[0][3] == 128 and r[0][2] >= 4096]
    goal = [x for x in shapes if x is not None]
    lines += ["", f"qkv / torch at D = 128, L >= 4096: min {min(goal):.2f} over {len(goal)} of {len(shapes)} rows "
              + (f"(target >= {TARGET:.2f}: {'met' if min(goal) >= TARGET and len(goal) == len(shapes) else 'not met'})"
                 if kind == "forward" else "(issue 19's target is the forward's)")
              if goal else "qkv / torch at D = 128, L >= 4096: no pair of results"]
    return "\n".join(lines) + "\n"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--qkv", help="attention_cuda_bench's JSON")
    ap.add_argument("--torch", help="sdpa_cuda.py's JSON")
    ap.add_argument("--cuda-runtime", help="qkv's CUDA runtime where its JSON does not say (e.g. 13.0)")
    ap.add_argument("--out", help="also write the table here")
    ap.add_argument("--backward", action="store_true", help="the backward's files (attention_backward_cuda_bench)")
    a = ap.parse_args(argv)
    text = report(a.qkv, a.torch, a.cuda_runtime, "backward" if a.backward else "forward")
    sys.stdout.write(text)
    if a.out:
        with open(a.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
