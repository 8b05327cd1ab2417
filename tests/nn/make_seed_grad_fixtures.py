#!/usr/bin/env python3
"""Writes PyTorch autograd fixtures for the seed layers' backward passes (qkv/nn/seed_layers.h,
issue 15 item 2).

Usage: make_seed_grad_fixtures.py OUTPUT_DIR    (`make fixtures`: tests/fixtures/seed_grad)

The modules are make_seed_fixtures.py's (the articles' code in PyTorch), imported from it.
Each configuration becomes OUTPUT_DIR/<name>.safetensors holding the state_dict
("param.<name>", float32), the inputs ("input.x" or "input.q"/"input.k"/"input.v", float32;
"input.mask" bool, True = masked), "grad_output" (float32) and torch's float64 autograd
gradients of sum(output * grad_output) on the float64 copy of the same module and numbers:
"grad.x" or "grad.q"/"grad.k"/"grad.v" and "grad.<parameter name>" (all float64).
SeparateHeadsAttention's scores are returned but not differentiated (grad of the output only).
`__metadata__` holds one key, "options" (JSON: the layer, its C++ constructor arguments).
A rerun writes byte-identical files.
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fixture_set import write_fixture_set  # noqa: E402
from make_seed_fixtures import (LazyMultiHeadAttention, MultiHeadSelfAttention, SelfAttention,  # noqa: E402
                                SeparateHeadsAttention)


def c(name, description, layer, ctor, dims, mask=None):
    return dict(name=name, description=description, layer=layer, ctor=ctor, dims=dims, mask=mask)


CONFIGS = [
    # SelfAttention(dim): dims (B, T)
    c("sa_plain", "SelfAttention dim 12, B 2, T 6", "SelfAttention", dict(dim=12), (2, 6)),
    c("sa_mask", "SelfAttention, random bool mask (True = masked)", "SelfAttention", dict(dim=12), (2, 6), "random"),
    c("sa_causal", "SelfAttention, causal mask triu(ones, 1)", "SelfAttention", dict(dim=8), (3, 7), "causal"),
    c("sa_one_token", "SelfAttention, T 1 (dq, dk vanish)", "SelfAttention", dict(dim=6), (2, 1)),
    c("sa_odd_dim", "SelfAttention dim 5, B 1, T 9, mask", "SelfAttention", dict(dim=5), (1, 9), "random"),
    # MultiHeadSelfAttention(dim, heads, dim_head): dims (B, T)
    c("mhsa_plain", "MHSA dim 16, heads 4", "MultiHeadSelfAttention", dict(dim=16, heads=4), (2, 6)),
    c("mhsa_dim_head_mask", "MHSA dim 16, heads 3, dim_head 7 (!= dim/heads), mask", "MultiHeadSelfAttention",
      dict(dim=16, heads=3, dim_head=7), (2, 6), "random"),
    c("mhsa_causal", "MHSA dim 12, heads 2, dim_head 10, causal mask", "MultiHeadSelfAttention",
      dict(dim=12, heads=2, dim_head=10), (2, 5), "causal"),
    c("mhsa_one_head", "MHSA dim 8, heads 1", "MultiHeadSelfAttention", dict(dim=8, heads=1), (3, 4)),
    c("mhsa_default_heads", "MHSA dim 16, heads 8 (default), dim_head 2", "MultiHeadSelfAttention",
      dict(dim=16, heads=8), (1, 7), "random"),
    c("mhsa_wide_heads", "MHSA dim 6, heads 4, dim_head 5 (H*dh > dim)", "MultiHeadSelfAttention",
      dict(dim=6, heads=4, dim_head=5), (2, 3)),
    # SeparateHeadsAttention(E, H, Dkq, Dv, scale, causal): dims (B, Lq, Lk)
    c("sh_article_shape", "seed 003: E 4, H 8, Dkq 6, Dv 3, Lq 5, Lk 7", "SeparateHeadsAttention",
      dict(embed_dim=4, n_heads=8, d_kq=6, d_v=3), (3, 5, 7)),
    c("sh_causal_scale", "causal, scale 0.3, Lq = Lk 6", "SeparateHeadsAttention",
      dict(embed_dim=4, n_heads=8, d_kq=6, d_v=3, scale=0.3, causal=True), (2, 6, 6)),
    c("sh_causal_short_q", "causal, Lq 4 < Lk 7 (top-left)", "SeparateHeadsAttention",
      dict(embed_dim=6, n_heads=2, d_kq=5, d_v=4, causal=True), (2, 4, 7)),
    c("sh_causal_long_q", "causal, Lq 7 > Lk 4", "SeparateHeadsAttention",
      dict(embed_dim=6, n_heads=3, d_kq=2, d_v=6, causal=True), (1, 7, 4)),
    c("sh_default_sizes", "E 12, H 3, Dkq = Dv = 4 by default", "SeparateHeadsAttention",
      dict(embed_dim=12, n_heads=3), (2, 3, 5)),
    c("sh_scale_one_head", "H 1, Dkq 3, Dv 7, scale 2.0", "SeparateHeadsAttention",
      dict(embed_dim=5, n_heads=1, d_kq=3, d_v=7, scale=2.0), (2, 4, 6)),
    # LazyMultiHeadAttention(hidden, heads): dims (B, Lq, Lk, d_q, d_k, d_v)
    c("lazy_seed004", "seed 004: hidden 12, heads 3, d_q 7, d_k 9, d_v 4", "LazyMultiHeadAttention",
      dict(hidden=12, heads=3), (2, 5, 6, 7, 9, 4)),
    c("lazy_one_head", "hidden 8, heads 1", "LazyMultiHeadAttention", dict(hidden=8, heads=1), (3, 4, 4, 8, 8, 8)),
    c("lazy_four_heads", "hidden 16, heads 4, Lq 3, Lk 8", "LazyMultiHeadAttention", dict(hidden=16, heads=4),
      (2, 3, 8, 5, 6, 7)),
    c("lazy_one_query", "hidden 6, heads 2, Lq 1", "LazyMultiHeadAttention", dict(hidden=6, heads=2),
      (2, 1, 5, 3, 4, 5)),
    c("lazy_one_key", "hidden 6, heads 3, Lk 1 (dq, dk vanish)", "LazyMultiHeadAttention", dict(hidden=6, heads=3),
      (1, 4, 1, 2, 3, 4)),
]


def make_module(cfg):
    a = cfg["ctor"]
    if cfg["layer"] == "SelfAttention":
        return SelfAttention(a["dim"])
    if cfg["layer"] == "MultiHeadSelfAttention":
        return MultiHeadSelfAttention(a["dim"], a.get("heads", 8), a.get("dim_head"))
    if cfg["layer"] == "SeparateHeadsAttention":
        e, h = a["embed_dim"], a["n_heads"]
        return SeparateHeadsAttention(e, h, a.get("d_kq", e // h), a.get("d_v", e // h), a.get("scale"),
                                      a.get("causal", False))
    return LazyMultiHeadAttention(a["hidden"], a["heads"])


def run(cfg, seed):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    module = make_module(cfg)
    dims = cfg["dims"]
    if cfg["layer"] in ("SelfAttention", "MultiHeadSelfAttention"):
        b, t = dims
        dim = cfg["ctor"]["dim"]
        inputs = {"x": r(b, t, dim)}
        if cfg["mask"] == "random":
            mask = torch.rand(t, t, generator=g) < 0.4
            mask.fill_diagonal_(False)  # every row keeps a key (torch gives NaN otherwise)
            inputs["mask"] = mask
        elif cfg["mask"] == "causal":
            inputs["mask"] = torch.triu(torch.ones(t, t, dtype=torch.bool), 1)
    elif cfg["layer"] == "SeparateHeadsAttention":
        b, lq, lk = dims
        e = cfg["ctor"]["embed_dim"]
        inputs = {"q": r(b, lq, e), "k": r(b, lk, e), "v": r(b, lk, e)}
    else:
        b, lq, lk, dq, dk, dv = dims
        inputs = {"q": r(b, lq, dq), "k": r(b, lk, dk), "v": r(b, lk, dv)}
        with torch.no_grad():
            module(inputs["q"], inputs["k"], inputs["v"])  # LazyLinear: the first call fixes d_q, d_k, d_v
    params = {k: v.float().contiguous() for k, v in module.state_dict().items()}
    module = module.double()
    args = {k: (v.double().requires_grad_() if v.is_floating_point() else v) for k, v in inputs.items()}
    out = module(*args.values())
    if isinstance(out, tuple):
        out = out[0]  # SeparateHeadsAttention: (output, scores); the output's gradient only
    grad_output = r(*out.shape)
    (out * grad_output.double()).sum().backward()
    tensors = {"param." + k: v.numpy() for k, v in params.items()}
    tensors.update({"input." + k: v.numpy() for k, v in inputs.items()})
    tensors["grad_output"] = grad_output.numpy()
    tensors.update({"grad." + k: v.grad.numpy() for k, v in args.items() if v.is_floating_point()})
    tensors.update({"grad." + k: p.grad.numpy() for k, p in module.named_parameters()})
    for key, val in tensors.items():
        assert val.dtype == bool or np.isfinite(val).all(), (cfg["name"], key)
        assert key.startswith("grad.") == (val.dtype == np.float64), (cfg["name"], key)
    options = {"layer": cfg["layer"], "ctor": cfg["ctor"], "torch": torch.__version__.split("+")[0]}
    return tensors, {"options": json.dumps(options, sort_keys=True)}


def main():
    write_fixture_set(CONFIGS, run, 1500, "seed_grad",
                      ["# seed_grad", "", "The seed layers' gradients from PyTorch float64 autograd "
                       "(tests/nn/make_seed_grad_fixtures.py)."], save_file)


if __name__ == "__main__":
    main()
