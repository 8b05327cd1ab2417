"""qkv.nn at its edges, as a hostile user meets them: empty inputs, stale state, bad arguments.
Oracles: torch's numbers from committed fixtures (tests/nn/make_optim_fixtures.py) and NumPy."""

import pathlib
import warnings

import numpy as np
import pytest
from safetensors.numpy import load_file

import qkv
import qkv.nn

OPTIM = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "optim"


@pytest.mark.parametrize("name, shape", [("bce", (0, 3)), ("ce", (0, 4)), ("mse", (0,))])
def test_losses_of_empty_inputs_are_nan_as_torch(name, shape):
    """torch's reduction='mean' over no elements is NaN (so is NumPy's mean), the gradient an empty
    array of the input's shape; qkv returned 0.0, a loss that looked perfect."""
    t = load_file(str(OPTIM / "losses.safetensors"))
    x = np.zeros(shape, np.float32)
    if name == "bce":
        loss, grad = qkv.nn.binary_cross_entropy_with_logits(x, x)
    elif name == "ce":
        loss, grad = qkv.nn.cross_entropy(x, np.zeros(0, np.int64))
    else:
        loss, grad = qkv.nn.mse_loss(x, x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert np.isnan(np.mean(np.zeros(0)))  # the NumPy oracle
    assert np.isnan(t[f"{name}_empty_loss"][0])  # torch's
    assert np.isnan(loss), loss
    assert grad.shape == t[f"{name}_empty_grad"].shape == shape and grad.dtype == np.float32


def test_static_layer_refuses_new_float_weights_dynamic_requantizes():
    """quantize_static's activation scales were calibrated with the layer's own weights: new float
    weights made them stale without a word (torch.ao refuses float weights into a converted module)."""
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 2, 16)).astype(np.float32)
    f, g = qkv.nn.MultiheadAttention(16, 2), qkv.nn.MultiheadAttention(16, 2)
    g.load_state_dict({k: 4 * v for k, v in qkv.nn.MultiheadAttention(16, 2).state_dict().items()})
    s = f.quantize_static([x])
    before, _ = s(x, x, x, need_weights=False)
    with pytest.raises(ValueError, match="statically quantized.*quantize_static"):
        s.load_state_dict(g.state_dict())
    after, _ = s(x, x, x, need_weights=False)
    np.testing.assert_array_equal(after, before)
    d = f.quantize_dynamic()
    d.load_state_dict(g.state_dict())
    want, _ = g.quantize_dynamic()(x, x, x, need_weights=False)
    np.testing.assert_array_equal(d(x, x, x, need_weights=False)[0], want)


def test_keras_quantized_layer_stays_quantized_with_new_weights():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 5, 16)).astype(np.float32)
    a, b = qkv.nn.KerasMultiHeadAttention(2, 8), qkv.nn.KerasMultiHeadAttention(2, 8)
    a(x, x), b(x, 2 * x)  # built at their first calls (the same glorot seed: b's weights are set below)
    b.set_weights([w * 1.5 for w in b.get_weights()])
    q = a.quantize_dynamic(weight_bits=7)
    q.set_weights(b.get_weights())
    assert q.quantized
    np.testing.assert_array_equal(q(x, x), b.quantize_dynamic(weight_bits=7)(x, x))
    assert np.abs(q(x, x) - b(x, x)).max() > 0  # the int8 path, not b's float32 one
    bad = b.get_weights()
    bad[3] = np.zeros((3, 8), np.float32)  # key/bias should be [2, 8]
    before = q(x, x)
    with pytest.raises(ValueError, match="key/bias"):
        q.set_weights(bad)
    np.testing.assert_array_equal(q(x, x), before)


def test_seed_layers_refuse_unexpected_state_dict_keys_as_torch_strict():
    sh = qkv.nn.SeparateHeadsAttention(8, 2)
    sd = dict(sh.state_dict(), **{"W_q.bias": np.ones(8, np.float32)})
    with pytest.raises(ValueError, match=r"unexpected keys in state_dict \[W_q.bias\]"):
        sh.load_state_dict(sd)


def test_keras_layer_takes_an_empty_batch():
    """Keras 3.15.1 gives output (0, 5, 8) and scores (0, 2, 5, 5) (checked live); qkv raised
    'reshape: shape [0, 2, -1, 4] is invalid'."""
    layer = qkv.nn.KerasMultiHeadAttention(2, 4)
    layer(np.ones((1, 5, 8), np.float32), np.ones((1, 5, 8), np.float32))
    z = np.zeros((0, 5, 8), np.float32)
    out, scores = layer(z, z, return_attention_scores=True)
    assert out.shape == (0, 5, 8) and scores.shape == (0, 2, 5, 5)


def test_keras_sgd_takes_keras_arguments():
    """keras.optimizers.SGD (3.15.1, checked live): nesterov without momentum is its plain step,
    momentum past 1 a ValueError; qkv refused the first and took the second."""
    w = {"w": np.ones(3, np.float32)}
    g = {"w": np.full(3, 0.5, np.float32)}
    np.testing.assert_allclose(qkv.nn.SGD(lr=0.1, nesterov=True, convention="keras").step(w, g)["w"], 0.95, rtol=1e-7)
    with pytest.raises(ValueError, match=r"momentum must be in \[0, 1\]"):
        qkv.nn.SGD(momentum=1.5, convention="keras")
    with pytest.raises(ValueError, match="no dampening"):
        qkv.nn.SGD(momentum=0.9, dampening=0.1, convention="keras")


def test_torch_flavour_training_flag_is_settable_as_on_a_torch_module():
    """torch modules take `m.training = True` (the flag train() sets); qkv's had no setter."""
    m = qkv.nn.MultiheadAttention(8, 2, dropout=0.5)
    x = np.random.default_rng(0).standard_normal((3, 2, 8)).astype(np.float32)
    inference, _ = m(x, x, x, need_weights=False)
    m.training = True
    assert m.training
    trained, _ = m(x, x, x, need_weights=False)
    assert np.abs(trained - inference).max() > 1e-3  # dropout on
    m.training = False
    np.testing.assert_array_equal(m(x, x, x, need_weights=False)[0], inference)
