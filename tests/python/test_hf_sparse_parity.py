"""Hugging Face transformers' LongformerSelfAttention and BigBirdBlockSparseAttention (tests/fixtures/hf_sparse,
tests/attention/make_hf_sparse_fixtures.py, transformers 5.24, float32) from qkv: projections with qkv.einsum,
attention with qkv.scaled_dot_product_attention and qkv.AttentionMods, within 1e-5 relative of HF's outputs
(the C++ side: tests/attention/hf_sparse_parity_test.cc; semantics in docs/attention-variants.md)."""
import json
import pathlib

import numpy as np
import pytest

import qkv

DIR = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "hf_sparse"


def load(name):
    from safetensors import safe_open

    with safe_open(str(DIR / f"{name}.safetensors"), "np") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, json.loads(f.metadata()["options"])


def project(t, name, x, heads):
    """x [B, L, E] through HF's nn.Linear `name` -> [B, H, L, D]."""
    y = qkv.einsum("ble,fe->blf", x, t[f"{name}.weight"]) + t[f"{name}.bias"]
    b, l, e = y.shape
    return np.ascontiguousarray(y.reshape(b, l, heads, e // heads).transpose(0, 2, 1, 3))


def merged(y):
    """[B, H, L, D] -> [B, L, H * D] (HF's output layout)."""
    b, h, l, d = y.shape
    return np.asarray(y).transpose(0, 2, 1, 3).reshape(b, l, h * d)


def relative_error(t, got):
    """Padded query rows are zeros in HF; then max |got - HF| / max |HF|."""
    got = np.where(t["padding"][..., None] != 0, got, 0.0)
    return np.max(np.abs(got - t["out"])) / np.max(np.abs(t["out"]))


def longformer(t, o, one_sided):
    h, out = o["num_heads"], []
    for b in range(t["hidden"].shape[0]):  # global tokens differ per entry; qkv's are per call
        x = t["hidden"][b:b + 1]
        globals_ = [int(g) for g in np.flatnonzero(t["global"][b])]
        keys = (t["padding"][b] != 0)[None, None, None, :]  # [1, 1, 1, L]
        mods = qkv.AttentionMods.longformer(one_sided, one_sided, globals_)
        y = merged(qkv.scaled_dot_product_attention(project(t, "query", x, h), project(t, "key", x, h),
                                                    project(t, "value", x, h), attn_mask=keys, mods=mods))
        if globals_:  # global rows: every key, through the *_global projections
            qg = project(t, "query_global", x, h)[:, :, globals_]
            yg = qkv.scaled_dot_product_attention(qg, project(t, "key_global", x, h),
                                                  project(t, "value_global", x, h), attn_mask=keys)
            y = y.copy()
            y[:, globals_] = merged(yg)
        out.append(y[0])
    return np.stack(out)


@pytest.mark.parametrize("name", ["longformer", "longformer_wide", "longformer_no_global"])
def test_longformer_self_attention(name):
    t, o = load(name)
    one_sided = o["attention_window"] // 2  # HF: attention_window is the whole window, w/2 each side
    assert relative_error(t, longformer(t, o, one_sided)) <= 1e-5
    assert relative_error(t, longformer(t, o, 2 * one_sided)) > 1e-3


def bigbird(t, o, counts=True):
    """Window +-1 block, first/last block global, HF's random blocks per head (block_pattern
    [H, nb, nb]); where HF gathers a key block twice (eval: block 0, 1 + r times) its score gets
    + log(count), through a float attn_mask (Python has no score_mod)."""
    x, h, u = t["hidden"], o["num_heads"], o["block_size"]
    b, l, _ = x.shape
    nb, ra = l // u, t["rand_attn"]  # [H, nb - 2, r]
    pattern = np.zeros((h, nb, nb), bool)
    count = np.zeros((h, nb, nb))
    for qb in range(1, nb - 1):
        count[:, qb, sorted({0, qb - 1, qb, qb + 1, nb - 1})] = 1
        for head in range(h):
            for kb in ra[head, qb - 1]:
                pattern[head, qb, kb] = True
                count[head, qb, kb] += 1
    mods = qkv.AttentionMods.bigbird(u, 1, 0, 0, l)
    mods.block_pattern = pattern
    keys = (t["padding"] != 0)[:, None, None, :]  # [B, 1, 1, L]
    mask = keys
    if counts and (count > 1).any():
        bias = np.kron(np.log(np.maximum(count, 1)), np.ones((u, u)))  # [H, L, L]
        mask = np.where(keys, bias[None], -np.inf).astype(np.float32)
    y = qkv.scaled_dot_product_attention(*(project(t, n, x, h) for n in ("query", "key", "value")),
                                         attn_mask=mask, mods=mods)
    return merged(y)


@pytest.mark.parametrize("name", ["bigbird_eval", "bigbird_train", "bigbird_train_r3"])
def test_bigbird_block_sparse_attention(name):
    t, o = load(name)
    assert relative_error(t, bigbird(t, o)) <= 1e-5
    if name == "bigbird_eval":  # the mask alone, without HF's repeated block 0, is not the layer
        assert relative_error(t, bigbird(t, o, counts=False)) > 1e-3
