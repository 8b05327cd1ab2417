"""Times numpy's transpose().copy() on the shapes of bench/einops_bench.cc, runs that
program (qkv rearrange + memcpy) in the same run, and prints one markdown table.

    python bench/peers/einops_numpy.py build/release/einops_bench [--min-time 0.05] [--repetitions 10]

numpy's copy is single-threaded; qkv is reported on 1 thread and on every core.
GB/s counts bytes read + written (2 x the tensor size), as the C++ program does.
"""
import argparse
import json
import os
import subprocess
import sys

from timing import best_seconds, machine_of_benchmark

import numpy as np

# name -> (pattern, shape, shape before the transpose, permutation); keep in step with einops_bench.cc.
CASES = {
    "seed000_merge_heads": ("b h t d -> b t (h d)", (8, 16, 2048, 64), (8, 16, 2048, 64), (0, 2, 1, 3)),
    "seed000_split_heads": ("b t (d k h) -> k b h t d", (6, 2048, 1536), (6, 2048, 64, 3, 8), (3, 0, 4, 1, 2)),
    "seed004_to_batch_heads": ("batch seq heads eachhead -> (batch heads) seq eachhead", (8, 2048, 16, 64),
                               (8, 2048, 16, 64), (0, 2, 1, 3)),
    "seed004_from_batch_heads": ("(batch heads) numq eachhead -> batch numq (heads eachhead)", (128, 2048, 64),
                                 (8, 16, 2048, 64), (0, 2, 1, 3)),
    "4d_reverse": ("a b c d -> d c b a", (64, 64, 64, 64), (64, 64, 64, 64), (3, 2, 1, 0)),
    "4d_swap_middle": ("a b c d -> a c b d", (16, 256, 64, 64), (16, 256, 64, 64), (0, 2, 1, 3)),
    "4d_last_to_front": ("a b c d -> d a b c", (8, 64, 512, 64), (8, 64, 512, 64), (3, 0, 1, 2)),
    "5d_reverse": ("a b c d e -> e d c b a", (16, 16, 16, 16, 256), (16, 16, 16, 16, 256), (4, 3, 2, 1, 0)),
    "5d_mixed": ("a b c d e -> a c e b d", (16, 32, 16, 64, 32), (16, 32, 16, 64, 32), (0, 2, 4, 1, 3)),
}


def best_rate(fn, nbytes, min_time):
    """Best of repeated runs (at least 3, at least min_time seconds) in GB/s of 2 * nbytes."""
    return 2 * nbytes / best_seconds(fn, min_time, min_runs=3, warm_up=False) / 1e9


def numpy_rates(min_time):
    rng = np.random.default_rng(1)
    out = {}
    x = rng.random(1 << 24, dtype=np.float32)
    out["memcpy"] = best_rate(lambda: x.copy(), x.nbytes, min_time)
    for name, (_, shape, init, perm) in CASES.items():
        x = rng.random(shape, dtype=np.float32)
        out[name] = best_rate(lambda: x.reshape(init).transpose(perm).copy(), x.nbytes, min_time)
    return out


def cpp_rates(binary, min_time, repetitions):
    """Best repetition per benchmark (numpy's side is also the best of several runs)."""
    result = subprocess.run([binary, f"--benchmark_min_time={min_time}", f"--benchmark_repetitions={repetitions}",
                             "--benchmark_format=json"], capture_output=True, text=True, check=True)
    doc = json.loads(result.stdout)
    rates = {"machine": machine_of_benchmark(doc["context"])}
    for b in doc["benchmarks"]:
        if b.get("run_type") != "iteration":
            continue
        parts = b["name"].split("/")  # BM_Memcpy/<threads>/real_time, BM_Rearrange/<case>/<threads>/real_time
        key = ("memcpy", int(parts[1])) if parts[0] == "BM_Memcpy" else (parts[1], int(parts[2]))
        rates[key] = max(rates.get(key, 0.0), b["bytes"] / 1e9)
    return rates


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("binary")
    parser.add_argument("--min-time", type=float, default=0.05, help="seconds per repetition (C++) / per case (numpy)")
    parser.add_argument("--repetitions", type=int, default=10)
    args = parser.parse_args()
    load = os.getloadavg()[0]
    cpp = cpp_rates(args.binary, args.min_time, args.repetitions)
    npy = numpy_rates(args.min_time * args.repetitions)
    machine = cpp.pop("machine")
    threads = sorted({t for _, t in cpp})
    many = threads[-1]
    print(f"Machine: {machine}; numpy {np.__version__}, {os.cpu_count()} cores, load average {load:.1f} at the start; "
          "GB/s = (bytes read + written) / s, best repetition\n")
    head = ("| case | pattern | shape | qkv 1 thr | qkv {m} thr | memcpy 1 thr | memcpy {m} thr | numpy | "
            "qkv / memcpy | qkv / numpy |")
    print(head.format(m=many))
    print("|" + "---|" * 10)
    mem = max(cpp[("memcpy", 1)], cpp[("memcpy", many)])
    print(f"| memcpy | | 64 MB | | | {cpp[('memcpy', 1)]:.1f} | {cpp[('memcpy', many)]:.1f} | {npy['memcpy']:.1f} | | |")
    for name, (pattern, shape, _, _) in CASES.items():
        q1, qn = cpp[(name, 1)], cpp[(name, many)]
        best = max(q1, qn)
        print(f"| {name} | `{pattern}` | {list(shape)} | {q1:.1f} | {qn:.1f} | {cpp[('memcpy', 1)]:.1f} | "
              f"{cpp[('memcpy', many)]:.1f} | {npy[name]:.1f} | {best / mem:.0%} | {best / npy[name]:.1f}x |")
    print("\nqkv / memcpy: qkv's better thread count over memcpy's better thread count; "
          "qkv / numpy: qkv's better thread count over numpy (one thread).")
    return 0


if __name__ == "__main__":
    sys.exit(main())
