"""qkv.attention.* (the seed 002 family as functions) against NumPy written from each formula."""
import numpy as np
import pytest

import qkv

rng = np.random.default_rng(7)


def softmax_attention(q, k, v, allowed=None, scale=None):
    s = q @ np.swapaxes(k, -1, -2) * (1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    return (w / w.sum(-1, keepdims=True)) @ v


def phi(x):
    return np.where(x > 0, x + 1, np.exp(x))  # elu + 1


@pytest.mark.parametrize("causal", [False, True])
def test_linear_matches_its_formula(causal):
    q, k, v = (rng.standard_normal((2, 3, 50, 8)) for _ in range(3))
    s = phi(q) @ np.swapaxes(phi(k), -1, -2)
    if causal:
        s = np.tril(s)
    want = (s @ v) / s.sum(-1, keepdims=True)
    np.testing.assert_allclose(qkv.attention.linear(q, k, v, is_causal=causal, chunk=7), want, atol=1e-12)
    got32 = qkv.attention.linear(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), is_causal=causal)
    assert got32.dtype == np.float32
    np.testing.assert_allclose(got32, want, atol=2e-5)


def test_favor_approaches_softmax_attention_as_features_grow():
    q, k, v = (rng.standard_normal((1, 2, 64, 16)) * 0.5 for _ in range(3))
    exact = softmax_attention(q, k, v)
    errors = [np.abs(qkv.attention.linear(q, k, v, feature_map="favor", num_features=m, seed=1) - exact).mean()
              for m in (16, 256, 4096)]
    assert errors[0] > errors[1] > errors[2] and errors[2] < 0.01, errors


def test_additive_is_keras_formula():
    q, k, v = rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 7, 4)), rng.standard_normal((2, 7, 3))
    scale = rng.standard_normal(4)
    mask = np.ones((2, 7), bool)
    mask[1, 4:] = False
    s = (np.tanh(q[:, :, None, :] + k[:, None, :, :]) * scale).sum(-1)
    s = s - 1e9 * (~mask[:, None, :])
    w = np.exp(s - s.max(-1, keepdims=True))
    want = (w / w.sum(-1, keepdims=True)) @ v
    got = qkv.attention.additive(q, k, v, scale=scale, value_mask=mask)
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_windowed_functions_and_dot_product():
    q, k, v = (rng.standard_normal((1, 2, 40, 8)) for _ in range(3))
    i, j = np.arange(40)[:, None], np.arange(40)[None, :]
    np.testing.assert_allclose(qkv.attention.window(q, k, v, 4), softmax_attention(q, k, v, (j <= i) & (j >= i - 4)),
                               atol=1e-12)
    np.testing.assert_allclose(qkv.attention.window(q, k, v, 2, 3, softcap=50.0),
                               qkv.scaled_dot_product_attention(q, k, v, mods=qkv.AttentionMods(
                                   window_left=2, window_right=3, softcap=50.0)), atol=0)
    lf = (np.abs(j - i) <= 2) | np.isin(i, [0, 9]) | np.isin(j, [0, 9])
    np.testing.assert_allclose(qkv.attention.longformer(q, k, v, 2, 2, [0, 9]), softmax_attention(q, k, v, lf),
                               atol=1e-12)
    np.testing.assert_allclose(qkv.attention.prefix_lm(q, k, v, 6), softmax_attention(q, k, v, (j <= i) | (j < 6)),
                               atol=1e-12)
    np.testing.assert_allclose(qkv.attention.dot_product(q, k, v), softmax_attention(q, k, v, scale=1.0), atol=1e-12)
    out = qkv.attention.bigbird(q, k, v, 8, random=1, seed=3)
    assert out.shape == (1, 2, 40, 8) and np.isfinite(out).all()


def test_errors_name_the_function_and_argument():
    q = rng.standard_normal((1, 4, 8))
    with pytest.raises(ValueError, match="linear_attention: feature_map must be 'elu' or 'favor', got 'relu'"):
        qkv.attention.linear(q, q, q, feature_map="relu")
    with pytest.raises(ValueError, match="linear_attention: chunk"):
        qkv.attention.linear(q, q, q, is_causal=True, chunk=0)
    with pytest.raises(ValueError, match="additive_attention"):
        qkv.attention.additive(q, rng.standard_normal((1, 4, 5)), q)
