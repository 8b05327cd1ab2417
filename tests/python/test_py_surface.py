"""The package's surface: what plain `import qkv` exposes, the array type of results,
scaled_dot_product_attention's return_weights / return_logsumexp, argument errors that
name the argument, and error messages that stay valid UTF-8.

Oracles: numpy float64 (oracles.sdpa_float64, a logsumexp in numpy), einops, and the
docs themselves (every documented name must resolve).
"""
import pathlib
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import qkv
from fake_torch import FakeTensor
from fake_torch import install as install_fake_torch
from oracles import data_ptr, sdpa_float64

einops = pytest.importorskip("einops")  # required in CI: conftest.py turns this skip into a failure
ROOT = pathlib.Path(__file__).resolve().parents[2]


# ---- every documented name after a plain `import qkv` ---------------------------------

def documented_names():
    """Dotted names under qkv that docs/python.md and README's Python section mention."""
    doc = (ROOT / "docs" / "python.md").read_text()
    readme = (ROOT / "README.md").read_text()
    python_section = readme.split("\n## Python\n", 1)[1].split("\n## ", 1)[0]
    names = set()
    for text in (doc, python_section):
        # qkv.<name>, but not file names such as "qkv.safetensors" or python/qkv/nn.py
        names.update(m.rstrip(".") for m in re.findall(r"(?<![\"'/\w])qkv\.([A-Za-z_][\w.]*)(?![\"'])", text))
    api = doc.split("\n## API", 1)[1].split("\n## ", 1)[0]
    for row in api.splitlines():
        if not row.startswith("| `"):
            continue
        first = row.split("|")[1]
        if "`einops` module" in first:
            names.update("einops." + n for n in re.findall(r"`(\w+)`", first.split(":", 1)[1]))
            continue
        names.update(re.findall(r"`([A-Za-z_][\w.]*)", first))
    names.discard("seed layers")
    return sorted(n for n in names if not n.startswith("_qkv") and n not in ("py",))


def test_docs_list_the_names_this_test_checks():
    names = documented_names()
    for expected in ["nn.MultiheadAttention", "nn.KerasMultiHeadAttention", "einops.rearrange", "einops.pack",
                     "scaled_dot_product_attention", "einsum_path", "set_num_threads", "__version__", "load"]:
        assert expected in names, names


def test_plain_import_exposes_every_documented_name():
    # A fresh interpreter: this process has imported qkv.nn and qkv.einops already.
    script = ("import functools, sys, qkv\n"
              "missing = [n for n in sys.argv[1:] if not hasattr(functools.reduce(\n"
              "    lambda o, a: getattr(o, a, None), n.split('.')[:-1], qkv), n.split('.')[-1])]\n"
              "print(missing)\n")
    # qkv.torch needs torch and its own `import qkv.torch`: test_qkv_torch.py checks those names
    names = [n for n in documented_names() if n != "torch" and not n.startswith("torch.")]
    out = subprocess.run([sys.executable, "-c", script, *names], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", f"not reachable after `import qkv`: {out.stdout}"


def test_version_is_the_cmake_project_version():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert qkv.__version__ == re.search(r"project\(qkv\s+VERSION\s+([\d.]+)", cmake).group(1)


# ---- return_weights / return_logsumexp ------------------------------------------------

def logsumexp_float64(q, k, mask=None, causal=False):
    """log sum_j exp(score_ij) of the scaled, masked scores; -inf for a fully masked row."""
    q, k = np.float64(q), np.float64(k)
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    if mask is not None:
        s = np.where(mask, s, -np.inf)
    m = s.max(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = m + np.log(np.exp(s - np.where(np.isneginf(m), 0.0, m)).sum(-1, keepdims=True))
    return np.where(np.isneginf(m), -np.inf, out)[..., 0]


@pytest.mark.parametrize("dtype,tol", [(np.float32, 2e-6), (np.float64, 1e-12)])
@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_returns_weights_and_logsumexp_like_numpy(dtype, tol, causal):
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal(s).astype(dtype) for s in [(2, 3, 9, 8), (2, 3, 11, 8), (2, 3, 11, 5)])
    mask = None if causal else rng.random((9, 11)) < 0.8
    if mask is not None:
        mask[4] = False  # a fully masked row: weights 0, output 0, logsumexp -inf
    want_out, want_w = sdpa_float64(q, k, v, mask=mask, causal=causal)
    out, w, lse = qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, return_weights=True,
                                                   return_logsumexp=True)
    assert out.dtype == dtype and w.dtype == dtype and lse.dtype == np.result_type(dtype, np.float32)
    assert w.shape == (2, 3, 9, 11) and lse.shape == (2, 3, 9)
    np.testing.assert_allclose(out, want_out, rtol=0, atol=tol * 10)
    np.testing.assert_allclose(w, want_w, rtol=0, atol=tol * 10)
    np.testing.assert_allclose(lse, logsumexp_float64(q, k, mask, causal), rtol=2e-6, atol=2e-6)
    only_w = qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, return_weights=True)
    assert isinstance(only_w, tuple) and len(only_w) == 2
    np.testing.assert_array_equal(only_w[1], w)
    only_lse = qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, return_logsumexp=True)
    assert isinstance(only_lse, tuple) and len(only_lse) == 2
    np.testing.assert_array_equal(only_lse[1], lse)
    assert isinstance(qkv.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal), np.ndarray)


def test_sdpa_weights_with_dropout_are_the_references():
    rng = np.random.default_rng(6)
    q, k, v = (rng.standard_normal((2, 6, 7, 4)).astype(np.float32) for _ in range(3))
    out, w = qkv.scaled_dot_product_attention(q, k, v, dropout_p=0.3, seed=11, return_weights=True)
    ref_out, ref_w = qkv.attention_reference(np.float64(q), np.float64(k), np.float64(v), dropout_p=0.3, seed=11,
                                             return_weights=True)
    assert (w == 0).any()  # dropout did zero some weights
    np.testing.assert_allclose(w, ref_w, rtol=0, atol=1e-6)
    np.testing.assert_allclose(out, np.float64(w) @ np.float64(v), rtol=0, atol=1e-5)  # the weights applied to v
    np.testing.assert_allclose(out, ref_out, rtol=0, atol=1e-5)


def test_sdpa_weights_take_the_fused_kernel_not_the_float64_reference():
    q = np.random.default_rng(7).standard_normal((1, 8, 1024, 64)).astype(np.float32)
    start = time.perf_counter()
    out, w = qkv.scaled_dot_product_attention(q, q, q, return_weights=True)
    seconds = time.perf_counter() - start
    print(f"\nsdpa return_weights at (1, 8, 1024, 64) float32: {seconds:.3f} s")
    want_out, want_w = sdpa_float64(q[:, :1], q[:, :1], q[:, :1])
    np.testing.assert_allclose(w[:, :1], want_w, rtol=0, atol=1e-6)
    np.testing.assert_allclose(out[:, :1], want_out, rtol=0, atol=1e-5)
    assert seconds < 5.0  # the reference takes ~16 s here; the fused kernel ~0.1 s


# ---- one array-type rule ---------------------------------------------------------------

@pytest.fixture()
def fake_torch(monkeypatch):
    return install_fake_torch(monkeypatch)


def calls(x4, x2, x1):
    """(name, call(first_input)) for every function that returns arrays."""
    seed_layer = qkv.nn.SelfAttention(4, seed=1)
    return [
        ("scaled_dot_product_attention", lambda a: qkv.scaled_dot_product_attention(a, x4, x4)),
        ("sdpa return_weights", lambda a: qkv.scaled_dot_product_attention(a, x4, x4, return_weights=True)),
        ("attention_reference", lambda a: qkv.attention_reference(a, x4, x4, return_weights=True)),
        ("einsum", lambda a: qkv.einsum("bhid,bhjd->bhij", a, x4)),
        ("einsum sublist", lambda a: qkv.einsum(a, [0, 1, 2, 3], [3, 2, 1, 0])),
        ("rearrange (view)", lambda a: qkv.rearrange(a, "b h i d -> d i h b")),
        ("rearrange (copy)", lambda a: qkv.rearrange(a, "b h i d -> b (i h) d")),
        ("repeat", lambda a: qkv.repeat(a, "b h i d -> b h i d r", r=3)),
        ("reduce", lambda a: qkv.reduce(a, "b h i d -> b d", "max")),
        ("reduce callable", lambda a: qkv.reduce(a, "b h i d -> b d", np.sum)),
        ("einops.einsum", lambda a: qkv.einops.einsum(a, x4, "b h i d, b h j d -> b h i j")),
        ("einops.pack", lambda a: qkv.einops.pack([a, x4], "b h * d")[0]),
        ("einops.unpack", lambda a: qkv.einops.unpack(a, [[2], [1]], "b h * d")),
        ("nn.SelfAttention", lambda a: seed_layer(a[0])),
    ]


def flat(result):
    return list(result) if isinstance(result, (tuple, list)) else [result]


def test_numpy_in_numpy_out_everywhere():
    x4 = np.random.default_rng(8).standard_normal((1, 2, 3, 4)).astype(np.float32)
    for name, call in calls(x4, None, None):
        for r in flat(call(x4)):
            assert type(r) is np.ndarray, name


def test_torch_in_torch_out_everywhere_without_copy(fake_torch):
    x4 = np.random.default_rng(8).standard_normal((1, 2, 3, 4)).astype(np.float32)
    for name, call in calls(x4, None, None):
        want = flat(call(x4))
        got = flat(call(FakeTensor(x4)))
        assert len(got) == len(want), name
        for g, w in zip(got, want):
            assert type(g) is FakeTensor, name
            np.testing.assert_allclose(g.array, w, rtol=1e-6, atol=1e-6, err_msg=name)
    view = qkv.rearrange(FakeTensor(x4), "b h i d -> d i h b")
    assert data_ptr(view.array) == data_ptr(x4)  # a view of the input, through DLPack both ways


def test_torch_out_of_a_read_only_input_is_a_copy(fake_torch):
    """torch has no read-only tensors: a view of read-only memory comes back as a copy."""
    ro = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    ro.flags.writeable = False
    out = qkv._qkv._array_like(np.asarray(ro), FakeTensor(ro))
    assert data_ptr(out.array) != data_ptr(ro) and out.array.flags.writeable
    np.testing.assert_array_equal(out.array, ro)
    rw = np.arange(6, dtype=np.float32)
    assert data_ptr(qkv._qkv._array_like(rw, FakeTensor(rw)).array) == data_ptr(rw)


# ---- argument errors name the argument -------------------------------------------------

X = np.ones((1, 2, 3, 4), np.float32)
BAD_ARGUMENTS = [
    (lambda: qkv.scaled_dot_product_attention(X, X, X, dropout_p=0.1, seed=-1), ValueError, "seed"),
    (lambda: qkv.scaled_dot_product_attention(X, X, X, dropout_p=0.1, seed=2**70), ValueError, "seed"),
    (lambda: qkv.scaled_dot_product_attention(X, X, X, seed="7"), TypeError, "seed"),
    (lambda: qkv.scaled_dot_product_attention(X, X, X, dropout_p="0.1"), TypeError, "dropout_p"),
    (lambda: qkv.scaled_dot_product_attention(X, X, X, is_causal=1), TypeError, "is_causal"),
    (lambda: qkv.scaled_dot_product_attention(X, X, X, scale="2"), TypeError, "scale"),
    (lambda: qkv.scaled_dot_product_attention(X, X, X, enable_gqa=None), TypeError, "enable_gqa"),
    (lambda: qkv.scaled_dot_product_attention(X, X, X, return_weights="yes"), TypeError, "return_weights"),
    (lambda: qkv.attention_reference(X, X, X, dropout_p=0.5, seed=-3), ValueError, "seed"),
    (lambda: qkv.attention_reference(X, X, X, return_weights=0), TypeError, "return_weights"),
    (lambda: qkv.attention_reference(X, X, "not an array"), TypeError, "v"),
    (lambda: qkv.save("/tmp/qkv_surface.safetensors", {"a": X}, metadata={"k": 1}), TypeError, "metadata"),
    (lambda: qkv.save("/tmp/qkv_surface.safetensors", {"a": X}, metadata=[("k", "v")]), TypeError, "metadata"),
    (lambda: qkv.save(7, {"a": X}), TypeError, "path"),
    (lambda: qkv.load(None), TypeError, "path"),
    (lambda: qkv.inspect(3.5), TypeError, "path"),
    (lambda: qkv.set_num_threads("2"), TypeError, "set_num_threads: n"),
    (lambda: qkv.set_num_threads(2**40), ValueError, "set_num_threads: n"),
    (lambda: qkv.rearrange(X, 3), TypeError, "pattern"),
    (lambda: qkv.repeat(X, "a b c d -> a b c d r", r="3"), TypeError, "axis length r"),
    (lambda: qkv.reduce(X, "a b c d -> a", 3), TypeError, "reduction"),
    (lambda: qkv.einops.pack([X], 5), TypeError, "pattern"),
    (lambda: qkv.einops.unpack(X, [["x"]], "a * c d"), TypeError, "packed_shapes"),
    (lambda: qkv.einsum(X, [0, "a"]), TypeError, "subscript"),
    (lambda: qkv.einsum("ij,jk", X[0, 0], X[0, 0].T, optimize=("greedy", "lots")), TypeError, "memory_limit"),
]

# Every constructor argument of the qkv.nn layers, each with a wrong type or an out-of-range
# value: (layer, good keyword arguments, argument, bad value, error).
MHA, KERAS = qkv.nn.MultiheadAttention, qkv.nn.KerasMultiHeadAttention
LAYER_ARGUMENTS = [
    (MHA, dict(embed_dim=8, num_heads=2), [
        ("embed_dim", 8.0, TypeError), ("embed_dim", 2**70, ValueError), ("embed_dim", None, TypeError),
        ("num_heads", 2.5, TypeError), ("num_heads", "2", TypeError), ("num_heads", -2, ValueError),
        ("dropout", "x", TypeError), ("dropout", float("nan"), ValueError), ("dropout", 1.5, ValueError),
        ("bias", 1, TypeError), ("add_bias_kv", "yes", TypeError), ("add_zero_attn", None, TypeError),
        ("kdim", 4.0, TypeError), ("kdim", 2**64, ValueError), ("vdim", "6", TypeError),
        ("batch_first", 0, TypeError)]),
    (KERAS, dict(num_heads=2, key_dim=4), [
        ("num_heads", 2.5, TypeError), ("num_heads", 0, ValueError), ("key_dim", "4", TypeError),
        ("key_dim", -1, ValueError), ("value_dim", 3.0, TypeError), ("value_dim", 2**70, ValueError),
        ("use_bias", 1, TypeError), ("output_shape", "x", TypeError), ("output_shape", [2, 1.5], TypeError),
        ("output_shape", 2.5, TypeError), ("attention_axes", 2.5, TypeError), ("attention_axes", ["1"], TypeError),
        ("attention_axes", [2**70], ValueError), ("dropout", "x", TypeError), ("dropout", 2.0, ValueError),
        ("dropout", float("nan"), ValueError)]),
    (qkv.nn.SelfAttention, dict(dim=8), [
        ("dim", 8.0, TypeError), ("dim", 0, ValueError), ("seed", -1, ValueError), ("seed", 2**70, ValueError),
        ("seed", "7", TypeError), ("seed", None, TypeError)]),
    (qkv.nn.MultiHeadSelfAttention, dict(dim=8, heads=2), [
        ("dim", "8", TypeError), ("dim", 2**70, ValueError), ("heads", 2.5, TypeError), ("heads", 0, ValueError),
        ("dim_head", 4.0, TypeError), ("dim_head", -4, ValueError), ("seed", -1, ValueError),
        ("seed", 2**64, ValueError), ("seed", 1.0, TypeError)]),
    (qkv.nn.SeparateHeadsAttention, dict(embed_dim=8, n_heads=2), [
        ("embed_dim", 8.5, TypeError), ("embed_dim", -8, ValueError), ("n_heads", "2", TypeError),
        ("n_heads", 0, ValueError), ("d_kq", 4.0, TypeError), ("d_kq", 0, ValueError), ("d_v", "4", TypeError),
        ("d_v", -1, ValueError), ("scale", "0.5", TypeError), ("causal", 1, TypeError), ("seed", -1, ValueError),
        ("seed", 2**70, ValueError)]),
    (qkv.nn.LazyMultiHeadAttention, dict(hidden=8, heads=2), [
        ("hidden", 8.0, TypeError), ("hidden", 7, ValueError), ("heads", "2", TypeError), ("heads", 0, ValueError),
        ("seed", -1, ValueError), ("seed", 2**70, ValueError), ("seed", [1], TypeError)]),
]
LAYER_CASES = [(layer, good, name, bad, error) for layer, good, cases in LAYER_ARGUMENTS
               for name, bad, error in cases]


@pytest.mark.parametrize("index", range(len(BAD_ARGUMENTS)))
def test_argument_errors_are_qkv_messages_naming_the_argument(index):
    call, error, name = BAD_ARGUMENTS[index]
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert "incompatible function arguments" not in message
    assert name in message, message


@pytest.mark.parametrize("layer, good, name, bad, error", LAYER_CASES,
                         ids=[f"{c[0].__name__}-{c[2]}={c[3]!r}" for c in LAYER_CASES])
def test_layer_constructor_errors_are_qkv_messages_naming_the_argument(layer, good, name, bad, error):
    layer(**good)  # the good arguments build a layer
    with pytest.raises(error) as info:
        layer(**{**good, name: bad})
    message = str(info.value)
    assert "incompatible function arguments" not in message
    assert message.startswith(layer.__name__ + ": "), message
    assert name in message, message


def test_layer_constructors_take_ints_and_sequences_as_before():
    assert KERAS(2, 4, output_shape=3, attention_axes=1).output_shape == 3
    assert KERAS(2, 4, output_shape=(3, 2), attention_axes=[1], value_dim=np.int64(5)).value_dim == 5
    layer = KERAS(2, 4, output_shape=np.array([3]))
    assert layer(np.ones((1, 5, 6), np.float32), np.ones((1, 4, 7), np.float32)).shape == (1, 5, 3)
    assert qkv.nn.SelfAttention(np.int32(8), seed=np.uint64(2**64 - 1)).state_dict()["to_qvk.weight"].shape == (24, 8)
    assert MHA(8, 2, dropout=np.float32(0.5), bias=np.bool_(False)).state_dict().keys() == {
        "in_proj_weight", "out_proj.weight"}


def test_seed_accepts_the_whole_uint64_range():
    a = qkv.scaled_dot_product_attention(X, X, X, dropout_p=0.5, seed=2**64 - 1)
    b = qkv.scaled_dot_product_attention(X, X, X, dropout_p=0.5, seed=np.uint64(2**64 - 1))
    np.testing.assert_array_equal(a, b)


# ---- messages stay valid UTF-8 -----------------------------------------------------------

@pytest.mark.parametrize("equation",
                         ["ä", "ij,jä->i", "αβ->α", "i日本->i", "😀", "i->é", "ab…", "a\u0301b"])
def test_einsum_errors_with_non_ascii_quote_the_whole_character(equation):
    x = np.ones((2,) * len(equation.split("->")[0].split(",")[0]))
    with pytest.raises(ValueError) as theirs:
        np.einsum(equation, *([x] * (equation.count(",") + 1)))  # the oracle agrees it is invalid
    with pytest.raises(ValueError) as ours:
        qkv.einsum(equation, *([x] * (equation.count(",") + 1)))
    bad = next(c for c in equation if not (c.isascii() and (c.isalpha() or c in ",->.")))
    assert f"invalid character '{bad}'" in str(ours.value), (str(ours.value), str(theirs.value))


@pytest.mark.parametrize("pattern",
                         ["ä b -> b ä", "α (β γ) -> (α β) γ", "日 本 -> 本 日", "x_é y -> y x_é"])
def test_einops_non_ascii_axis_names_as_einops(pattern):
    x = np.arange(24.0).reshape(4, 6)
    lengths = {"β": 2} if "β" in pattern else {}
    np.testing.assert_array_equal(qkv.einops.rearrange(x, pattern, **lengths),
                                  einops.rearrange(x, pattern, **lengths))


@pytest.mark.parametrize("pattern", ["ä b -> b c", "ä -> ä", "a b -> (a ä)", "ä ä -> ä", "a b -> a € b"])
def test_einops_errors_with_non_ascii_are_valid_text(pattern):
    x = np.zeros((2, 3))
    with pytest.raises(einops.EinopsError):
        einops.rearrange(x, pattern)
    with pytest.raises(qkv.EinopsError) as ours:
        qkv.einops.rearrange(x, pattern)
    assert isinstance(str(ours.value), str) and "\ufffd" not in str(ours.value)
