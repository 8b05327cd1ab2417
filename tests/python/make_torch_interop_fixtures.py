#!/usr/bin/env python3
"""Writes the torch fixture of tests/python/test_py_interop.py (torch is not in .venv).

Usage: make_torch_interop_fixtures.py OUTPUT_DIR    (the committed way: `make fixtures`,
or /work/fixenv/bin/python with torch installed)

OUTPUT_DIR/sdpa_strided.safetensors (the `safetensors` package) holds
  q, k, v      float64 inputs stored [B, L, H, D] (contiguous)
  out_causal   torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2),
               k.transpose(1, 2), v.transpose(1, 2), is_causal=True), i.e. on torch's
               strided [B, H, L, D] views, float64, math backend
  out_mask     the same with a boolean attn_mask [Lq, Lk] (mask below) instead of is_causal
  mask         that mask (True = take part)
and __metadata__ {"torch": torch.__version__}.
"""
import pathlib
import sys

import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(20261123)
    q = torch.randn(2, 5, 4, 8, dtype=torch.float64, generator=g)
    k = torch.randn(2, 7, 4, 8, dtype=torch.float64, generator=g)
    v = torch.randn(2, 7, 4, 3, dtype=torch.float64, generator=g)
    mask = torch.rand(5, 7, generator=g) < 0.7
    mask[2] = False  # a fully masked row
    with sdpa_kernel(SDPBackend.MATH):
        out_causal = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                    is_causal=True)
        out_mask = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  attn_mask=mask)
    save_file({"q": q, "k": k, "v": v, "mask": mask, "out_causal": out_causal.contiguous(),
               "out_mask": out_mask.contiguous()},
              str(out_dir / "sdpa_strided.safetensors"), metadata={"torch": torch.__version__})


if __name__ == "__main__":
    main()
