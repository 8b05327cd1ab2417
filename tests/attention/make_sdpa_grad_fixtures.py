#!/usr/bin/env python3
"""Writes the PyTorch autograd fixtures for qkv's attention backward.

Usage: make_sdpa_grad_fixtures.py OUTPUT_DIR    (the committed way: `make fixtures`)

60 random configurations (fixed seeds) covering plain, causal (Lq <= Lk and
Lq > Lk), bool masks (broadcast shapes, fully masked rows), float masks (with
-inf), explicit scales (0 and negative included), GQA, broadcast batch dims,
Dk != Dv and Lq != Lk. Each becomes OUTPUT_DIR/<name>.safetensors holding:

  q, k, v, attn_mask (optional), grad_out   float64 inputs (bool mask: bool)
  out                torch SDPA (math backend) in float64
  dq, dk, dv         torch.autograd.grad of sum(out * grad_out) in float64
                     (math backend)
  dq_f32, dk_f32, dv_f32   the same on the float32 casts of the inputs (torch's
                     default CPU backend), for information

and `__metadata__` "options" (JSON: is_causal, scale, enable_gqa, dropout_p,
dtype, description) in the format of tests/fixtures/sdpa. Dropout is not
covered: torch's RNG stream cannot be reproduced by qkv (the float64 reference
backward covers it, tests/attention/attention_backward_reference_test.cc).
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch.nn.attention import SDPBackend, sdpa_kernel

KINDS = ["plain", "causal", "bool_mask", "float_mask", "scale", "gqa", "bcast"]


def rand_int(gen: torch.Generator, lo: int, hi: int) -> int:
    return int(torch.randint(lo, hi + 1, (1,), generator=gen))


def make_config(i: int, gen: torch.Generator) -> dict:
    kind = KINDS[i % len(KINDS)]
    b, hk = rand_int(gen, 1, 2), rand_int(gen, 1, 2)
    group = rand_int(gen, 2, 3) if kind == "gqa" else 1
    # Lk = 1 (dq = dk = 0: one key's weight is 1 whatever the scores) only in a few configurations.
    lq, lk = rand_int(gen, 1, 9), (1 if i % 20 == 7 else rand_int(gen, 2, 11))
    dk, dv = rand_int(gen, 1, 8), rand_int(gen, 1, 8)
    c = {"name": f"{i:02d}_{kind}", "kind": kind, "q": (b, hk * group, lq, dk), "k": (b, hk, lk, dk),
         "v": (b, hk, lk, dv), "is_causal": kind == "causal", "enable_gqa": kind == "gqa", "scale": None,
         "mask": None, "seed": 2000 + i}
    if kind == "scale":
        c["scale"] = [0.0, -0.5, 0.37, 2.0][(i // len(KINDS)) % 4]
    if kind == "bcast":  # q's batch 1 against k/v's batch 2, or the reverse
        c["q"], c["k"], c["v"] = ((1,) + c["q"][1:], (2,) + c["k"][1:], (2,) + c["v"][1:]) if i % 2 else \
            ((2,) + c["q"][1:], (1,) + c["k"][1:], (1,) + c["v"][1:])
    if kind in ("bool_mask", "float_mask"):
        c["mask"] = [(lq, lk), (b, 1, lq, lk), (1, lk), (b, hk, lq, lk)][(i // len(KINDS)) % 4]
    return c


def make_mask(kind: str, shape: tuple, gen: torch.Generator) -> torch.Tensor:
    if kind == "bool_mask":
        m = torch.rand(shape, generator=gen, dtype=torch.float64) > 0.3
        if len(shape) >= 2 and shape[-2] > 1:
            m[..., shape[-2] - 1, :] = False  # a fully masked row: zero gradients
        return m
    m = torch.randn(shape, generator=gen, dtype=torch.float64)
    m[torch.rand(shape, generator=gen, dtype=torch.float64) < 0.2] = float("-inf")
    return m


def grads(q, k, v, mask, g, c, backend=None):
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    kwargs = dict(attn_mask=mask, is_causal=c["is_causal"], scale=c["scale"], enable_gqa=c["enable_gqa"])
    if backend is None:
        out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    else:
        with sdpa_kernel(backend):
            out = F.scaled_dot_product_attention(q, k, v, **kwargs)
    dq, dk, dv = torch.autograd.grad((out * g).sum(), (q, k, v))
    return out.detach(), dq, dk, dv


def generate(c: dict) -> dict:
    gen = torch.Generator().manual_seed(c["seed"])
    q, k, v = (torch.randn(c[n], generator=gen, dtype=torch.float64) for n in ("q", "k", "v"))
    mask = make_mask(c["kind"], c["mask"], gen) if c["mask"] else None
    out_shape = torch.broadcast_shapes(c["q"][:-2], c["k"][:-3] + (c["q"][-3],)) + (c["q"][-2], c["v"][-1])
    g = torch.randn(out_shape, generator=gen, dtype=torch.float64)
    out, dq, dk, dv = grads(q, k, v, mask, g, c, SDPBackend.MATH)
    mask32 = mask if mask is None or mask.dtype == torch.bool else mask.float()
    _, dq32, dk32, dv32 = grads(q.float(), k.float(), v.float(), mask32, g.float(), c)
    tensors = {"q": q, "k": k, "v": v, "grad_out": g, "out": out, "dq": dq, "dk": dk, "dv": dv,
               "dq_f32": dq32, "dk_f32": dk32, "dv_f32": dv32}
    if mask is not None:
        tensors["attn_mask"] = mask
    for name, t in tensors.items():
        if t.dtype != torch.bool and not (name == "attn_mask") and not torch.isfinite(t).all():
            raise SystemExit(f"{c['name']}: non-finite {name}")
    return {n: t.contiguous() for n, t in tensors.items()}


def main() -> None:
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    lines = ["# PyTorch autograd fixtures for the attention backward", "",
             f"Written by tests/attention/make_sdpa_grad_fixtures.py (torch {torch.__version__}).", ""]
    gen = torch.Generator().manual_seed(1000)
    for i in range(60):
        c = make_config(i, gen)
        desc = f"{c['kind']}: q {c['q']}, k {c['k']}, v {c['v']}, mask {c['mask']}, scale {c['scale']}"
        meta = {"options": json.dumps({"is_causal": c["is_causal"], "scale": c["scale"], "enable_gqa": c["enable_gqa"],
                                       "dropout_p": 0.0, "dtype": "float64", "description": desc})}
        save_file(generate(c), os.path.join(out_dir, c["name"] + ".safetensors"), metadata=meta)
        lines.append(f"- `{c['name']}`: {desc}")
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
