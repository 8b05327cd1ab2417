"""qkv.nn layers' attention= choice (issue 16 item 7) and the seed layers' cache= (issue 17 item 3).

Each choice through MultiheadAttention and KerasMultiHeadAttention equals the layer's own
projections (done here in NumPy from its weights) composed with the standalone qkv.attention
function; what a choice cannot do is a ValueError; Keras mods equal the dense mask. The seed
layers generate 64 tokens one by one against a qkv.KVCache and match the full causal forward."""

import numpy as np
import pytest

import qkv

rng = np.random.default_rng(17)


def torch_by_hand(mha, x_q, x_kv, fn):
    """torch.nn.MultiheadAttention's projections (batch_first) around fn(q, k, v) on [N, H, L, D]."""
    sd = mha.state_dict()
    e, h = x_q.shape[-1], 4
    w, b = sd["in_proj_weight"], sd["in_proj_bias"]

    def heads(part, x):
        p = x @ w[part * e:(part + 1) * e].T + b[part * e:(part + 1) * e]  # [N, L, E]
        return p.reshape(p.shape[0], p.shape[1], h, e // h).transpose(0, 2, 1, 3).astype(np.float32)

    o = fn(heads(0, x_q), heads(1, x_kv), heads(2, x_kv))  # [N, H, L, D]
    merged = o.transpose(0, 2, 1, 3).reshape(x_q.shape)
    return merged @ sd["out_proj.weight"].T + sd["out_proj.bias"]


def biased_mha():
    mha = qkv.nn.MultiheadAttention(16, 4, batch_first=True)
    sd = mha.state_dict()
    sd["in_proj_bias"] = rng.standard_normal(48).astype(np.float32)
    sd["out_proj.bias"] = rng.standard_normal(16).astype(np.float32)
    mha.load_state_dict(sd)
    return mha


LSH = {"n_hashes": 2, "n_buckets": 4, "chunk_length": 8, "seed": 3}


@pytest.mark.parametrize("attention, options, self_attention, fn", [
    ("linear", None, False, lambda q, k, v: qkv.attention.linear(q, k, v)),
    ("linear", {"is_causal": True, "chunk": 5}, True, lambda q, k, v: qkv.attention.linear(q, k, v, is_causal=True,
                                                                                           chunk=5)),
    ("performer", {"num_features": 32, "seed": 9}, False,
     lambda q, k, v: qkv.attention.linear(q, k, v, feature_map="favor", num_features=32, seed=9)),
    ("lsh", LSH, True, lambda q, k, v: qkv.attention.lsh(q, v, **LSH)),
    ("lsh", dict(LSH, is_causal=True), True, lambda q, k, v: qkv.attention.lsh(q, v, is_causal=True, **LSH)),
])
def test_torch_layer_choice_equals_its_projections_with_the_standalone_function(attention, options, self_attention,
                                                                              fn):
    mha = biased_mha()
    x = rng.standard_normal((2, 32, 16)).astype(np.float32)
    y = x if self_attention else rng.standard_normal((2, 32, 16)).astype(np.float32)
    out, w = mha(x, y, y, need_weights=False, attention=attention, attention_options=options)
    assert w is None
    np.testing.assert_allclose(out, torch_by_hand(mha, x, y, fn), atol=2e-5)
    softmax, _ = mha(x, y, y, need_weights=False)
    assert np.abs(out - softmax).max() > 1e-3  # the choice really changes the attention


def test_torch_layer_choice_errors():
    mha = biased_mha()
    x, y = rng.standard_normal((2, 16, 16)).astype(np.float32), rng.standard_normal((2, 16, 16)).astype(np.float32)
    with pytest.raises(ValueError, match="attention=linear does not support need_weights"):
        mha(x, x, x, attention="linear")
    with pytest.raises(ValueError, match="attention=linear does not support attn_mask"):
        mha(x, x, x, need_weights=False, attn_mask=np.zeros((16, 16), bool), attention="linear")
    with pytest.raises(ValueError, match="attention=lsh uses the query projection as Reformer's shared query-key"):
        mha(x, y, y, need_weights=False, attention="lsh")
    with pytest.raises(ValueError, match="MultiheadAttention.backward: attention=linear is forward-only"):
        mha.backward(x, x, x, x, need_weights=False, attention="performer")
    with pytest.raises(ValueError, match="attention must be 'softmax', 'linear', 'performer' or 'lsh', got 'flash'"):
        mha(x, x, x, need_weights=False, attention="flash")
    with pytest.raises(ValueError, match=r"attention_options\['n_hashes'\]: no such option of linear attention"):
        mha(x, x, x, need_weights=False, attention="linear", attention_options={"n_hashes": 2})
    with pytest.raises(ValueError, match=r"attention_options\['is_causal'\]: the softmax attention takes only "
                                         "matmul_precision"):
        mha(x, x, x, need_weights=False, attention_options={"is_causal": True})
    with pytest.raises(ValueError, match=r"attention_options\['matmul_precision'\] must be 'highest', 'high' or "
                                         "'medium', got 'low'"):
        mha(x, x, x, need_weights=False, attention_options={"matmul_precision": "low"})


def keras_by_hand(layer, query, value, fn):
    """keras.layers.MultiHeadAttention's EinsumDense projections around fn(q, k, v) on [B, N, T, d]."""
    qk, qb, kk, kb, vk, vb, ok, ob = layer.get_weights()
    heads = lambda x, k, b: (np.einsum("btd,dnk->bntk", x, k) + b[:, None, :]).astype(np.float32)  # noqa: E731
    o = fn(heads(query, qk, qb), heads(value, kk, kb), heads(value, vk, vb))  # [B, N, T, vd]
    return np.einsum("bntk,nko->bto", o, ok) + ob


@pytest.mark.parametrize("attention, options, fn", [
    ("linear", None, lambda q, k, v: qkv.attention.linear(q, k, v)),
    ("performer", {"num_features": 24, "seed": 4},
     lambda q, k, v: qkv.attention.linear(q, k, v, feature_map="favor", num_features=24, seed=4)),
    ("lsh", LSH, lambda q, k, v: qkv.attention.lsh(q, v, **LSH)),
])
def test_keras_layer_choice_equals_its_projections_with_the_standalone_function(attention, options, fn):
    layer = qkv.nn.KerasMultiHeadAttention(num_heads=2, key_dim=4)
    x = rng.standard_normal((2, 16, 12)).astype(np.float32)
    layer(x, x)  # builds it
    layer.set_weights([w if i % 2 == 0 else rng.standard_normal(w.shape).astype(np.float32)
                       for i, w in enumerate(layer.get_weights())])
    np.testing.assert_allclose(layer(x, x, attention=attention, attention_options=options),
                               keras_by_hand(layer, x, x, fn), atol=2e-5)


def test_keras_use_causal_mask_makes_the_choice_causal_and_errors():
    layer = qkv.nn.KerasMultiHeadAttention(num_heads=2, key_dim=4)
    x, y = rng.standard_normal((2, 16, 8)).astype(np.float32), rng.standard_normal((2, 16, 8)).astype(np.float32)
    np.testing.assert_array_equal(layer(x, x, use_causal_mask=True, attention="linear"),
                                  layer(x, x, attention="linear", attention_options={"is_causal": True}))
    with pytest.raises(ValueError, match="attention=linear does not support return_attention_scores"):
        layer(x, x, return_attention_scores=True, attention="linear")
    with pytest.raises(ValueError, match="attention=lsh uses the query projection"):
        layer(x, y, attention="lsh")
    with pytest.raises(ValueError, match="KerasMultiHeadAttention.backward: attention=lsh is forward-only"):
        layer.backward(x, x, x, attention="lsh")


def test_keras_mods_equal_the_dense_mask_forward_and_backward():
    layer = qkv.nn.KerasMultiHeadAttention(num_heads=2, key_dim=4)
    x, g = rng.standard_normal((2, 12, 8)).astype(np.float32), rng.standard_normal((2, 12, 8)).astype(np.float32)
    i, j = np.arange(12)[:, None], np.arange(12)[None, :]
    mask = np.broadcast_to((j >= i - 2) & (j <= i + 1), (2, 12, 12))  # True = attend
    mods = qkv.AttentionMods(window_left=2, window_right=1)
    with_mods, with_mask = layer(x, x, mods=mods), layer(x, x, attention_mask=mask)
    np.testing.assert_allclose(with_mods, with_mask, atol=2e-6)
    assert np.abs(with_mods - layer(x, x)).max() > 1e-3
    a, b = layer.backward(x, x, g, mods=mods), layer.backward(x, x, g, attention_mask=mask)
    np.testing.assert_allclose(a[0], b[0], atol=1e-5)
    for name in a[3]:
        np.testing.assert_allclose(a[3][name], b[3][name], atol=1e-5)


def generate(layer_call, full_causal, e, prefill=4, steps=64):
    """Tokens one by one (each step's last output plus fresh noise is the next token); the worst
    difference to the full causal forward over the generated sequence at every step."""
    seq = [rng.standard_normal((2, prefill, e)).astype(np.float32)]
    outs = [layer_call(seq[0])]
    for _ in range(steps):
        seq.append((outs[-1][:, -1:] + rng.standard_normal((2, 1, e))).astype(np.float32))
        outs.append(layer_call(seq[-1]))
    full = full_causal(np.concatenate(seq, axis=1))
    return np.abs(np.concatenate(outs, axis=1) - full).max()


def test_seed_layers_generate_64_tokens_against_a_cache():
    causal = lambda t: np.triu(np.ones((t, t), bool), 1)  # noqa: E731 (True = masked)
    sa, cache = qkv.nn.SelfAttention(8, seed=1), qkv.KVCache(2, 1, 8, 68)
    assert generate(lambda x: sa(x, cache=cache), lambda x: sa(x, causal(x.shape[1])), 8) <= 1e-6
    assert cache.lengths == [68, 68]
    mh, cache = qkv.nn.MultiHeadSelfAttention(12, heads=3, dim_head=5, seed=2), qkv.KVCache(2, 3, 5, 68)
    assert generate(lambda x: mh(x, cache=cache), lambda x: mh(x, causal(x.shape[1])), 12) <= 1e-6
    sh = qkv.nn.SeparateHeadsAttention(6, 4, d_kq=5, d_v=3, scale=0.3, causal=True, seed=3)
    cache = qkv.KVCache(2, 4, 5, 68, value_dim=3)

    def step(x):
        out, scores = sh(x, x, x, cache=cache)
        assert scores is None
        return out
    assert generate(step, lambda x: sh(x, x, x)[0], 6) <= 1e-6
    x = np.zeros((2, 1, 6), np.float32)
    with pytest.raises(ValueError, match="the layer is not causal"):
        qkv.nn.SeparateHeadsAttention(6, 2)(x, x, x, cache=qkv.KVCache(2, 2, 3, 8))
    with pytest.raises(ValueError, match="with a cache, k and v must be q itself"):
        sh(x, x.copy(), x, cache=cache)
    with pytest.raises(ValueError, match="with a cache the attention is causal; pass no mask"):
        sa(np.zeros((2, 1, 8), np.float32), np.zeros((1, 1), bool), cache=cache)
