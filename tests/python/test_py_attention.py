"""qkv.attention_reference and qkv.scaled_dot_product_attention from Python.

Oracles: numpy in float64 (live) and PyTorch's SDPA through the committed
fixtures in tests/fixtures/sdpa (docs/testing.md).
"""
import json
import pathlib

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open

import qkv
from oracles import sdpa_float64

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "sdpa"
FUNCTIONS = [qkv.attention_reference, qkv.scaled_dot_product_attention]
TOL = {np.float32: 1e-6, np.float64: 1e-13}


def randn(rng, shape, dtype=np.float64):
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize(
    "shapes",
    [
        ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4)),  # Dk != Dv, Lq != Lk
        ((4, 8), (6, 8), (6, 3)),  # 2-D
        ((2, 1, 4, 5, 8), (1, 3, 4, 6, 8), (1, 3, 4, 6, 2)),  # 5-D, batch dims broadcast both ways
        ((3, 1, 16), (3, 33, 16), (3, 33, 16)),  # one query (decode step)
    ],
)
def test_matches_numpy_float64(fn, dtype, shapes):
    rng = np.random.default_rng(10)
    q, k, v = (randn(rng, s, dtype) for s in shapes)
    out = fn(q, k, v)
    expected, _ = sdpa_float64(q, k, v)
    assert isinstance(out, np.ndarray)
    assert out.dtype == dtype and out.shape == expected.shape
    np.testing.assert_allclose(out, expected, rtol=0, atol=TOL[dtype])


def test_return_weights_gives_output_and_weights():
    rng = np.random.default_rng(11)
    q, k, v = randn(rng, (2, 2, 5, 8)), randn(rng, (2, 2, 9, 8)), randn(rng, (2, 2, 9, 3))
    result = qkv.attention_reference(q, k, v, return_weights=True)
    assert isinstance(result, tuple) and len(result) == 2
    out, w = result
    expected, expected_w = sdpa_float64(q, k, v)
    assert w.shape == (2, 2, 5, 9)
    np.testing.assert_allclose(out, expected, rtol=0, atol=1e-13)
    np.testing.assert_allclose(w, expected_w, rtol=0, atol=1e-13)
    np.testing.assert_allclose(w.sum(axis=-1), 1.0, rtol=0, atol=1e-13)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_masks_causal_and_scale(fn):
    rng = np.random.default_rng(12)
    q, k, v = randn(rng, (2, 3, 4, 8)), randn(rng, (2, 3, 6, 8)), randn(rng, (2, 3, 6, 5))
    mask = rng.random((4, 6)) > 0.4
    mask[2] = False  # a fully masked row gives zeros, not NaN
    out = fn(q, k, v, attn_mask=mask, scale=0.3)
    np.testing.assert_allclose(out, sdpa_float64(q, k, v, mask=mask, scale=0.3)[0], rtol=0, atol=1e-13)
    assert np.all(out[..., 2, :] == 0)
    bias = randn(rng, (2, 1, 4, 6))
    bias[0, 0, 1, 3] = -np.inf
    np.testing.assert_allclose(fn(q, k, v, bias), sdpa_float64(q, k, v, mask=bias)[0], rtol=0, atol=1e-13)
    np.testing.assert_allclose(fn(q, k, v, is_causal=True), sdpa_float64(q, k, v, causal=True)[0],
                               rtol=0, atol=1e-13)


@pytest.mark.parametrize("fn", FUNCTIONS, ids=lambda f: f.__name__)
def test_grouped_query_attention(fn):
    rng = np.random.default_rng(13)
    q, k, v = randn(rng, (2, 8, 5, 16)), randn(rng, (2, 2, 7, 16)), randn(rng, (2, 2, 7, 4))
    out = fn(q, k, v, enable_gqa=True)
    np.testing.assert_allclose(out, sdpa_float64(q, k, v, gqa=True)[0], rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="q \\[2, 8, 5, 16\\], k \\[2, 2, 7, 16\\]"):
        fn(q, k, v)  # 8 vs 2 heads do not broadcast without enable_gqa


def test_torch_argument_names_and_order():
    """Code written for torch.nn.functional.scaled_dot_product_attention ports as is."""
    rng = np.random.default_rng(14)
    q, k, v = randn(rng, (1, 4, 6, 8)), randn(rng, (1, 2, 6, 8)), randn(rng, (1, 2, 6, 8))
    expected = sdpa_float64(q, k, v, causal=True, scale=0.5, gqa=True)[0]
    by_keyword = qkv.scaled_dot_product_attention(query=q, key=k, value=v, attn_mask=None, dropout_p=0.0,
                                                  is_causal=True, scale=0.5, enable_gqa=True)
    by_position = qkv.scaled_dot_product_attention(q, k, v, None, 0.0, True, 0.5, True)
    np.testing.assert_allclose(by_keyword, expected, rtol=0, atol=1e-13)
    np.testing.assert_array_equal(by_position, by_keyword)
    with pytest.raises(TypeError):
        qkv.scaled_dot_product_attention(q, k, v, None, 0.0, True, 0.5, True, 7)  # seed is keyword-only


def test_strided_inputs_give_the_same_result_as_contiguous_copies():
    rng = np.random.default_rng(15)
    base = randn(rng, (2, 9, 3, 16))
    q = base[:, ::2].transpose(0, 2, 1, 3)  # [2, 3, 5, 16], non-contiguous view
    k = np.broadcast_to(randn(rng, (1, 1, 7, 16)), (2, 3, 7, 16))  # zero strides, read-only
    v = np.asfortranarray(randn(rng, (2, 3, 7, 4)))
    out = qkv.attention_reference(q, k, v)
    expected = qkv.attention_reference(*(np.ascontiguousarray(x) for x in (q, k, v)))
    np.testing.assert_array_equal(out, expected)
    np.testing.assert_allclose(out, sdpa_float64(q, k, v)[0], rtol=0, atol=1e-13)


def test_dropout_is_seeded_and_matches_its_own_weights():
    rng = np.random.default_rng(16)
    q, k, v = randn(rng, (2, 4, 32, 8)), randn(rng, (2, 4, 48, 8)), randn(rng, (2, 4, 48, 6))
    p = 0.25
    out, w = qkv.attention_reference(q, k, v, dropout_p=p, return_weights=True, seed=5)
    again, w_again = qkv.attention_reference(q, k, v, dropout_p=p, return_weights=True, seed=5)
    np.testing.assert_array_equal(out, again)
    np.testing.assert_array_equal(w, w_again)
    _, w_clean = sdpa_float64(q, k, v)
    dropped = w == 0
    assert 0.2 < dropped.mean() < 0.3  # 12288 draws at p = 0.25
    np.testing.assert_allclose(w[~dropped], w_clean[~dropped] / (1 - p), rtol=1e-12)
    np.testing.assert_allclose(out, w @ v, rtol=0, atol=1e-12)
    other = qkv.attention_reference(q, k, v, dropout_p=p, seed=6)
    assert not np.array_equal(other, out)
    # seed=None draws a fresh seed per call, as torch's dropout differs per call.
    assert not np.array_equal(qkv.scaled_dot_product_attention(q, k, v, dropout_p=p),
                              qkv.scaled_dot_product_attention(q, k, v, dropout_p=p))
    # float64 sdpa (the fused kernel in double) draws the same mask: same zeros, values to rounding.
    out_sdpa, w_sdpa = qkv.scaled_dot_product_attention(q, k, v, dropout_p=p, seed=5, return_weights=True)
    np.testing.assert_array_equal(w_sdpa == 0, dropped)
    np.testing.assert_allclose(w_sdpa, w, rtol=0, atol=1e-14)
    np.testing.assert_allclose(out_sdpa, out, rtol=0, atol=1e-14)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_inputs_keep_their_dtype(dtype):
    np_dtype = np.float16 if dtype == "float16" else ml_dtypes.bfloat16
    rng = np.random.default_rng(17)
    q, k, v = (randn(rng, s).astype(np_dtype) for s in ((2, 5, 8), (2, 6, 8), (2, 6, 3)))
    out = qkv.scaled_dot_product_attention(q, k, v)
    assert out.dtype == np_dtype and out.shape == (2, 5, 3)
    tol = 1e-3 if dtype == "float16" else 8e-3
    np.testing.assert_allclose(out.astype(np.float64), sdpa_float64(q, k, v)[0], rtol=0, atol=tol)


class TestErrors:
    """qkv's errors arrive as the exceptions torch/numpy raise, with qkv's message."""

    def test_shape_mismatch_is_value_error_naming_shapes(self):
        with pytest.raises(ValueError, match=r"q and k must have the same last dim.*q \[4, 8\], k \[6, 7\], v \[6, 3\]"):
            qkv.attention_reference(np.zeros((4, 8)), np.zeros((6, 7)), np.zeros((6, 3)))

    def test_mask_with_is_causal_is_value_error(self):
        x = np.zeros((2, 4, 8))
        with pytest.raises(ValueError, match="attn_mask and is_causal"):
            qkv.scaled_dot_product_attention(x, x, x, attn_mask=np.ones((4, 4), bool), is_causal=True)

    def test_bad_dropout_is_value_error(self):
        x = np.zeros((4, 8))
        with pytest.raises(ValueError, match="dropout_p must be in \\[0, 1\\], got 1.5"):
            qkv.attention_reference(x, x, x, dropout_p=1.5)

    def test_integer_inputs_are_type_error(self):
        x = np.zeros((4, 8), dtype=np.int32)
        with pytest.raises(TypeError, match="must be floating point"):
            qkv.attention_reference(x, x, x)

    def test_mixed_dtypes_are_type_error(self):
        with pytest.raises(TypeError, match="same dtype"):
            qkv.attention_reference(np.zeros((4, 8), np.float32), np.zeros((4, 8)), np.zeros((4, 8)))

    def test_dtype_qkv_lacks_is_type_error_naming_the_argument(self):
        x = np.zeros((4, 8))
        with pytest.raises(TypeError, match="attention_reference: k: dtype uint8 is not supported"):
            qkv.attention_reference(x, x.astype(np.uint8), x)
        with pytest.raises(TypeError, match="attn_mask: dtype complex128"):
            qkv.attention_reference(x, x, x, attn_mask=np.zeros((4, 4), complex))

    def test_non_array_is_type_error(self):
        x = np.zeros((4, 8))
        with pytest.raises(TypeError, match="scaled_dot_product_attention: query"):
            qkv.scaled_dot_product_attention("not an array", x, x)


# ---- PyTorch fixtures ---------------------------------------------------------------------


HALF = ("float16", "bfloat16")


def half_ulp(x, dtype):
    """Half an ulp of float16/bfloat16 at |x| (subnormals included), as the C++ test."""
    fraction_bits, min_exponent = {"float16": (10, -14), "bfloat16": (7, -126)}[dtype]
    binade = np.floor(np.log2(np.maximum(np.abs(x), 2.0**min_exponent)))
    return 2.0 ** (binade - fraction_bits - 1)


def assert_matches_torch(got, want, dtype, what, extra=0.0):
    got = np.asarray(got).astype(np.float64)
    assert got.shape == want.shape, what
    scale = np.max(np.abs(want)) if want.size else 0.0
    tol = {"float64": 1e-10 * scale, "float32": 1e-6 * scale}.get(dtype)
    if tol is None:
        tol = half_ulp(want, dtype) + 1e-6 * scale + extra
    err = np.abs(got - want)
    assert np.all(err <= tol), f"{what}: max error {np.max(err - tol) + tol if err.size else 0} over tolerance"


FIXTURE_FILES = sorted(FIXTURES.glob("*.safetensors"))


def test_fixtures_are_there():
    assert len(FIXTURE_FILES) >= 30, f"expected the SDPA fixtures in {FIXTURES}"


@pytest.mark.parametrize("path", FIXTURE_FILES, ids=lambda p: p.stem)
def test_matches_torch_fixture(path):
    t = qkv.load(path)
    with safe_open(str(path), "np") as f:
        options = json.loads(f.metadata()["options"])
    dtype = options["dtype"]
    assert options["dropout_p"] == 0.0
    kwargs = dict(attn_mask=t.get("attn_mask"), is_causal=options["is_causal"], scale=options["scale"],
                  enable_gqa=options["enable_gqa"])
    assert str(t["q"].dtype) == dtype
    out, w = qkv.attention_reference(t["q"], t["k"], t["v"], return_weights=True, **kwargs)
    assert str(out.dtype) == dtype
    assert_matches_torch(out, t["out"], dtype, "attention_reference output")
    assert_matches_torch(w, t["weights"], dtype, "attention_reference weights")
    sdpa = qkv.scaled_dot_product_attention(t["q"], t["k"], t["v"], **kwargs)
    # On native 16-bit tiles the fused kernel rounds P to the dtype for P V (as FlashAttention):
    # |sum_j (p'_j - p_j) v_j| <= half an ulp of 1 x max|v|, given twice.
    p_rounding = 2 * half_ulp(1.0, dtype) * np.abs(t["v"].astype(np.float64)).max() if dtype in HALF else 0.0
    assert_matches_torch(sdpa, t["out"], dtype, "scaled_dot_product_attention", extra=p_rounding)


def test_matmul_precision_medium_trades_accuracy_for_bf16_tiles():
    # torch.set_float32_matmul_precision's names, per call. 'high' is exact float32 on CPUs;
    # 'medium' runs bf16 tiles where the CPU has them (else exact float32): either way within
    # bf16's rounding of the float64 result, and never outside it.
    rng = np.random.default_rng(14)
    q, k, v = (rng.standard_normal((2, 4, 96, 64)).astype(np.float32) for _ in range(3))
    want, _ = sdpa_float64(q.astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    exact = qkv.scaled_dot_product_attention(q, k, v)
    np.testing.assert_array_equal(qkv.scaled_dot_product_attention(q, k, v, matmul_precision="high"), exact)
    medium = qkv.scaled_dot_product_attention(q, k, v, matmul_precision="medium")
    assert medium.dtype == np.float32
    assert np.abs(exact - want).max() < 1e-5
    assert np.abs(medium - want).max() < 2.0 ** -7 * np.abs(v).max()
    with pytest.raises(ValueError, match="matmul_precision must be 'highest', 'high' or 'medium', got 'low'"):
        qkv.scaled_dot_product_attention(q, k, v, matmul_precision="low")


# ---- the backward ----------------------------------------------------------------------------

GRAD_FIXTURES = sorted((FIXTURES.parent / "sdpa_grad").glob("*.safetensors"))


def test_grad_fixtures_are_there():
    assert len(GRAD_FIXTURES) >= 50, "tests/fixtures/sdpa_grad (make fixtures)"


@pytest.mark.parametrize("path", GRAD_FIXTURES, ids=lambda p: p.stem)
def test_backward_matches_torch_autograd(path):
    # torch's float64 autograd gradients of sum(out * grad_out) (make_sdpa_grad_fixtures.py),
    # from qkv's own float64 forward's out and logsumexp.
    t = qkv.load(path)
    with safe_open(str(path), "np") as f:
        options = json.loads(f.metadata()["options"])
    kwargs = dict(attn_mask=t.get("attn_mask"), is_causal=options["is_causal"], scale=options["scale"],
                  enable_gqa=options["enable_gqa"])
    out, lse = qkv.scaled_dot_product_attention(t["q"], t["k"], t["v"], return_logsumexp=True, **kwargs)
    grads = qkv.scaled_dot_product_attention_backward(t["q"], t["k"], t["v"], out, t["grad_out"], lse, **kwargs)
    for got, name in zip(grads, ("dq", "dk", "dv")):
        want = t[name]
        assert got.shape == want.shape and got.dtype == np.float64, name
        scale = max(np.abs(want).max(), 1.0) if want.size else 1.0
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-10 * scale, err_msg=name)


def test_zero_head_dim_needs_memory_for_the_output_only():
    """Dk = 0 (every score 0) runs the fused kernel: the float64 reference it took stored every
    [Lq, Lk] weight, 64 GiB here (MemoryError) for a 1 MiB output. A causal window of 3 keys:
    output i is the mean of v over keys max(0, i - 2) .. i, lse the log of their count."""
    n = 1 << 16
    rng = np.random.default_rng(21)
    q = np.zeros((1, 2, n, 0), np.float32)
    v = rng.standard_normal((1, 2, n, 2)).astype(np.float32)
    mods = qkv.AttentionMods(window_left=2, window_right=0)
    out, lse = qkv.scaled_dot_product_attention(q, q, v, mods=mods, return_logsumexp=True)
    g = rng.standard_normal(out.shape).astype(np.float32)
    dq, dk, dv = qkv.scaled_dot_product_attention_backward(q, q, v, out, g, lse, mods=mods)
    count = (np.minimum(np.arange(n), 2) + 1.0)[:, None]  # keys of row i
    v64, gw = v.astype(np.float64), g.astype(np.float64) / count

    def shifted(x, s):  # x[..., i - s, :] (s > 0) or x[..., i + |s|, :], zeros outside
        out = np.zeros_like(x)
        if s >= 0:
            out[..., s:, :] = x[..., : n - s, :]
        else:
            out[..., : n + s, :] = x[..., -s:, :]
        return out

    np.testing.assert_allclose(out, sum(shifted(v64, s) for s in range(3)) / count, rtol=0, atol=1e-6)
    np.testing.assert_allclose(lse, np.broadcast_to(np.log(count[:, 0]), lse.shape), rtol=0, atol=1e-6)
    # dv_j = sum over the rows i = j .. j + 2 that see key j of g_i / count_i; dq, dk empty
    np.testing.assert_allclose(dv, sum(shifted(gw, -s) for s in range(3)), rtol=0, atol=1e-5)
    assert dq.shape == q.shape and dk.shape == q.shape and dq.dtype == np.float32


def test_backward_with_dropout_needs_the_forward_seed():
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((1, 2, 6, 4)) for _ in range(3))
    g = rng.standard_normal((1, 2, 6, 4))
    out, lse = qkv.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=9, return_logsumexp=True)
    with pytest.raises(ValueError, match="dropout_p > 0 needs the forward's seed"):
        qkv.scaled_dot_product_attention_backward(q, k, v, out, g, lse, dropout_p=0.3)
    dq, dk, dv = qkv.scaled_dot_product_attention_backward(q, k, v, out, g, lse, dropout_p=0.3, seed=9)
    # Central differences of the forward with the same seed (the same mask): the definition.
    h = 1e-6

    def loss(qq):
        return float((qkv.scaled_dot_product_attention(qq, k, v, dropout_p=0.3, seed=9) * g).sum())

    fd = np.zeros_like(q)
    for idx in np.ndindex(q.shape):
        e = np.zeros_like(q)
        e[idx] = h
        fd[idx] = (loss(q + e) - loss(q - e)) / (2 * h)
    np.testing.assert_allclose(dq, fd, rtol=0, atol=1e-7 * max(1.0, np.abs(fd).max()))
    assert dk.shape == k.shape and dv.shape == v.shape
