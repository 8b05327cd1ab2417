"""Times numpy.einsum(optimize=True) and torch.einsum on the cases of
bench/einsum_bench.cc, runs that program (qkv::einsum and qkv::gemm) in the same
invocation with the same thread count, and prints one markdown table.

    /work/fixenv/bin/python bench/peers/einsum_peers.py build/release/einsum_bench [--threads N]

Every timing is the best of several runs (the machine may be shared); GFLOP/s use
the flop count of bench/einsum_bench.cc (2 x multiply-adds of the optimized path).
"""
import argparse
import json
import os
import subprocess
import sys

from timing import best_seconds, machine_of_benchmark


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--threads", type=int, default=os.cpu_count())
    parser.add_argument("--min-time", type=float, default=1.0)
    parser.add_argument("--repetitions", type=int, default=3, help="rounds over all cases")
    return parser.parse_args()


ARGS = parse_args()
for var in ["OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "QKV_NUM_THREADS"]:
    os.environ[var] = str(ARGS.threads)  # before numpy / torch are imported

import numpy as np  # noqa: E402
import torch  # noqa: E402

B, H, L, D, E = 8, 12, 512, 64, 768
# name -> (equation, shapes); keep in step with einsum_bench.cc.
CASES = {
    "scores_bhid_bhjd": ("b h i d, b h j d -> b h i j", [(B, H, L, D), (B, H, L, D)]),
    "values_bhij_bhjd": ("b h i j, b h j d -> b h i d", [(B, H, L, L), (B, H, L, D)]),
    "seed000_bid_bjd": ("b i d, b j d -> b i j", [(B, L, E), (B, L, E)]),
    "scores_unpermuted_k": ("bhid,bjhd->bhij", [(B, H, L, D), (B, L, H, D)]),
    "keras_proj_abc_cde": ("abc,cde->abde", [(B, L, E), (E, H, D)]),
    "keras_scores_aecd_abcd": ("aecd,abcd->acbe", [(B, L, H, D), (B, L, H, D)]),
    "keras_values_acbe_aecd": ("acbe,aecd->abcd", [(B, H, L, L), (B, L, H, D)]),
    "keras_out_abcd_cde": ("abcd,cde->abe", [(B, L, H, D), (H, D, E)]),
    "keras_dense_abc_cd": ("abc,cd->abd", [(B, L, E), (E, E)]),
    "chain_ea_fb_abcd_gc_hd": ("ea,fb,abcd,gc,hd->efgh", [(48, 48)] * 2 + [(48, 48, 48, 48)] + [(48, 48)] * 2),
    # float64 (numpy's default dtype): names starting "f64_" run in float64 everywhere.
    "f64_seed000_bid_bjd": ("b i d, b j d -> b i j", [(B, L, E), (B, L, E)]),
    "f64_keras_proj_abc_cde": ("abc,cde->abde", [(B, L, E), (E, H, D)]),
    "f64_scores_bhid_bhjd": ("b h i d, b h j d -> b h i j", [(B, H, L, D), (B, H, L, D)]),
}


def cpp_times(name):
    """Best einsum and gemm seconds of one case, its flop count and the machine line, from einsum_bench."""
    cmd = [ARGS.binary, f"--benchmark_min_time={ARGS.min_time / 2}", "--benchmark_format=json",
           f"--benchmark_filter=^(einsum|gemm)/{name}/"]
    out = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
    best, flops = {}, 0.0
    for b in out["benchmarks"]:
        kind = b["name"].split("/")[0]
        seconds = b["real_time"] / 1e3  # kMillisecond
        best[kind] = min(best.get(kind, 1e30), seconds)
        if kind == "einsum":
            flops = b["flops"] * seconds  # rate * time = flop count
    return best, flops, machine_of_benchmark(out["context"])


def keep_best(table, key, value):
    table[key] = min(table.get(key, value), value)


def main():
    torch.set_num_threads(ARGS.threads)
    rng = np.random.default_rng(0)
    best, flops = {}, {}
    # Rounds over every case, each implementation back to back per case, so that a
    # change of load on a shared machine hits all of them alike; best of the rounds.
    for _ in range(ARGS.repetitions):
        for name, (eq, shapes) in CASES.items():
            cpp, flops[name], machine = cpp_times(name)
            for kind, seconds in cpp.items():
                keep_best(best, (kind, name), seconds)
            dtype = np.float64 if name.startswith("f64_") else np.float32
            ops = [rng.standard_normal(s, dtype=dtype) for s in shapes]
            tops = [torch.from_numpy(o) for o in ops]
            keep_best(best, ("numpy", name), best_seconds(lambda: np.einsum(eq, *ops, optimize=True), ARGS.min_time,
                                                          min_runs=3))
            keep_best(best, ("torch", name), best_seconds(lambda: torch.einsum(eq.replace(" ", ""), *tops),
                                                          ARGS.min_time, min_runs=3))
    rows = [(name, eq, best[("einsum", name)], best.get(("gemm", name)), best[("numpy", name)],
             best[("torch", name)], flops[name]) for name, (eq, _) in CASES.items()]
    print(f"Machine: {machine}; {ARGS.threads} threads; numpy {np.__version__} (einsum optimize=True), torch {torch.__version__}; "
          f"float32 (float64 for f64_ cases); best of runs; GFLOP/s = 2 x multiply-adds / s\n")
    print("| case | equation | qkv einsum GFLOP/s | qkv::gemm GFLOP/s | einsum / gemm | numpy GFLOP/s | "
          "torch GFLOP/s | qkv / numpy | qkv / torch |")
    print("|" + "---|" * 9)
    for name, eq, t_q, t_g, t_np, t_torch, f in rows:
        g = f"{f / t_g / 1e9:.1f}" if t_g else ""
        ratio_g = f"{t_g / t_q:.0%}" if t_g else ""
        print(f"| {name} | `{eq}` | {f / t_q / 1e9:.1f} | {g} | {ratio_g} | {f / t_np / 1e9:.1f} | "
              f"{f / t_torch / 1e9:.1f} | {t_np / t_q:.1f}x | {t_torch / t_q:.2f}x |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
