#!/usr/bin/env python3
"""Writes the PyTorch fixtures for qkv::nn::MultiheadAttention.

Usage: make_torch_mha_fixtures.py OUTPUT_DIR    (the committed way: `make fixtures`)

Every configuration becomes OUTPUT_DIR/<name>.safetensors holding
  <state_dict keys>        the layer's parameters under PyTorch's own names
                           (in_proj_weight, out_proj.weight, bias_k, ...), float32
  input.query / input.key / input.value   float32 (key/value absent for self-attention:
                           the test passes the query three times, as `mha(x, x, x)`)
  input.key_padding_mask, input.attn_mask  (optional) bool or float32, PyTorch's meaning
  expected.output          torch.nn.MultiheadAttention (eval, no grad) run in float64
                           on the float64 upcast of the stored float32 parameters and
                           inputs: the exact values the stored numbers define
  expected.weights         (when need_weights) the returned attention weights, float64
and `__metadata__["options"]`: JSON with the constructor arguments (embed_dim,
num_heads, bias, add_bias_kv, add_zero_attn, kdim, vdim, batch_first), the call
arguments (need_weights, average_attn_weights, is_causal), self_attention,
kv_shared (key is value), the torch version and a description.

Masks never mask a whole row: PyTorch's need_weights path gives NaN there where qkv
gives 0 (documented in docs/nn.md). Parameters are drawn from N(0, 1/fan_in) and
biases from N(0, 0.5) so that every parameter matters (PyTorch initialises biases to 0).
"""

from __future__ import annotations

import json

import torch
from safetensors.torch import save_file

from fixture_set import write_fixture_set


def config(name, desc, e=16, h=4, n=2, l=5, s=7, **kw):
    c = dict(name=name, description=desc, embed_dim=e, num_heads=h, n=n, l=l, s=s, bias=True,
             add_bias_kv=False, add_zero_attn=False, kdim=None, vdim=None, batch_first=False,
             need_weights=True, average_attn_weights=True, is_causal=False, self_attention=False,
             kv_shared=False, unbatched=False, kpm=None, attn_mask=None, input_scale=1.0)
    c.update(kw)
    if c["self_attention"]:
        c["s"] = c["l"]
    return c


CONFIGS = [
    config("self_seqfirst", "self-attention, packed in_proj, [L, N, E]", self_attention=True),
    config("self_batchfirst", "self-attention, batch_first", self_attention=True, batch_first=True),
    config("self_batchfirst_noweights", "the fast-path call: batch_first, need_weights=False",
           self_attention=True, batch_first=True, need_weights=False),
    config("cross_seqfirst", "cross-attention L != S"),
    config("cross_batchfirst", "cross-attention, batch_first", batch_first=True),
    config("kv_shared", "key is value, query separate", kv_shared=True),
    config("kdim_vdim", "kdim=10, vdim=6: separate q/k/v_proj_weight", kdim=10, vdim=6),
    config("kdim_only", "kdim=9", kdim=9),
    config("vdim_only", "vdim=5, batch_first", vdim=5, batch_first=True),
    config("no_bias", "bias=False", bias=False),
    config("no_bias_kdim_vdim", "bias=False with kdim/vdim", bias=False, kdim=12, vdim=8),
    config("bias_kv", "add_bias_kv", add_bias_kv=True),
    config("zero_attn", "add_zero_attn", add_zero_attn=True),
    config("bias_kv_zero_attn", "add_bias_kv and add_zero_attn", add_bias_kv=True, add_zero_attn=True),
    config("bias_kv_zero_attn_masks", "bias_kv + zero_attn + key_padding_mask + 2-D bool attn_mask",
           add_bias_kv=True, add_zero_attn=True, kpm="bool", attn_mask="bool2"),
    config("kpm_bool", "key_padding_mask bool (True = ignore)", kpm="bool"),
    config("kpm_float", "key_padding_mask float (added)", kpm="float"),
    config("mask2d_bool", "attn_mask [L, S] bool (True = not allowed)", attn_mask="bool2"),
    config("mask2d_float", "attn_mask [L, S] float", attn_mask="float2"),
    config("mask3d_bool", "attn_mask [N*H, L, S] bool", attn_mask="bool3"),
    config("mask3d_float", "attn_mask [N*H, L, S] float", attn_mask="float3"),
    config("kpm_bool_mask2d_bool", "key_padding_mask and attn_mask, both bool", kpm="bool", attn_mask="bool2"),
    config("kpm_bool_mask3d_float", "bool key_padding_mask + 3-D float attn_mask", kpm="bool",
           attn_mask="float3"),
    config("kpm_float_mask2d_float", "float key_padding_mask + 2-D float attn_mask, batch_first",
           kpm="float", attn_mask="float2", batch_first=True),
    config("no_weights", "need_weights=False", need_weights=False),
    config("weights_per_head", "need_weights, average_attn_weights=False", average_attn_weights=False),
    config("weights_per_head_masks", "per-head weights with kpm and 3-D bool mask",
           average_attn_weights=False, kpm="bool", attn_mask="bool3"),
    config("causal_hint_noweights", "is_causal with a causal attn_mask, need_weights=False",
           self_attention=True, attn_mask="causal", is_causal=True, need_weights=False),
    config("causal_hint_weights", "is_causal with a causal attn_mask, need_weights=True",
           self_attention=True, attn_mask="causal", is_causal=True, batch_first=True),
    config("causal_hint_kpm", "is_causal + causal mask + key_padding_mask", self_attention=True,
           attn_mask="causal", is_causal=True, kpm="bool", need_weights=False),
    config("unbatched", "unbatched [L, E] inputs", unbatched=True),
    config("unbatched_masks", "unbatched with key_padding_mask [S] and 3-D attn_mask [H, L, S]",
           unbatched=True, kpm="bool", attn_mask="float3", average_attn_weights=False),
    config("one_head", "num_heads=1", h=1),
    config("wide", "E=32, H=8, kdim/vdim, masks, per-head weights, batch_first", e=32, h=8, n=3, l=6,
           s=9, kdim=20, vdim=12, kpm="bool", attn_mask="bool3", batch_first=True,
           average_attn_weights=False),
    config("bias_kv_batchfirst", "add_bias_kv, batch_first, per-head weights", add_bias_kv=True,
           batch_first=True, average_attn_weights=False),
    config("zero_attn_mask3d", "add_zero_attn with a 3-D float mask", add_zero_attn=True, attn_mask="float3"),
    config("large_inputs", "inputs scaled by 100 (peaked softmax)", input_scale=100.0, self_attention=True),
    config("long", "L=33, S=47, E=24, H=6", e=24, h=6, l=33, s=47, kpm="bool"),
]


def make_masks(c, g):
    n, h, l, s = c["n"], c["num_heads"], c["l"], c["s"]
    kpm = attn = None
    if c["kpm"] == "bool":
        kpm = torch.rand(n, s, generator=g) < 0.35
        kpm[:, 0] = False  # never a fully masked row
    elif c["kpm"] == "float":
        kpm = torch.randn(n, s, generator=g)
    kind = c["attn_mask"]
    if kind in ("bool2", "bool3"):
        shape = (l, s) if kind == "bool2" else (n * h, l, s)
        attn = torch.rand(*shape, generator=g) < 0.35
        attn[..., 0] = False
    elif kind in ("float2", "float3"):
        shape = (l, s) if kind == "float2" else (n * h, l, s)
        attn = torch.randn(*shape, generator=g)
        attn[..., -1] = float("-inf") if s > 1 else 0.0  # a masked key, never the whole row
    elif kind == "causal":
        attn = torch.ones(l, s, dtype=torch.bool).triu(1)
    if c["unbatched"]:
        if kpm is not None:
            kpm = kpm[0]
    return kpm, attn


def run(c, seed):
    g = torch.Generator().manual_seed(seed)
    e, h = c["embed_dim"], c["num_heads"]
    n = 1 if c["unbatched"] else c["n"]
    c = dict(c, n=n)
    mha = torch.nn.MultiheadAttention(e, h, bias=c["bias"], add_bias_kv=c["add_bias_kv"],
                                      add_zero_attn=c["add_zero_attn"], kdim=c["kdim"], vdim=c["vdim"],
                                      batch_first=c["batch_first"])
    with torch.no_grad():
        for name, p in mha.named_parameters():
            if p.dim() >= 2 and "bias" not in name:
                p.copy_(torch.randn(p.shape, generator=g) / p.shape[-1] ** 0.5)
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    kd, vd = c["kdim"] or e, c["vdim"] or e

    def shape(length, feat):
        if c["unbatched"]:
            return (length, feat)
        return (n, length, feat) if c["batch_first"] else (length, n, feat)

    scale = c["input_scale"]
    query = torch.randn(shape(c["l"], e), generator=g) * scale
    key = torch.randn(shape(c["s"], kd), generator=g) * scale
    value = torch.randn(shape(c["s"], vd), generator=g) * scale
    if c["self_attention"]:
        key = value = query
    elif c["kv_shared"]:
        value = key
    kpm, attn = make_masks(c, g)

    mha64 = torch.nn.MultiheadAttention(e, h, bias=c["bias"], add_bias_kv=c["add_bias_kv"],
                                        add_zero_attn=c["add_zero_attn"], kdim=c["kdim"], vdim=c["vdim"],
                                        batch_first=c["batch_first"], dtype=torch.float64)
    mha64.load_state_dict({k: v.double() for k, v in mha.state_dict().items()})
    mha64.eval()

    def d(t):
        return None if t is None else (t.double() if t.is_floating_point() else t)

    with torch.inference_mode():
        q64, k64, v64 = d(query), d(key), d(value)
        if c["self_attention"]:
            k64 = v64 = q64
        elif c["kv_shared"]:
            v64 = k64
        out, w = mha64(q64, k64, v64, key_padding_mask=d(kpm), need_weights=c["need_weights"],
                       attn_mask=d(attn), average_attn_weights=c["average_attn_weights"],
                       is_causal=c["is_causal"])
    tensors = {k: v.contiguous() for k, v in mha.state_dict().items()}
    tensors["input.query"] = query.contiguous()
    if not c["self_attention"]:
        tensors["input.key"] = key.contiguous()
        if not c["kv_shared"]:
            tensors["input.value"] = value.contiguous()
    if kpm is not None:
        tensors["input.key_padding_mask"] = kpm.contiguous()
    if attn is not None:
        tensors["input.attn_mask"] = attn.contiguous()
    tensors["expected.output"] = out.contiguous()
    if w is not None:
        tensors["expected.weights"] = w.contiguous()
    assert torch.isfinite(out).all(), c["name"]
    options = {k: c[k] for k in ("embed_dim", "num_heads", "bias", "add_bias_kv", "add_zero_attn", "kdim", "vdim",
                                 "batch_first", "need_weights", "average_attn_weights", "is_causal",
                                 "self_attention", "kv_shared", "description")}
    options["torch"] = torch.__version__
    return tensors, {"options": json.dumps(options, sort_keys=True)}


def main():
    write_fixture_set(CONFIGS, run, 1000, "mha_torch",
                      ["# PyTorch nn.MultiheadAttention fixtures", "",
                       f"Written by tests/nn/make_torch_mha_fixtures.py with torch {torch.__version__}."], save_file)


if __name__ == "__main__":
    main()
