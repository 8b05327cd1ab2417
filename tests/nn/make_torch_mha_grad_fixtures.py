#!/usr/bin/env python3
"""Writes PyTorch autograd fixtures for qkv::nn::MultiheadAttention::backward (issue 15 item 5).

Usage: make_torch_mha_grad_fixtures.py OUTPUT_DIR    (the committed way: `make fixtures`)

Six hand-picked configurations and 44 random ones, then 11 with add_bias_kv and/or add_zero_attn
(61 in all); each becomes
OUTPUT_DIR/<name>.safetensors: the layer's state_dict (float32,
"param/<name>"), query/key/value and grad_out (float32; masks as given), and torch's float64
autograd gradients of sum(output * grad_out) with respect to the inputs ("d_query", "d_key",
"d_value") and every parameter ("dparam/<name>"), computed on the float64 copy of the same
module and inputs. `__metadata__` "options" (one key) holds the constructor and forward
arguments. A rerun writes byte-identical files.
"""
import json
import os
import sys

import numpy as np
import torch
from safetensors.numpy import save_file

CONFIGS = [
    # name, ctor kwargs, (L, S, N or None), forward kwargs, which masks
    ("self_batch_first", dict(embed_dim=16, num_heads=4, batch_first=True), (5, 5, 2), {}, ()),
    ("cross_seq_first_kdim_vdim", dict(embed_dim=16, num_heads=2, kdim=12, vdim=10), (4, 6, 3), {}, ()),
    ("masks_no_bias", dict(embed_dim=12, num_heads=3, bias=False), (4, 7, 2), {}, ("key_padding", "float_attn")),
    ("causal_hint", dict(embed_dim=8, num_heads=2, batch_first=True), (6, 6, 2),
     dict(is_causal=True, need_weights=False), ("causal_attn",)),
    ("unbatched", dict(embed_dim=8, num_heads=2), (3, 5, None), {}, ()),
    ("bool_3d_mask", dict(embed_dim=8, num_heads=2), (4, 5, 2), {}, ("bool3d_attn",)),
]


def make(name, ctor, dims, fwd, masks, seed):
    torch.manual_seed(seed)
    layer = torch.nn.MultiheadAttention(**ctor)
    l, s, n = dims
    e = ctor["embed_dim"]
    kd, vd = ctor.get("kdim", e), ctor.get("vdim", e)
    bf = ctor.get("batch_first", False)
    shape = lambda length, d: (length, d) if n is None else ((n, length, d) if bf else (length, n, d))
    q = torch.randn(shape(l, e))
    self_attn = name.startswith("self") or name.startswith("causal") or name == "unbatched"
    k = q if self_attn and kd == e else torch.randn(shape(s if not self_attn else l, kd))
    v = k if self_attn and vd == e else torch.randn(shape(s if not self_attn else l, vd))
    s = k.shape[-2] if n is None or bf else k.shape[0]
    kwargs = dict(fwd)
    tensors = {}
    if "key_padding" in masks:
        kpm = torch.zeros(n, s, dtype=torch.bool)
        kpm[:, -2:] = True
        kwargs["key_padding_mask"] = kpm
    if "float_attn" in masks:
        kwargs["attn_mask"] = torch.randn(l, s)
    if "causal_attn" in masks:
        kwargs["attn_mask"] = torch.triu(torch.ones(l, s, dtype=torch.bool), 1)
    if "key_padding_all" in masks:  # batch 0 pads every key: only the bias_kv / zero_attn keys are left
        kpm = torch.zeros(n, s, dtype=torch.bool)
        kpm[0, :] = True
        kpm[1:, -1] = True
        kwargs["key_padding_mask"] = kpm
    if "bool3d_attn" in masks:
        m = torch.rand(n * ctor["num_heads"], l, s) < 0.3
        m[..., 0] = False  # every row keeps a key
        kwargs["attn_mask"] = m
    grad_out = torch.randn(shape(l, e))
    # float64 autograd on the same values
    layer64 = layer.double()
    inputs = [x.double().requires_grad_() for x in (q, k, v)]
    if self_attn:
        inputs = [inputs[0], inputs[0], inputs[0]] if (k is q and v is q) else inputs
    kw64 = {key: (val.double() if val.dtype != torch.bool else val) for key, val in kwargs.items()
            if isinstance(val, torch.Tensor)}
    kw64.update({key: val for key, val in kwargs.items() if not isinstance(val, torch.Tensor)})
    out, _ = layer64(*inputs, **kw64)
    (out * grad_out.double()).sum().backward()
    for key, val in layer.state_dict().items():
        tensors["param/" + key] = val.float().numpy()
    for pname, p in layer64.named_parameters():
        tensors["dparam/" + pname] = p.grad.numpy()
    same = inputs[0] is inputs[1]
    tensors.update(query=q.numpy(), key=k.numpy(), value=v.numpy(), grad_out=grad_out.numpy())
    # self-attention with one tensor: torch's gradient of that tensor is the sum of the three roles
    tensors["d_query"] = inputs[0].grad.numpy()
    if not same:
        tensors["d_key"] = inputs[1].grad.numpy()
        tensors["d_value"] = inputs[2].grad.numpy()
    for key, val in kwargs.items():
        if isinstance(val, torch.Tensor):
            tensors[key] = val.numpy()
    for key, val in tensors.items():  # every configuration keeps a key per row: no NaN gradients
        assert val.dtype == bool or np.isfinite(val).all(), (name, key)
    options = {"ctor": ctor, "forward": {k_: v_ for k_, v_ in fwd.items()}, "same_input": same}
    save_file(tensors, os.path.join(OUT, name + ".safetensors"), metadata={"options": json.dumps(options)})


def random_configs(count):
    """`count` more configurations drawn from one seeded stream: embed dims and heads, bias,
    batch-first or not, self or cross attention (kdim/vdim), masks, the causal hint, unbatched."""
    rng = np.random.default_rng(20261125)
    out = []
    for i in range(count):
        heads = int(rng.choice([1, 2, 4]))
        e = heads * int(rng.choice([2, 4, 8]))
        ctor = dict(embed_dim=e, num_heads=heads)
        if rng.random() < 0.25:
            ctor["bias"] = False
        if rng.random() < 0.5:
            ctor["batch_first"] = True
        cross = rng.random() < 0.5
        if cross and rng.random() < 0.5:
            ctor["kdim"], ctor["vdim"] = int(rng.integers(3, 12)), int(rng.integers(3, 12))
        l, s = int(rng.integers(1, 8)), int(rng.integers(1, 9))
        if not cross:
            s = l  # self-attention: the keys are the queries
        n = None if rng.random() < 0.15 else int(rng.integers(1, 4))
        masks, fwd = [], {}
        kind = rng.choice(["none", "key_padding", "float_attn", "bool3d_attn", "causal"])
        if kind == "causal" and not cross:
            masks, fwd = ["causal_attn"], dict(is_causal=True, need_weights=False)
        elif kind == "key_padding" and n is not None and s > 2:
            masks = ["key_padding"]
        elif kind == "float_attn":
            masks = ["float_attn"]
        elif kind == "bool3d_attn" and n is not None:
            masks = ["bool3d_attn"]
        name = f"random_{i:02d}" if cross else f"self_random_{i:02d}"
        out.append((name, ctor, (l, s, n), fwd, tuple(masks)))
    return out


# Appended after the 50 above (their files and seeds unchanged): add_bias_kv (parameters bias_k,
# bias_v [1, 1, E]) and add_zero_attn (a zero key/value row; the masks get an allowed column).
EXTRA_CONFIGS = [
    ("self_bias_kv_batch_first", dict(embed_dim=16, num_heads=4, add_bias_kv=True, batch_first=True), (5, 5, 2),
     {}, ()),
    ("zero_attn_kdim_vdim_masks", dict(embed_dim=12, num_heads=3, add_zero_attn=True, kdim=7, vdim=5), (4, 6, 3),
     {}, ("key_padding", "float_attn")),
    ("bias_kv_zero_attn_no_bias_masks", dict(embed_dim=8, num_heads=2, bias=False, add_bias_kv=True,
                                             add_zero_attn=True), (4, 7, 2), {}, ("key_padding", "bool3d_attn")),
    ("bias_kv_kdim_vdim_batch_first", dict(embed_dim=8, num_heads=2, add_bias_kv=True, kdim=6, vdim=9,
                                           batch_first=True), (3, 5, 2), {}, ("float_attn",)),
    ("unbatched_bias_kv_zero_attn", dict(embed_dim=8, num_heads=2, add_bias_kv=True, add_zero_attn=True), (3, 5, None),
     {}, ("float_attn",)),
    ("causal_bias_kv", dict(embed_dim=8, num_heads=2, add_bias_kv=True, batch_first=True), (6, 6, 2),
     dict(is_causal=True, need_weights=False), ("causal_attn",)),
    ("causal_zero_attn_weights", dict(embed_dim=8, num_heads=2, add_zero_attn=True), (5, 5, 2),
     dict(is_causal=True), ("causal_attn",)),
    ("zero_attn_padded_row", dict(embed_dim=8, num_heads=2, add_zero_attn=True, batch_first=True), (3, 4, 2), {},
     ("key_padding_all",)),
    ("bias_kv_padded_row_kdim", dict(embed_dim=8, num_heads=4, add_bias_kv=True, kdim=5, vdim=5), (2, 4, 3), {},
     ("key_padding_all", "float_attn")),
    ("self_zero_attn_bool3d", dict(embed_dim=12, num_heads=2, add_zero_attn=True), (4, 4, 2), {}, ("bool3d_attn",)),
    ("bias_kv_zero_attn_one_key", dict(embed_dim=4, num_heads=1, add_bias_kv=True, add_zero_attn=True), (1, 1, 1),
     {}, ()),
]


if __name__ == "__main__":
    OUT = sys.argv[1]
    os.makedirs(OUT, exist_ok=True)
    configs = CONFIGS + random_configs(44) + EXTRA_CONFIGS
    for i, (name, ctor, dims, fwd, masks) in enumerate(configs):
        make(name, ctor, dims, fwd, masks, 100 + i)
    print(f"wrote {len(configs)} fixtures to {OUT}")
