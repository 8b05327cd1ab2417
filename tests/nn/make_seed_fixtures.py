#!/usr/bin/env python3
"""Writes PyTorch fixtures for the seed articles' layers (qkv/nn/seed_layers.h).

Usage: make_seed_fixtures.py OUTPUT_DIR    (`make fixtures`: tests/fixtures/mha_torch/seeds)

The modules below are the articles' code written in PyTorch (einops patterns spelled
out as reshape/permute, with the pattern quoted). Each configuration becomes
OUTPUT_DIR/<name>.safetensors: the module's state_dict under its own names, the
inputs (input.x or input.q/k/v, input.mask), expected.output (and expected.scores),
computed in float64 from the stored float32 numbers, and __metadata__["options"] (JSON).
"""

from __future__ import annotations

import json
import os
import sys

import torch
from safetensors.torch import save_file
from torch import nn


class SelfAttention(nn.Module):  # seed 000
    def __init__(self, dim):
        super().__init__()
        self.to_qvk = nn.Linear(dim, dim * 3, bias=False)
        self.scale_factor = dim ** -0.5

    def forward(self, x, mask=None):
        qkv = self.to_qvk(x)
        b, t, _ = qkv.shape
        q, k, v = qkv.reshape(b, t, -1, 3).permute(3, 0, 1, 2)  # 'b t (d k) -> k b t d', k=3
        scaled = torch.einsum("b i d, b j d -> b i j", q, k) * self.scale_factor
        if mask is not None:
            scaled = scaled.masked_fill(mask, float("-inf"))
        return torch.einsum("b i j, b j d -> b i d", torch.softmax(scaled, dim=-1), v)


class MultiHeadSelfAttention(nn.Module):  # seed 000
    def __init__(self, dim, heads=8, dim_head=None):
        super().__init__()
        self.dim_head = int(dim / heads) if dim_head is None else dim_head
        self.heads = heads
        inner = self.dim_head * heads
        self.to_qvk = nn.Linear(dim, inner * 3, bias=False)
        self.W_0 = nn.Linear(inner, dim, bias=False)
        self.scale_factor = self.dim_head ** -0.5

    def forward(self, x, mask=None):
        qkv = self.to_qvk(x)
        b, t, _ = qkv.shape
        # 'b t (d k h) -> k b h t d', k=3, h=heads
        q, k, v = qkv.reshape(b, t, self.dim_head, 3, self.heads).permute(3, 0, 4, 1, 2)
        scaled = torch.einsum("b h i d, b h j d -> b h i j", q, k) * self.scale_factor
        if mask is not None:
            scaled = scaled.masked_fill(mask, float("-inf"))
        out = torch.einsum("b h i j, b h j d -> b h i d", torch.softmax(scaled, dim=-1), v)
        out = out.permute(0, 2, 1, 3).reshape(b, t, -1)  # 'b h t d -> b t (h d)'
        return self.W_0(out)


class SeparateHeadsAttention(nn.Module):  # seed 003
    def __init__(self, E, H, Dkq, Dv, scale=None, causal=False):
        super().__init__()
        self.H, self.Dkq, self.Dv, self.causal = H, Dkq, Dv, causal
        self.scale = scale if scale is not None else Dkq ** -0.5
        self.W_q = nn.Linear(E, H * Dkq, bias=False)
        self.W_k = nn.Linear(E, H * Dkq, bias=False)
        self.W_v = nn.Linear(E, H * Dv, bias=False)
        self.W_o = nn.Linear(H * Dv, E, bias=False)

    def forward(self, q, k, v):
        B, U, _ = q.shape
        S = k.shape[1]
        Q = self.W_q(q).view(B, U, self.H, self.Dkq).transpose(1, 2)
        K = self.W_k(k).view(B, S, self.H, self.Dkq).transpose(1, 2)
        V = self.W_v(v).view(B, S, self.H, self.Dv).transpose(1, 2)
        scores = Q @ K.transpose(-2, -1) * self.scale
        if self.causal:
            mask = torch.triu(torch.ones(U, S, dtype=torch.bool), diagonal=1)
            scores = scores.masked_fill(mask, float("-inf"))
        scores = torch.softmax(scores, dim=-1)
        Z = (scores @ V).transpose(1, 2).reshape(B, U, self.H * self.Dv)
        return self.W_o(Z), scores


class LazyMultiHeadAttention(nn.Module):  # seed 004
    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.W_q, self.W_k, self.W_v = nn.LazyLinear(hidden), nn.LazyLinear(hidden), nn.LazyLinear(hidden)
        self.W_o = nn.Linear(hidden, hidden)

    def forward(self, q, k, v):
        def split(x):  # 'batch seq (heads eachhead) -> (batch heads) seq eachhead'
            b, s, f = x.shape
            return x.reshape(b, s, self.heads, f // self.heads).permute(0, 2, 1, 3).reshape(b * self.heads, s, -1)
        Q, K, V = split(self.W_q(q)), split(self.W_k(k)), split(self.W_v(v))
        w = torch.softmax(torch.bmm(Q, K.transpose(1, 2)) / Q.shape[-1] ** 0.5, dim=-1)
        out = torch.bmm(w, V)
        bh, n, e = out.shape
        b = bh // self.heads  # '(batch heads) numq eachhead -> batch numq (heads eachhead)'
        out = out.reshape(b, self.heads, n, e).permute(0, 2, 1, 3).reshape(b, n, self.heads * e)
        return self.W_o(out)


def cases():
    g = torch.Generator().manual_seed(4242)
    r = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    mask = torch.rand(6, 6, generator=g) < 0.3
    mask.fill_diagonal_(False)
    yield "self_attention", dict(layer="SelfAttention", dim=12), SelfAttention(12), {"x": r(2, 6, 12)}
    yield ("self_attention_mask", dict(layer="SelfAttention", dim=12), SelfAttention(12),
           {"x": r(2, 6, 12), "mask": mask})
    yield "mhsa", dict(layer="MultiHeadSelfAttention", dim=16, heads=4), MultiHeadSelfAttention(16, 4), {
        "x": r(2, 6, 16)}
    yield ("mhsa_dim_head", dict(layer="MultiHeadSelfAttention", dim=16, heads=3, dim_head=7),
           MultiHeadSelfAttention(16, 3, 7), {"x": r(2, 6, 16), "mask": mask})
    yield ("seed003", dict(layer="SeparateHeadsAttention", E=4, H=8, Dkq=6, Dv=3),
           SeparateHeadsAttention(4, 8, 6, 3), {"q": r(3, 5, 4), "k": r(3, 7, 4), "v": r(3, 7, 4)})
    yield ("seed003_causal_scale", dict(layer="SeparateHeadsAttention", E=4, H=8, Dkq=6, Dv=3, scale=0.3,
                                        causal=True),
           SeparateHeadsAttention(4, 8, 6, 3, scale=0.3, causal=True),
           {"q": r(3, 6, 4), "k": r(3, 6, 4), "v": r(3, 6, 4)})
    yield ("seed004_lazy", dict(layer="LazyMultiHeadAttention", hidden=12, heads=3),
           LazyMultiHeadAttention(12, 3), {"q": r(2, 5, 7), "k": r(2, 6, 9), "v": r(2, 6, 4)})


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..", "fixtures",
                                                                 "mha_torch", "seeds")
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(7)
    for name, options, module, inputs in cases():
        module.eval()
        floats = [v for v in inputs.values() if v.is_floating_point()]
        if options["layer"] == "LazyMultiHeadAttention":
            with torch.no_grad():
                module(*floats)  # LazyLinear: the first call fixes d_q, d_k, d_v
        sd = {k: v.float().contiguous() for k, v in module.state_dict().items()}
        ref = module.double()
        with torch.no_grad():
            args = [v.double() if v.is_floating_point() else v for v in inputs.values()]
            out = ref(*args)
        tensors = dict(sd)
        for k, v in inputs.items():
            tensors["input." + k] = v.contiguous()
        if isinstance(out, tuple):
            tensors["expected.output"], tensors["expected.scores"] = out[0].contiguous(), out[1].contiguous()
        else:
            tensors["expected.output"] = out.contiguous()
        options["torch"] = torch.__version__
        save_file(tensors, os.path.join(out_dir, name + ".safetensors"), metadata={"options": json.dumps(options)})
    print("seed fixtures in", out_dir)


if __name__ == "__main__":
    main()
