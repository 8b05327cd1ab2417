"""qkv.scaled_dot_product_attention_varlen on the CPU: each packed sequence against
NumPy float64 attention of that sequence alone (tests/python/oracles.py), and the
checks of the packing."""

import numpy as np
import pytest

import qkv
from oracles import sdpa_float64


def _packed(lengths, heads, d, rng, dtype=np.float32):
    return rng.standard_normal((sum(lengths), heads, d)).astype(dtype)


@pytest.mark.parametrize("causal,hq,hk", [(False, 2, 2), (True, 4, 2), (True, 3, 3)])
def test_each_sequence_matches_float64_attention_alone(causal, hq, hk):
    rng = np.random.default_rng(7)
    lq, lk = [3, 0, 37, 1, 64], [5, 4, 21, 1, 80]
    q, k, v = _packed(lq, hq, 16, rng), _packed(lk, hk, 16, rng), _packed(lk, hk, 8, rng)
    cq = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    ck = np.concatenate([[0], np.cumsum(lk)]).astype(np.int64)
    out, lse = qkv.scaled_dot_product_attention_varlen(
        q, k, v, cq, ck, is_causal=causal, enable_gqa=hq != hk, scale=0.4, return_logsumexp=True)
    assert out.shape == (sum(lq), hq, 8) and out.dtype == np.float32
    assert lse.shape == (hq, sum(lq))
    for s in range(len(lq)):
        if lq[s] == 0:
            continue
        qs, ks, vs = (x[a:b].transpose(1, 0, 2).astype(np.float64)
                      for x, a, b in ((q, cq[s], cq[s + 1]), (k, ck[s], ck[s + 1]), (v, ck[s], ck[s + 1])))
        want, _ = sdpa_float64(qs, ks, vs, causal=causal, scale=0.4, gqa=hq != hk)
        got = out[cq[s]:cq[s + 1]].transpose(1, 0, 2)
        np.testing.assert_allclose(got, want, atol=2e-6, rtol=1e-5)
        scores = np.einsum("hid,hjd->hij", qs, np.repeat(ks, hq // hk, axis=0)) * 0.4
        if causal:
            scores = np.where(np.tril(np.ones(scores.shape[1:], bool)), scores, -np.inf)
        want_lse = np.log(np.exp(scores - scores.max(-1, keepdims=True)).sum(-1)) + scores.max(-1)
        np.testing.assert_allclose(lse[:, cq[s]:cq[s + 1]], want_lse, atol=1e-5, rtol=1e-5)


def test_bad_packing_is_a_clear_error():
    q = np.zeros((6, 2, 8), np.float32)
    k = np.zeros((5, 2, 8), np.float32)
    with pytest.raises(ValueError, match="cu_seqlens_k must end at the packed length 5"):
        qkv.scaled_dot_product_attention_varlen(q, k, k, np.array([0, 6]), np.array([0, 4]))
    with pytest.raises(ValueError, match="must start at 0 and not decrease"):
        qkv.scaled_dot_product_attention_varlen(q, k, k, np.array([0, 4, 2, 6]), np.array([0, 1, 2, 5]))
    with pytest.raises(TypeError, match="int32 or int64"):
        qkv.scaled_dot_product_attention_varlen(q, k, k, np.array([0.0, 6.0]), np.array([0, 5]))
    with pytest.raises(ValueError, match=r"must be \[T, H, D\]"):
        qkv.scaled_dot_product_attention_varlen(q[None], k, k, np.array([0, 6]), np.array([0, 5]))


def test_errors_name_the_varlen_call_and_an_empty_head_size_works():
    rng = np.random.default_rng(3)
    q, k = _packed([2, 4], 2, 8, rng), _packed([3, 2], 2, 8, rng)
    cq, ck = np.array([0, 2, 6]), np.array([0, 3, 5])
    with pytest.raises(TypeError, match=r"scaled_dot_product_attention_varlen: q, k and v must share one floating"):
        qkv.scaled_dot_product_attention_varlen(q.astype(np.float16), k, k, cq, ck)
    with pytest.raises(ValueError, match=r"scaled_dot_product_attention_varlen: scale must be finite"):
        qkv.scaled_dot_product_attention_varlen(q, k, k, cq, ck, scale=float("inf"))
    # head size 0: every score is 0, each query the mean of its sequence's values (the plain call's answer)
    v = _packed([3, 2], 2, 4, rng)
    out = qkv.scaled_dot_product_attention_varlen(q[:, :, :0], k[:, :, :0], v, cq, ck)
    np.testing.assert_allclose(out[:2], np.broadcast_to(v[:3].mean(0), (2, 2, 4)), atol=1e-6)
    np.testing.assert_allclose(out[2:], np.broadcast_to(v[3:].mean(0), (4, 2, 4)), atol=1e-6)
