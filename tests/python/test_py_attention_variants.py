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


def favor_oracle(q, k, v, w, causal):
    """FAVOR+ in float64 log space: weight(i, j) = sum_r exp(a_ir + b_jr), log phi(x) = W x' - |x'|^2/2
    (x' = x / D^(1/4)); finite at any input scale (exp(-|x'|^2 / 2) is 0 in float64 for |x'| > 39)."""
    q, k, v = (np.asarray(t, np.float64) for t in (q, k, v))
    s = q.shape[-1] ** -0.25

    def log_phi(x):
        return (x * s) @ w.T - ((x * s) ** 2).sum(-1, keepdims=True) / 2

    e = log_phi(q)[..., :, None, :] + log_phi(k)[..., None, :, :]  # [..., Lq, Lk, m]
    top = e.max(-1)
    logw = np.log(np.exp(e - top[..., None]).sum(-1)) + top  # [..., Lq, Lk]
    if causal:
        logw = np.where(np.tril(np.ones(logw.shape[-2:], bool)), logw, -np.inf)
    wts = np.exp(logw - logw.max(-1, keepdims=True))
    return (wts @ v) / wts.sum(-1, keepdims=True)


@pytest.mark.parametrize("causal", [False, True])
def test_favor_matches_a_numpy_oracle_of_its_features(causal):
    q, k, v = (rng.standard_normal((2, 2, 40, 8)) for _ in range(3))
    w = qkv.attention.favor_random_features(8, 24, seed=5)
    assert w.shape == (24, 8) and w.dtype == np.float64
    got = qkv.attention.linear(q, k, v, is_causal=causal, feature_map="favor", num_features=24, seed=5, chunk=7)
    np.testing.assert_allclose(got, favor_oracle(q, k, v, w, causal), rtol=0, atol=1e-12)


# Performer's positive features at inputs of std 8-50 (exponents in the hundreds to tens of thousands): NaN
# rows in float32 before each feature's key maximum was subtracted (early causal rows from std 6, any row
# from std 16; the float64 path too at 50). Now finite and the float64 oracle's to float32's rounding of
# those exponents. f16 and bf16 inputs compute in float32.
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("sigma,bound", [(8, 1e-4), (16, 3e-4), (50, 2e-3)])
def test_favor_is_finite_and_exact_at_large_inputs(causal, sigma, bound):
    import ml_dtypes
    d = 64
    q, k = (sigma * rng.standard_normal((1, 2, 128, d)) for _ in range(2))
    v = rng.standard_normal((1, 2, 128, 8))
    w = qkv.attention.favor_random_features(d, 2 * d, seed=9)
    for dt, tol in ((np.float32, bound), (np.float16, max(bound, 2e-3)), (ml_dtypes.bfloat16, 1e-2)):
        tq, tk, tv = (t.astype(dt) for t in (q, k, v))
        got = qkv.attention.linear(tq, tk, tv, is_causal=causal, feature_map="favor", seed=9)
        assert got.dtype == dt and np.isfinite(got.astype(np.float64)).all()
        want = favor_oracle(tq, tk, tv, w, causal)
        err = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
        assert err <= tol, (dt, err)


def test_favor_single_rows_of_large_norm():
    # the first key 40x (the first causal row's only key, whose features underflow beside later ones') and a
    # query 300x (its features peak where every key is far below the column's largest)
    q, k = (rng.standard_normal((1, 64, 16)) for _ in range(2))
    v = rng.standard_normal((1, 64, 4))
    k[:, 0] *= 40
    q[:, 3] *= 300
    w = qkv.attention.favor_random_features(16, 32, seed=1)
    for causal in (False, True):
        got = qkv.attention.linear(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32),
                                   is_causal=causal, feature_map="favor", seed=1)
        want = favor_oracle(q.astype(np.float32), k.astype(np.float32), v.astype(np.float32), w, causal)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * np.abs(want).max())


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
