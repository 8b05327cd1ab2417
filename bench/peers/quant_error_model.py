#!/usr/bin/env python3
"""The output error that dynamic int8 quantization of an MHA layer's projections costs, by itself.

A float64 numpy model of the arithmetic `qkv.nn.quantize_dynamic` specifies (docs/nn_quantization.md):
weights int8 per output channel and activations int8 per token, symmetric, scale = max|row| / 127,
rounded half to even, products exact; attention in float64. No qkv code runs: this is the error
of the quantization scheme alone, against which the measured error of the layer
(`quant_peers.py`) is read. Weights as `torch.nn.MultiheadAttention` initialises them (in_proj
xavier-uniform over [3E, E], out_proj uniform(±1/sqrt(E))), inputs standard normal; the error is
||y_int8 - y|| / ||y|| over the whole output, with all four roundings and with each alone.

    .venv/bin/python bench/peers/quant_error_model.py [--B 2 --L 512 --E 768 --H 12 --seeds 3]
"""
import argparse

import numpy as np


def rows_int8(x):
    """x rounded to int8 per row (last axis), symmetric max-abs scale, back in float64."""
    s = np.abs(x).max(-1, keepdims=True) / 127
    return np.round(x / np.where(s > 0, s, 1)) * s


def mha(x, w_in, w_out, heads, rounded):
    """Self-attention forward; `rounded` names the operands rounded to int8: x, w_in, a, w_out."""
    b, length, e = x.shape
    d = e // heads
    pick = {n: (rows_int8(t) if n in rounded else t) for n, t in (("x", x), ("w_in", w_in), ("w_out", w_out))}
    q, k, v = (t.reshape(b, length, heads, d).transpose(0, 2, 1, 3)
               for t in np.split(pick["x"] @ pick["w_in"].T, 3, -1))
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    a = (p @ v).transpose(0, 2, 1, 3).reshape(b, length, e)
    return (rows_int8(a) if "a" in rounded else a) @ pick["w_out"].T


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name, default in (("B", 2), ("L", 512), ("E", 768), ("H", 12), ("seeds", 3)):
        ap.add_argument(f"--{name}", type=int, default=default)
    a = ap.parse_args()
    cases = {"all four": ("x", "w_in", "a", "w_out"), "x alone": ("x",), "w_in alone": ("w_in",),
             "a (out_proj's input) alone": ("a",), "w_out alone": ("w_out",)}
    errs = {c: [] for c in cases}
    for seed in range(a.seeds):
        rng = np.random.default_rng(seed)
        lim = np.sqrt(6 / (a.E + 3 * a.E))
        w_in = rng.uniform(-lim, lim, (3 * a.E, a.E))
        w_out = rng.uniform(-1 / np.sqrt(a.E), 1 / np.sqrt(a.E), (a.E, a.E))
        x = rng.standard_normal((a.B, a.L, a.E))
        ref = mha(x, w_in, w_out, a.H, ())
        for c, rounded in cases.items():
            y = mha(x, w_in, w_out, a.H, rounded)
            errs[c].append(np.linalg.norm(y - ref) / np.linalg.norm(ref))
    print(f"(B, L, E, H) = ({a.B}, {a.L}, {a.E}, {a.H}), {a.seeds} seeds: relative error of the output")
    print("| rounded to int8 | mean | min | max |\n|---|---|---|---|")
    for c, e in errs.items():
        print(f"| {c} | {np.mean(e):.3e} | {np.min(e):.3e} | {np.max(e):.3e} |")


if __name__ == "__main__":
    main()
