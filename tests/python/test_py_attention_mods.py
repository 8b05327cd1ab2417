"""qkv.AttentionMods through qkv.scaled_dot_product_attention (mods=) against NumPy: the mask and
biases written out from the definitions (python/qkv/mods.py) and float64 softmax attention, and
seed 002's masked_fill(mask == 0, -1e9) formula."""
import numpy as np
import pytest

import qkv

M = qkv.AttentionMods


def allowed(m, lq, lk):
    """Dense [Lq, Lk] bool from the definitions (documents AND the OR group of set terms)."""
    i, j = np.arange(lq)[:, None], np.arange(lk)[None, :]
    terms = []
    u = m.block_size
    if m.window_left is not None or m.window_right is not None or m.dilation > 1:
        d = i + (lk - lq if m.align == "bottom_right" else 0)
        delta = j // u - d // u
        ok = delta % m.dilation == 0
        if m.window_left is not None:
            ok = ok & (delta >= -m.window_left)
        if m.window_right is not None:
            ok = ok & (delta <= m.window_right)
        terms.append(ok)
    if m.prefix:
        terms.append(np.broadcast_to(j < m.prefix, (lq, lk)))
    if len(m.global_tokens):
        g = np.asarray(m.global_tokens)
        terms.append(np.isin(i, g) | np.isin(j, g))
    if m.block_pattern is not None:
        terms.append(np.asarray(m.block_pattern)[i // u, j // u])
    out = np.logical_or.reduce(terms) if terms else np.ones((lq, lk), bool)
    if m.document_ids is not None:
        kd = m.key_document_ids if m.key_document_ids is not None else m.document_ids
        out = out & (np.asarray(m.document_ids)[:, None] == np.asarray(kd)[None, :])
    return out


def numpy_attention(q, k, v, m):
    """float64 attention with the modifiers, from the definitions."""
    q, k, v = (x.astype(np.float64) for x in (q, k, v))
    lq, lk, h = q.shape[-2], k.shape[-2], q.shape[-3]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if m.softcap:
        s = m.softcap * np.tanh(s / m.softcap)
    d = np.arange(lq)[:, None] + (lk - lq if m.align == "bottom_right" else 0)
    if m.alibi_slopes is not None:
        s = s + np.asarray(m.alibi_slopes, np.float64)[:, None, None] * (np.arange(lk)[None, :] - d)
    if m.relative_bias is not None:
        rel = np.asarray(m.relative_bias, np.float64)
        idx = np.arange(lk)[None, :] - np.arange(lq)[:, None] + lq - 1
        s = s + rel[np.arange(h) if rel.shape[0] > 1 else [0] * h][:, idx]
    ok = allowed(m, lq, lk)
    s = np.where(ok, s, -np.inf if m.masked_fill is None else m.masked_fill)
    mx = s.max(-1, keepdims=True)
    mx = np.where(np.isfinite(mx), mx, 0)
    w = np.exp(s - mx)
    w = w / np.maximum(w.sum(-1, keepdims=True), 1e-300)
    return w @ v


rng = np.random.default_rng(0)
CASES = [
    ("causal_br", 40, 70, M.causal("bottom_right")),
    ("window", 96, 96, M.sliding_window(10, 3)),
    ("dilated", 64, 64, M(window_left=30, window_right=0, dilation=3)),
    ("prefix_lm", 80, 80, M.prefix_lm(13)),
    ("longformer", 90, 90, M.longformer(5, 5, [0, 45, 89])),
    ("block_pattern", 64, 96, M(block_size=16, block_pattern=rng.random((4, 6)) > 0.6, window_left=0, window_right=0)),
    ("documents", 70, 70, M(document_ids=np.repeat([0, 1, 2], [20, 30, 20]), window_right=0)),
    ("alibi", 50, 50, M(window_right=0, alibi_slopes=np.array([0.5, 0.25], np.float32))),
    ("relative", 30, 45, M(relative_bias=rng.standard_normal((2, 74)))),
    ("softcap", 40, 40, M(softcap=1.5)),
]


@pytest.mark.parametrize("name,lq,lk,mods", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_mods_match_numpy(name, lq, lk, mods, dtype):
    q = rng.standard_normal((2, 2, lq, 16)).astype(dtype) * 2
    k = rng.standard_normal((2, 2, lk, 16)).astype(dtype)
    v = rng.standard_normal((2, 2, lk, 8)).astype(dtype)
    want = numpy_attention(q, k, v, mods)
    for fn in (qkv.scaled_dot_product_attention, qkv.attention_reference):
        got = fn(q, k, v, mods=mods)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12 if dtype == np.float64 else 3e-6)


def test_masked_fill_is_seed_002s_at_large_inputs():
    """seed 002: scores.masked_fill(mask == 0, -1e9) then softmax; at x1000 inputs an additive
    -1e9 no longer dominates, masked_fill still does; a fully masked row is uniform."""
    q = rng.standard_normal((1, 1, 6, 4)) * 1000
    k = rng.standard_normal((1, 1, 6, 4)) * 1000
    v = rng.standard_normal((1, 1, 6, 4))
    docs = np.array([0, 0, 1, 1, 1, 2])
    key_docs = np.array([0, 0, 1, 1, 1, 1])  # query 5's document has no key
    mods = M(document_ids=docs, key_document_ids=key_docs, masked_fill=-1e9)
    mask = docs[:, None] == key_docs[None, :]
    s = np.where(mask, q @ k.swapaxes(-1, -2) / 2.0, -1e9)
    w = np.exp(s - s.max(-1, keepdims=True))
    want = (w / w.sum(-1, keepdims=True)) @ v
    got = qkv.scaled_dot_product_attention(q, k, v, mods=mods)
    np.testing.assert_allclose(got, want, atol=1e-9)
    np.testing.assert_allclose(got[0, 0, 5], v[0, 0].mean(0), atol=1e-12)


def test_empty_keys_and_empty_relative_bias():
    """No keys under a window (Lk = 0) is the empty softmax (output 0, lse -inf), not a
    division by zero that killed the interpreter (SIGFPE); Lq = Lk = 0 takes a [H, 0]
    relative bias (Lq + Lk - 1 offsets, none here; it asked for [H, -1])."""
    q = rng.standard_normal((2, 1, 3, 8))
    k, v = np.zeros((2, 1, 0, 8)), np.zeros((2, 1, 0, 4))
    out, lse = qkv.scaled_dot_product_attention(q, k, v, mods=M.sliding_window(3, 0), return_logsumexp=True)
    np.testing.assert_array_equal(out, np.zeros((2, 1, 3, 4)))
    np.testing.assert_array_equal(lse, np.full((2, 1, 3), -np.inf))
    dq, dk, dv = qkv.scaled_dot_product_attention_backward(q, k, v, out, np.ones_like(out), lse,
                                                           mods=M.sliding_window(3, 0))
    np.testing.assert_array_equal(dq, np.zeros_like(q))
    assert dk.shape == k.shape and dv.shape == v.shape
    e = np.zeros((1, 2, 0, 8))
    out = qkv.scaled_dot_product_attention(e, e, e, mods=M(relative_bias=np.zeros((2, 0))))
    assert out.shape == (1, 2, 0, 8)


def test_gradients_through_mods_equal_those_through_the_dense_mask():
    q, k, v = (rng.standard_normal((1, 2, 48, 8)) for _ in range(3))
    mods = M.longformer(4, 4, [0, 20])
    bias = np.where(allowed(mods, 48, 48), 0.0, -np.inf)
    out, lse = qkv.scaled_dot_product_attention(q, k, v, mods=mods, return_logsumexp=True)
    g = rng.standard_normal(out.shape)
    got = qkv.scaled_dot_product_attention_backward(q, k, v, out, g, lse, mods=mods)
    out2, lse2 = qkv.scaled_dot_product_attention(q, k, v, attn_mask=bias, return_logsumexp=True)
    want = qkv.scaled_dot_product_attention_backward(q, k, v, out2, g, lse2, attn_mask=bias)
    for a, b in zip(got, want):
        np.testing.assert_allclose(a, b, atol=1e-12)


def test_bigbird_pattern_blocks_and_errors():
    mods = M.bigbird(16, 1, 2, 7, 128)
    assert mods.global_tokens[:2] == (0, 1) and mods.global_tokens[-1] == 127
    q = rng.standard_normal((1, 1, 128, 8))
    out, w = qkv.scaled_dot_product_attention(q, q, q, mods=mods, return_weights=True)
    blocks = (w[0, 0].reshape(8, 16, 8, 16) > 0).any(axis=(1, 3))
    assert blocks[0].all() and blocks[:, 0].all() and blocks[7].all()  # global first/last blocks
    assert np.all(blocks.sum(1)[1:-1] <= 3 + 2 + 2)  # window 3 + random 2 + 2 global
    with pytest.raises(TypeError, match="mods must be a qkv.AttentionMods"):
        qkv.scaled_dot_product_attention(q, q, q, mods={"prefix": 3})
    with pytest.raises(ValueError, match="mods.align must be 'top_left' or 'bottom_right'"):
        qkv.scaled_dot_product_attention(q, q, q, mods=M(align="left"))
    with pytest.raises(ValueError, match="mods.alibi_slopes must have shape"):
        qkv.scaled_dot_product_attention(q, q, q, mods=M(alibi_slopes=np.ones(3)))


FLEX = sorted((__import__("pathlib").Path(__file__).resolve().parents[1] / "fixtures" / "flex").glob("*.safetensors"))


@pytest.mark.parametrize("path", FLEX, ids=[p.stem for p in FLEX])
def test_mods_match_pytorch_flex_attention(path):
    """PyTorch FlexAttention's output and logsumexp (tests/attention/make_flex_fixtures.py: its
    mask_mod / score_mod functions, create_block_mask) from qkv's equivalent built-in modifiers."""
    import json

    from safetensors import safe_open

    with safe_open(str(path), "np") as f:
        fields = json.loads(f.metadata()["qkv_mods"])
        t = {name: f.get_tensor(name) for name in f.keys()}
    fields = {k: (t[v] if isinstance(v, str) and v in t else v) for k, v in fields.items()}
    mods = M(**fields)
    out, lse = qkv.scaled_dot_product_attention(t["q"], t["k"], t["v"], mods=mods, return_logsumexp=True)
    np.testing.assert_allclose(out, t["out"], rtol=0, atol=1e-12)
    np.testing.assert_allclose(lse, t["lse"], rtol=0, atol=1e-12)
    ref = qkv.attention_reference(t["q"], t["k"], t["v"], mods=mods)
    np.testing.assert_allclose(ref, t["out"], rtol=0, atol=1e-12)
    out32 = qkv.scaled_dot_product_attention(*(t[n].astype(np.float32) for n in "qkv"), mods=mods)
    np.testing.assert_allclose(out32, t["out"], rtol=0, atol=2e-5)


def test_mods_through_the_torch_flavour_layer_equal_the_dense_mask():
    mha = qkv.nn.MultiheadAttention(16, 2, batch_first=True)
    x = rng.standard_normal((2, 20, 16)).astype(np.float32)
    mods = M.longformer(3, 3, [0])
    blocked = ~allowed(mods, 20, 20)  # torch's convention: True = not allowed
    a, _ = mha(x, x, x, mods=mods, need_weights=False)
    b, _ = mha(x, x, x, attn_mask=blocked, need_weights=False)
    np.testing.assert_allclose(a, b, atol=2e-6)
    g = rng.standard_normal(a.shape).astype(np.float32)
    ga = mha.backward(x, x, x, g, need_weights=False, mods=mods)
    gb = mha.backward(x, x, x, g, need_weights=False, attn_mask=blocked)
    np.testing.assert_allclose(ga[0], gb[0], atol=1e-5)
