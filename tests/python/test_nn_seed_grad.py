"""backward() of the seed layers (qkv.nn.SelfAttention, MultiHeadSelfAttention,
SeparateHeadsAttention, LazyMultiHeadAttention) against PyTorch's float64 autograd on the
articles' modules (tests/fixtures/seed_grad from tests/nn/make_seed_grad_fixtures.py), and
errors. Criterion as tests/nn/seed_layers_backward_test.cc: each gradient within 1e-5 of its
largest magnitude, with a floor of 1e-2 of the configuration's largest gradient."""

import pathlib

import numpy as np
import pytest

import qkv
import qkv.nn
from fixture_files import load  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "seed_grad"
FILES = sorted(FIXTURES.glob("*.safetensors"))
TOL = 1e-5


def with_prefix(t, prefix):
    return {k[len(prefix):]: v for k, v in t.items() if k.startswith(prefix)}


def layer_of(o):
    c = o["ctor"]
    if o["layer"] == "SelfAttention":
        return qkv.nn.SelfAttention(c["dim"])
    if o["layer"] == "MultiHeadSelfAttention":
        return qkv.nn.MultiHeadSelfAttention(c["dim"], c.get("heads", 8), c.get("dim_head"))
    if o["layer"] == "SeparateHeadsAttention":
        return qkv.nn.SeparateHeadsAttention(c["embed_dim"], c["n_heads"], c.get("d_kq"), c.get("d_v"),
                                             scale=c.get("scale"), causal=c.get("causal", False))
    return qkv.nn.LazyMultiHeadAttention(c["hidden"], c["heads"])


def test_fixtures_cover_every_layer():
    layers = [load(p)[1]["layer"] for p in FILES]
    assert len(FILES) == 22
    for name in ("SelfAttention", "MultiHeadSelfAttention", "SeparateHeadsAttention", "LazyMultiHeadAttention"):
        assert layers.count(name) >= 5, name


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_backward_matches_torch_autograd(path):
    t, o = load(path)
    layer = layer_of(o)
    layer.load_state_dict(with_prefix(t, "param."))
    if o["layer"] in ("SelfAttention", "MultiHeadSelfAttention"):
        dx, grads = layer.backward(t["input.x"], t["grad_output"], t.get("input.mask"))
        got = dict(grads, x=dx)
    else:
        dq, dk, dv, grads = layer.backward(t["input.q"], t["input.k"], t["input.v"], t["grad_output"])
        got = dict(grads, q=dq, k=dk, v=dv)
    assert sorted(grads) == sorted(layer.state_dict())
    want = with_prefix(t, "grad.")
    assert sorted(got) == sorted(want)
    floor = 1e-2 * max(np.abs(w).max() for w in want.values())
    for name, w in want.items():
        assert got[name].dtype == np.float32 and got[name].shape == w.shape, name
        g = got[name].astype(np.float64)
        err = np.abs(g - w).max() / max(np.abs(w).max(), floor)
        assert err <= TOL, (name, err)


def test_wrong_shapes_and_unmaterialized_layer_are_errors():
    x = np.zeros((2, 5, 8), np.float32)
    with pytest.raises(ValueError, match=r"SelfAttention\.backward: grad_output must have the output's shape "
                                         r"\[2, 5, 8\], got \[2, 5, 7\]"):
        qkv.nn.SelfAttention(8).backward(x, np.zeros((2, 5, 7), np.float32))
    with pytest.raises(ValueError, match=r"MultiHeadSelfAttention\.backward: mask must be \[5, 5\]"):
        qkv.nn.MultiHeadSelfAttention(8, 2).backward(x, x, np.zeros((4, 4), bool))
    q, kv = np.zeros((2, 3, 8), np.float32), np.zeros((2, 6, 8), np.float32)
    with pytest.raises(ValueError, match=r"SeparateHeadsAttention\.backward: grad_output .*"
                                         r"\[2, 3, 8\], got \[2, 6, 8\]"):
        qkv.nn.SeparateHeadsAttention(8, 2, 3, 5).backward(q, kv, kv, kv)
    lazy = qkv.nn.LazyMultiHeadAttention(6, 2)
    with pytest.raises(ValueError, match="not materialized"):
        lazy.backward(q, kv, kv, np.zeros((2, 3, 6), np.float32))
    lazy(q, kv, kv)
    dq, dk, dv, grads = lazy.backward(q, kv, kv, np.ones((2, 3, 6), np.float32))
    assert dq.shape == q.shape and dk.shape == kv.shape and dv.shape == kv.shape
    assert sorted(grads) == sorted(lazy.state_dict())
    with pytest.raises(TypeError, match=r"SelfAttention\.backward: grad_output"):
        qkv.nn.SelfAttention(8).backward(x, "not an array")
