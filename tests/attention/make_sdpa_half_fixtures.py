#!/usr/bin/env python3
"""Writes the PyTorch fixtures for bf16/f16 attention computed in its type (issue 14).

Usage: make_sdpa_half_fixtures.py OUTPUT_DIR    (the committed way: `make fixtures`)

Issue 14's criterion for qkv's bf16/f16 fused attention: its error against float64 is
at most twice PyTorch's own bf16/f16 SDPA error against float64, on random
configurations like the hidden tests' (lengths up to a few hundred, head dims 32-128,
GQA, causal, bool and float masks, Lq != Lk). Each configuration becomes
OUTPUT_DIR/<name>.safetensors (the `safetensors` package) holding

  q, k, v      the inputs in the configuration's dtype (float16 or bfloat16)
  attn_mask    (optional) bool (True = take part) or float32 (added)

and `__metadata__` with one key (safetensors writes several in no fixed order),
"options" (JSON: dtype, is_causal, enable_gqa, scale, and torch_error: max |torch SDPA
on the half inputs, in their dtype - torch SDPA in float64 on the float64 upcast of the
same inputs|, over the output). The float64
result itself is not stored: the C++ test recomputes it with qkv's float64 reference,
which tests/fixtures/sdpa ties to torch's float64 SDPA. Seeds are fixed, so a rerun
with the same torch writes the same bytes. Also writes OUTPUT_DIR/README.md.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16}
TOTAL_LIMIT = 3 * 1024 * 1024


def configs():
    """(name, dtype, B, Hq, Hk, Lq, Lk, Dk, Dv, causal, mask kind, scale), from one seeded stream."""
    rng = np.random.default_rng(20261125)
    out = []
    for i in range(16):
        dtype = "bfloat16" if i % 2 == 0 else "float16"
        hk = int(rng.choice([1, 2]))
        gqa = i % 4 == 1
        hq = hk * (int(rng.choice([2, 4])) if gqa else 1)
        lq = int(rng.choice([1, 17, 64, 100, 128, 200, 256]))
        lk = int(rng.choice([33, 64, 129, 200, 256, 300]))
        dk = int(rng.choice([32, 64, 80, 128]))
        dv = dk if rng.random() < 0.7 else int(rng.choice([16, 64]))
        mask = ["none", "none", "bool", "float"][i % 4] if not gqa else "none"
        causal = mask == "none" and rng.random() < 0.5
        scale = None if rng.random() < 0.8 else 0.3
        while 1 * hq * lq * dk + hk * lk * (dk + dv) > 60_000:  # keeps the files small
            lk = max(33, lk // 2) if lk > lq else lk
            lq = max(1, lq // 2)
        out.append((f"{dtype}_{i:02d}", dtype, 1, hq, hk, lq, lk, dk, dv, causal, mask, scale))
    return out


def write(out_dir, cfg, seed):
    name, dtype, b, hq, hk, lq, lk, dk, dv, causal, mask_kind, scale = cfg
    gen = torch.Generator().manual_seed(seed)
    dt = DTYPES[dtype]
    q = torch.randn((b, hq, lq, dk), generator=gen).to(dt)
    k = torch.randn((b, hk, lk, dk), generator=gen).to(dt)
    v = torch.randn((b, hk, lk, dv), generator=gen).to(dt)
    tensors = {"q": q, "k": k, "v": v}
    mask = None
    if mask_kind == "bool":
        mask = torch.rand((lq, lk), generator=gen) < 0.8
        tensors["attn_mask"] = mask
    elif mask_kind == "float":
        mask = torch.randn((b, 1, lq, lk), generator=gen)
        mask[..., ::7] = float("-inf")
        tensors["attn_mask"] = mask
    gqa = hq != hk
    def cast(m, to):  # a float mask in the computation's dtype, as torch requires
        return m if m is None or m.dtype == torch.bool else m.to(to)

    native = F.scaled_dot_product_attention(q, k, v, attn_mask=cast(mask, dt), is_causal=causal, scale=scale,
                                            enable_gqa=gqa)
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=cast(mask, torch.float64),
                                           is_causal=causal, scale=scale, enable_gqa=gqa)
    err = (native.double() - exact).abs().max().item()
    options = {"dtype": dtype, "is_causal": causal, "enable_gqa": gqa, "scale": scale, "torch_error": err}
    meta = {"options": json.dumps(options)}
    path = os.path.join(out_dir, name + ".safetensors")
    save_file({k_: t.contiguous() for k_, t in tensors.items()}, path, metadata=meta)
    return name, (hq, hk, lq, lk, dk, dv), causal, mask_kind, scale, err, os.path.getsize(path)


def main():
    out_dir = sys.argv[1]
    os.makedirs(out_dir, exist_ok=True)
    rows, total = [], 0
    for i, cfg in enumerate(configs()):
        row = write(out_dir, cfg, 3000 + i)
        total += row[-1]
        rows.append(row)
    assert total <= TOTAL_LIMIT, total
    with open(os.path.join(out_dir, "README.md"), "w") as f:
        f.write("# bf16/f16 SDPA fixtures (tests/attention/make_sdpa_half_fixtures.py, torch "
                f"{torch.__version__})\n\n"
                "| name | Hq, Hk, Lq, Lk, Dk, Dv | causal | mask | scale | torch error vs float64 | bytes |\n"
                "|---|---|---|---|---|---|---|\n")
        for name, dims, causal, mask, scale, err, size in rows:
            f.write(f"| {name} | {dims} | {causal} | {mask} | {scale} | {err:.3e} | {size} |\n")
    print(f"wrote {len(rows)} fixtures, {total} bytes, to {out_dir}")


if __name__ == "__main__":
    main()
