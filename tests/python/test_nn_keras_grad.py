"""qkv.nn.KerasMultiHeadAttention.backward against Keras 3's own gradients
(tests/fixtures/mha_keras_grad from tests/nn/make_keras_mha_grad_fixtures.py: jax.grad of
keras.layers.MultiHeadAttention in float64), the self-attention sum, dropout, and errors."""

import pathlib

import numpy as np
import pytest

import qkv
import qkv.nn
from fixture_files import load, rel_err  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "mha_keras_grad"
FILES = sorted(FIXTURES.glob("*.safetensors"))
TOL = 1e-5


def layer_of(t, o, **kw):
    weights = {k: v for k, v in t.items() if k.startswith("mha/")}
    return qkv.nn.KerasMultiHeadAttention.from_weights(
        weights, o["num_heads"], o["key_dim"], value_dim=o["value_dim"], use_bias=o["use_bias"],
        output_shape=o["output_shape"], attention_axes=o["attention_axes"],
        sliding_window=o.get("sliding_window"), use_gate=o.get("use_gate", False), **kw)


def test_fixture_count():
    assert len(FILES) >= 44
    assert sum("grad.mha/gate/kernel" in load(p)[0] for p in FILES) >= 7  # use_gate (Keras 3.15)


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.stem)
def test_backward_matches_keras(path):
    t, o = load(path)
    layer = layer_of(t, o)
    q = t["input.query"]
    v = q if o["self_attention"] else t["input.value"]
    dq, dv, dk, grads = layer.backward(
        q, v, t["grad_output"], key=t.get("input.key"), query_mask=t.get("input.query_mask"),
        value_mask=t.get("input.value_mask"), key_mask=t.get("input.key_mask"),
        attention_mask=t.get("input.attention_mask"), return_attention_scores=o["return_attention_scores"],
        use_causal_mask=o["use_causal_mask"])
    assert rel_err(dq, t["grad.query"]) <= TOL
    assert rel_err(dv, t["grad.value"]) <= TOL
    assert (dk is None) == ("grad.key" not in t)
    if dk is not None:
        assert rel_err(dk, t["grad.key"]) <= TOL
    keras = {k[len("grad.mha/"):]: g for k, g in t.items() if k.startswith("grad.mha/")}
    assert sorted(grads) == sorted(keras)
    largest = max(np.max(np.abs(g)) for k, g in t.items() if k.startswith("grad."))
    for name, want in keras.items():
        if name == "key/bias":  # 0 in exact arithmetic; Keras' is rounding noise (float32 softmax)
            assert not np.any(grads[name]) and np.max(np.abs(want)) <= 1e-6 * largest
        else:
            assert rel_err(grads[name], want) <= TOL, name


def test_self_attention_gradient_is_the_sum_of_roles():
    """One array as query and value: a central difference of the loss along a direction in
    that array matches (d_query + d_value) . direction."""
    t, o = load(FIXTURES / "self.safetensors")
    layer = layer_of(t, o)
    x, g = t["input.query"].astype(np.float64), t["grad_output"].astype(np.float64)
    dq, dv, dk, _ = layer.backward(x, x, g)
    assert dk is None
    d = np.random.default_rng(0).standard_normal(x.shape)
    eps = 1e-3
    loss = lambda y: float(np.sum(np.asarray(layer(y, y), np.float64) * g))  # noqa: E731
    numeric = (loss(x + eps * d) - loss(x - eps * d)) / (2 * eps)
    assert abs(numeric - np.sum((dq + dv) * d)) <= 2e-3 * max(1.0, abs(numeric))


def test_dropout_redrawn_from_the_seed():
    layer = qkv.nn.KerasMultiHeadAttention(2, 3, dropout=0.4)
    rng = np.random.default_rng(1)
    q, v = rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 5, 6))
    g = rng.standard_normal((2, 4, 6))
    layer(q, v)  # builds
    layer.dropout_seed = 7
    a = layer.backward(q, v, g, training=True)
    b = layer.backward(q, v, g, training=True)
    np.testing.assert_array_equal(a[0], b[0])
    layer.dropout_seed = 8
    c = layer.backward(q, v, g, training=True)
    assert rel_err(c[0], a[0]) > 1e-3
    eval_grads = layer.backward(q, v, g, training=False)
    assert rel_err(eval_grads[0], a[0]) > 1e-3
    assert layer.dropout_seed == 8


def test_training_holds_for_one_call_as_in_keras():
    """Keras: layer(x, training=True) drops out in that call only; a later layer(x) is inference.
    qkv kept the flag set, so every later call dropped out. The oracle: the same weights in a layer
    with dropout=0 (inference is dropout-free), and 0 = the drop rate's effect on a training call."""
    rng = np.random.default_rng(3)
    q, v = rng.standard_normal((2, 4, 6)).astype(np.float32), rng.standard_normal((2, 5, 6)).astype(np.float32)
    g = rng.standard_normal((2, 4, 6)).astype(np.float32)
    layer = qkv.nn.KerasMultiHeadAttention(2, 3, dropout=0.5)
    layer(q, v)  # builds
    plain = qkv.nn.KerasMultiHeadAttention.from_weights(layer.get_weights(), num_heads=2, key_dim=3)
    want, want_grads = plain(q, v), plain.backward(q, v, g)
    assert rel_err(layer(q, v, training=True), want) > 1e-2
    np.testing.assert_array_equal(layer(q, v), want)
    assert rel_err(layer.backward(q, v, g, training=True)[0], want_grads[0]) > 1e-2
    np.testing.assert_array_equal(layer.backward(q, v, g)[0], want_grads[0])
    assert layer.training is False
    layer.training = True  # the layer's own flag: calls without training= drop out
    assert rel_err(layer(q, v), want) > 1e-2
    np.testing.assert_array_equal(layer(q, v, training=False), want)
    assert layer.training is True


def test_backward_errors():
    layer = qkv.nn.KerasMultiHeadAttention(2, 4, output_shape=3)
    q, v = np.ones((2, 5, 8), np.float32), np.ones((2, 7, 6), np.float32)
    with pytest.raises(ValueError, match="has no weights"):
        layer.backward(q, v, np.ones((2, 5, 3), np.float32))
    layer(q, v)
    with pytest.raises(ValueError, match=r"KerasMultiHeadAttention.backward: grad_output must have the "
                                        r"output's shape \[2, 5, 3\].*got \[2, 5, 8\]"):
        layer.backward(q, v, np.ones((2, 5, 8), np.float32))
