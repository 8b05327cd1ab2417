#!/usr/bin/env python3
"""float32 attention accuracy: qkv's fused CPU forward and PyTorch SDPA against float64.

Both run on the same float32 q, k, v (standard normal, [1, H, L, D], scale 1/sqrt(D)); the
oracle is numpy float64 (scores, softmax and P V in float64 on the float32 inputs). Per
(L, D, causal) the errors are averaged over --seeds seeds: max |got - ref| / max |ref| and
RMS(got - ref) / RMS(ref), with the qkv/torch ratio of each (docs/attention-cpu.md, "float32
accuracy").

    PYTHONPATH=<dir holding the qkv package> .venv-fixtures/bin/python bench/peers/accuracy_peers.py

--scores prints instead the error of Q K^T alone (an [256, 256] product, per D) for qkv
(qkv.einsum, the same qkv::gemm as the attention tiles), torch and numpy, beside float32
summations emulated in numpy: one fused multiply-add chain over all of D, and chains over
blocks of 64 / 128 / 256 summed afterwards. Errors are RMS |S - S64| / sqrt(D) (the scaled
scores' error).

--backward prints the gradients' errors instead: dq, dk, dv of qkv's fused backward (from its
forward's output and logsumexp) and of torch autograd through SDPA, for one float32 dO
(standard normal), against numpy float64 (FlashAttention-2's formulas on the float32 inputs).
"""
import argparse

import numpy as np


def oracle(q, k, v, causal):
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    s = np.einsum("bhid,bhjd->bhij", q, k) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p / p.sum(-1, keepdims=True)) @ v


def oracle_backward(q, k, v, do, causal):
    """(dq, dk, dv) in float64: dV = P^T dO, dS = P o (dO V^T - rowsum(dO o O)), dQ = c dS K, dK = c dS^T Q."""
    q, k, v, do = (x.astype(np.float64) for x in (q, k, v, do))
    c = 1.0 / np.sqrt(q.shape[-1])
    s = np.einsum("bhid,bhjd->bhij", q, k) * c
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = p @ v
    ds = p * (do @ np.swapaxes(v, -1, -2) - (do * o).sum(-1, keepdims=True))
    return c * ds @ k, c * np.swapaxes(ds, -1, -2) @ q, np.swapaxes(p, -1, -2) @ do


def errors(got, ref):
    d = np.asarray(got, np.float64) - ref
    return float(np.abs(d).max() / np.abs(ref).max()), float(np.sqrt((d * d).mean() / (ref * ref).mean()))


def cases(a, arrays):
    """(L, D, causal, inputs): inputs holds, per seed, `arrays` standard-normal float32 [1, H, L, D]."""
    for L in map(int, a.L.split(",")):
        for D in map(int, a.D.split(",")):
            for causal in map(int, a.causal.split(",")):
                inputs = []
                for seed in range(a.seeds):
                    rng = np.random.default_rng(1000 * seed + D + L)
                    inputs.append(tuple(rng.standard_normal((1, a.H, L, D)).astype(np.float32) for _ in range(arrays)))
                yield L, D, causal, inputs


def cells(mq, mt):
    """qkv's and torch's (max, RMS) errors and their ratios, as table cells."""
    return (f"{mq[0]:.2e} | {mt[0]:.2e} | {mq[0] / mt[0]:.2f} | "
            f"{mq[1]:.2e} | {mt[1]:.2e} | {mq[1] / mt[1]:.2f} |")


def attention_table(a, qkv, torch):
    print("| L | D | causal | qkv max | torch max | ratio | qkv RMS | torch RMS | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for L, D, causal, inputs in cases(a, 3):
        eq, et = [], []
        for q, k, v in inputs:
            ref = oracle(q, k, v, causal)
            eq.append(errors(qkv.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)), ref))
            with torch.no_grad():
                t = torch.nn.functional.scaled_dot_product_attention(
                    *(torch.from_numpy(x) for x in (q, k, v)), is_causal=bool(causal))
            et.append(errors(t.numpy(), ref))
        print(f"| {L} | {D} | {causal} | " + cells(np.mean(eq, 0), np.mean(et, 0)), flush=True)


def backward_table(a, qkv, torch):
    print("| L | D | causal | gradient | qkv max | torch max | ratio | qkv RMS | torch RMS | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for L, D, causal, inputs in cases(a, 4):
        eq, et = [], []
        for q, k, v, do in inputs:
            ref = oracle_backward(q, k, v, do, causal)
            out, lse = qkv.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), return_logsumexp=True)
            got = qkv.scaled_dot_product_attention_backward(q, k, v, out, do, lse, is_causal=bool(causal))
            eq.append([errors(g, r) for g, r in zip(got, ref)])
            t = [torch.from_numpy(x).requires_grad_() for x in (q, k, v)]
            torch.nn.functional.scaled_dot_product_attention(*t, is_causal=bool(causal)).backward(torch.from_numpy(do))
            et.append([errors(x.grad.numpy(), r) for x, r in zip(t, ref)])
        mq, mt = np.mean(eq, 0), np.mean(et, 0)  # [gradient, (max, RMS)]
        for g, name in enumerate(("dq", "dk", "dv")):
            print(f"| {L} | {D} | {causal} | {name} | " + cells(mq[g], mt[g]), flush=True)


def chained(q, k, block):
    """Q K^T in float32: a fused multiply-add chain over each block of D, blocks summed after."""
    total = np.zeros((q.shape[0], k.shape[0]), np.float32)
    for b0 in range(0, q.shape[1], block):
        acc = np.zeros_like(total)
        for d in range(b0, min(q.shape[1], b0 + block)):
            acc = (acc.astype(np.float64) + np.outer(q[:, d].astype(np.float64), k[:, d])).astype(np.float32)
        total = (total + acc).astype(np.float32)
    return total


def scores_table(a, qkv, torch):
    print("| D | FMA chain | blocks of 64 | 128 | 256 | qkv | torch | numpy |")
    print("|---|---|---|---|---|---|---|---|")
    for D in map(int, a.D.split(",")):
        rng = np.random.default_rng(D)
        q, k = (rng.standard_normal((256, D)).astype(np.float32) for _ in range(2))
        s64 = q.astype(np.float64) @ k.astype(np.float64).T

        def err(s):
            return np.sqrt(((np.asarray(s, np.float64) - s64) ** 2).mean()) / np.sqrt(D)

        row = [err(chained(q, k, b)) for b in (D, 64, 128, 256)]
        row += [err(qkv.einsum("ij,kj->ik", q, k)), err((torch.from_numpy(q) @ torch.from_numpy(k).T).numpy()),
                err(q @ k.T)]
        print(f"| {D} | " + " | ".join(f"{x:.2e}" for x in row) + " |", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--L", default="256,1024,4096")
    ap.add_argument("--D", default="64,128,256,512")
    ap.add_argument("--causal", default="0,1")
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--H", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--scores", action="store_true", help="the Q K^T error alone (see above)")
    ap.add_argument("--backward", action="store_true", help="the gradients' errors (see above)")
    a = ap.parse_args()
    import qkv
    import torch

    torch.set_num_threads(a.threads)
    qkv.set_num_threads(a.threads)
    (scores_table if a.scores else backward_table if a.backward else attention_table)(a, qkv, torch)


if __name__ == "__main__":
    main()
