"""Fits a time-per-step model of qkv's distributed attention to dist_bench runs on 1-4 ranks
and extrapolates it to 8-1024 ranks on 100 and 400 Gb/s networks (docs/distributed.md).

    for p in 1 2 3 4; do
      QKV_NUM_THREADS=$(( p == 1 ? 2 : 1 )) mpiexec --bind-to none -n $p build/release/dist_bench \\
          --benchmark_format=json > /tmp/dist_$p.json
    done
    python3 bench/peers/dist_model.py /tmp/dist_[1-4].json

(--bind-to none: Open MPI binds each rank to one core by default, so one rank with two
threads would run both on one core.)

The model (per attention step, B = 1, f32; F = 4 L^2 D H flops, half when causal):
  compute  c(P) = F / (P * R * s(P)),  R: one core's attention rate, s(P) = min(threads, cores / P)
           cores per rank (ranks beyond the cores share them)
  ring     T = P * max(c / P, alpha + 2 b / P / beta)   b = L D H * 4 bytes (K or V, whole sequence)
           (each of the P steps computes one block while the next K/V block is in flight)
  ulysses  T = c + 4 (alpha (P - 1) + b / P * (P - 1) / P / beta)   (q, k, v and output all-to-alls)
  heads    T = max(F ceil(H/P) / (H R t), F / (R min(P t, cores))) + 2 (P - 1) (alpha + b / P / beta)
           (the busiest rank's heads, or all heads over the shared cores; ring all-reduce of [L, H D])
  ring on more ranks than cores: + P sigma (each step waits for a descheduled neighbour)
R, alpha and beta are fitted to the measurements (least squares on relative error); the
extrapolation keeps the fitted R per core and takes alpha and beta from the network.
"""

import argparse
import itertools
import json
import math
import re
import sys

from timing import machine_of_benchmark

CORES = 2  # this VM; the measured ranks share them
B, H, D, BYTES = 1, 8, 64, 4  # dist_bench's shapes


def load(paths):
    rows = []
    for path in paths:
        with open(path) as f:
            doc = json.load(f)
        ranks = int(doc["context"]["ranks"])
        threads = int(doc["context"]["qkv_num_threads"])
        for b in doc["benchmarks"]:
            m = re.match(r"BM_(\w+)/(\d+)(?:/(\d))?/", b["name"])
            scheme, length, causal = m.group(1), int(m.group(2)), m.group(3) == "1"
            seconds = b["real_time"] / {"ms": 1e3, "s": 1.0, "us": 1e6}[b["time_unit"]]
            rows.append(dict(scheme=scheme, L=length, causal=causal, P=ranks, threads=threads, seconds=seconds,
                             machine=machine_of_benchmark(doc["context"])))
    return rows


def flops(length, heads, d, causal):
    return 4.0 * length * length * d * heads * B * (0.5 if causal else 1.0)


def predict(row, rate, alpha, beta, heads=H, d=D, cores=CORES, sigma=0.0):
    p, length = row["P"], row["L"]
    share = min(row["threads"], cores / p)
    f = flops(length, heads, d, row["causal"])
    c = f / (p * rate * share)
    b = length * d * heads * BYTES
    scheme = row["scheme"]
    if scheme == "RingComputeOnly":
        return c
    if scheme == "Ring":  # sigma: a step's wait for a descheduled neighbour when ranks outnumber cores
        return c if p == 1 else p * max(c / p, alpha + 2 * b / p / beta) + (p * sigma if p > cores else 0.0)
    if scheme == "Ulysses":
        return c + (0 if p == 1 else 4 * (alpha * (p - 1) + b / p * (p - 1) / p / beta))
    if scheme == "Heads":  # the busiest rank's ceil(H/P) heads, or all the work over the cores they share
        busiest = f * math.ceil(heads / p) / heads / (rate * row["threads"])
        work = max(busiest, f / (rate * min(p * row["threads"], cores)))
        return work + (0 if p == 1 else 2 * (p - 1) * (alpha + b / p / beta))
    raise ValueError(scheme)


def fit(rows):
    """(rate, alpha, beta, sigma): a grid search on relative error, then sigma with those fixed,
    then the first three again with that sigma."""
    def err(rate, alpha, beta, sigma):
        return sum((predict(r, rate, alpha, beta, sigma=sigma) / r["seconds"] - 1) ** 2 for r in rows)

    rates = [r * 1e9 for r in range(20, 201)]
    alphas = [10 ** (e / 2) for e in range(-12, -3)]        # 1 us .. 3 ms
    betas = [2 ** (e / 2) * 1e9 for e in range(-4, 13)]    # 0.25 .. 64 GB/s
    sigmas = [s * 1e-3 for s in (0, 1, 2, 3, 5, 8, 13, 20)]
    sigma = 0.0
    for _ in range(2):
        rate, alpha, beta = min(itertools.product(rates, alphas, betas), key=lambda x: err(*x, sigma))
        sigma = min(sigmas, key=lambda s_: err(rate, alpha, beta, s_))
    return rate, alpha, beta, sigma


def validation_table(rows, rate, alpha, beta, sigma):
    out = ["| scheme | P | threads | L | causal | measured s | model s | error |", "|---|---|---|---|---|---|---|---|"]
    worst = 0.0
    for r in sorted(rows, key=lambda r: (r["scheme"], r["L"], r["causal"], r["P"])):
        m = predict(r, rate, alpha, beta, sigma=sigma)
        e = m / r["seconds"] - 1
        worst = max(worst, abs(e))
        out.append(f"| {r['scheme']} | {r['P']} | {r['threads']} | {r['L']} | {r['causal']} | {r['seconds']:.3f} | "
                   f"{m:.3f} | {e:+.1%} |")
    return out, worst


def extrapolation(rate_per_rank, gbit, heads=32, d=128):
    """Time per step (s) of each scheme at P ranks (one rank = `rate_per_rank` FLOP/s)."""
    beta, alpha = gbit / 8 * 1e9, 5e-6
    out = ["| L | P | ring s | ring hidden | ulysses s | heads s | best |", "|---|---|---|---|---|---|---|"]
    for length in (131072, 1048576, 4194304):
        for p in (8, 32, 128, 1024):
            row = dict(P=p, L=length, causal=False, threads=1)
            r = predict(dict(row, scheme="Ring"), rate_per_rank, alpha, beta, heads, d, cores=p)
            c = flops(length, heads, d, False) / (p * rate_per_rank)
            hidden = c / p >= alpha + 2 * length * d * heads * BYTES / p / beta
            u = predict(dict(row, scheme="Ulysses"), rate_per_rank, alpha, beta, heads, d, cores=p) if p <= heads else None
            h = predict(dict(row, scheme="Heads"), rate_per_rank, alpha, beta, heads, d, cores=p) if p <= heads else None
            cands = {"ring": r, "ulysses": u, "heads": h}
            best = min((v, k) for k, v in cands.items() if v is not None)[1]
            fmt = lambda v: "-" if v is None else f"{v:.3g}"  # noqa: E731
            out.append(f"| {length} | {p} | {fmt(r)} | {'yes' if hidden else 'no'} | {fmt(u)} | {fmt(h)} | {best} |")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="dist_bench --benchmark_format=json outputs, one per rank count")
    args = ap.parse_args()
    rows = load(args.runs)
    rate, alpha, beta, sigma = fit(rows)
    print(f"Machine: {rows[0]['machine']}; {CORES} cores")
    print(f"fitted: R = {rate / 1e9:.0f} GFLOP/s per core, alpha = {alpha * 1e6:.0f} us, "
          f"beta = {beta / 1e9:.1f} GB/s (loopback), sigma = {sigma * 1e3:.0f} ms per ring step beyond the cores\n")
    table, worst = validation_table(rows, rate, alpha, beta, sigma)
    print("\n".join(table))
    print(f"\nworst model error: {worst:.1%}\n")
    for name, per_rank in (("a rank of this VM's two cores", 2 * rate), ("a GPU-class rank (400 TFLOP/s)", 400e12)):
        for gbit in (100, 400):
            print(f"### {name}, {gbit} Gb/s, H = 32, D = 128, non-causal\n")
            print("\n".join(extrapolation(per_rank, gbit)))
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
