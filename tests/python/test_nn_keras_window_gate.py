"""Keras 3.15's MultiHeadAttention options sliding_window and use_gate in qkv.nn.KerasMultiHeadAttention:
the numbers are checked against Keras in test_nn.py (tests/fixtures/mha_keras/window_*, gate_*) and
test_nn_keras_grad.py (mha_keras_grad); here the weights' order, Keras' own weight file of a gated
layer, and the errors."""

import json
import pathlib

import numpy as np
import pytest
from safetensors import safe_open

import qkv
import qkv.nn

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "mha_keras"


def rel_err(got, want):
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    assert got.shape == want.shape
    return np.max(np.abs(got - want)) / max(np.max(np.abs(want)), 1e-300)


def test_constructor_takes_both_options():
    layer = qkv.nn.KerasMultiHeadAttention(2, 3, value_dim=5, sliding_window=2, use_gate=True)
    assert layer.sliding_window == 2 and layer.use_gate
    q = np.random.default_rng(0).standard_normal((2, 6, 7)).astype(np.float32)
    assert layer(q, q).shape == q.shape  # builds at the first call
    w = layer.get_weights()  # Keras' order: query, key, gate, value, attention_output
    assert [x.shape for x in w] == [(7, 2, 3), (2, 3), (7, 2, 3), (2, 3), (7, 2, 5), (2, 5), (7, 2, 5), (2, 5),
                                    (2, 5, 7), (7,)]
    assert len(qkv.nn.KerasMultiHeadAttention(2, 3, value_dim=5, use_gate=True, use_bias=False).from_weights(
        [x for x in w[::2]]).get_weights()) == 5
    with pytest.raises(ValueError, match="sliding_window must be None or a positive integer, got 0"):
        qkv.nn.KerasMultiHeadAttention(2, 3, sliding_window=0)
    with pytest.raises(TypeError, match="use_gate"):
        qkv.nn.KerasMultiHeadAttention(2, 3, use_gate="yes")


def test_window_over_other_axes_is_refused():
    x = np.ones((1, 3, 4, 6), np.float32)
    layer = qkv.nn.KerasMultiHeadAttention(2, 2, sliding_window=2)
    with pytest.raises(ValueError, match=r"sliding_window=2 with attention over the axes \(1, 2\)"):
        layer(x, x)
    assert qkv.nn.KerasMultiHeadAttention(2, 2, sliding_window=2, attention_axes=1)(x, x).shape == x.shape


def test_keras_weight_file_of_a_gated_layer():
    """Keras' model.save_weights of gate_window's layer: use_gate comes from the weights
    (layers/multi_head_attention/_gate_dense/vars/0), sliding_window is a call-time option."""
    with safe_open(str(FIXTURES / "gate_window.safetensors"), "np") as f:
        t = {k: f.get_tensor(k) for k in f.keys()}
        o = json.loads(f.metadata()["options"])
    weights = qkv.load(str(FIXTURES / "gate_window.weights.h5"))
    layer = qkv.nn.KerasMultiHeadAttention.from_weights(weights, sliding_window=o["sliding_window"])
    assert layer.use_gate
    out, scores = layer(t["input.query"], t["input.value"], value_mask=t["input.value_mask"],
                        attention_mask=t["input.attention_mask"], use_causal_mask=True, return_attention_scores=True)
    assert rel_err(out, t["expected.output"]) <= 1e-5
    assert rel_err(scores, t["expected.scores"]) <= 1e-5
    with pytest.raises(ValueError, match="the weights have a gate .*use_gate=True"):
        qkv.nn.KerasMultiHeadAttention(2, 4).from_weights(weights)
    with pytest.raises(ValueError, match="has a gate"):
        qkv.nn.keras_to_torch(weights)
