"""qkv.nn.keras_adam_state + Adam.load_state: Keras' saved Adam slots (seed 001's files, saved by
Keras 3.15.1 after 10 epochs, tests/seed001/train_seed001.py) resume training; one step checked
against Keras' Adam update written out in NumPy (keras/src/optimizers/adam.py)."""
import pathlib

import numpy as np
import pytest

import qkv

SEED = pathlib.Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "seed001"
VARIABLES = [(f"multi_head_attention/{p}/{w}", f"{p}_{w}") for p in ("query", "key", "value", "attention_output")
             for w in ("kernel", "bias")] + [("dense/kernel", "dense_kernel"), ("dense/bias", "dense_bias")]


@pytest.mark.parametrize("name", ["model.keras", "model.weights.h5", "model.h5", "ckpt.index"])
def test_every_file_keras_saved_gives_the_same_state(name):
    want, want_it, want_lr = qkv.nn.keras_adam_state(SEED / "model.keras", VARIABLES)
    state, iterations, lr = qkv.nn.keras_adam_state(SEED / name, VARIABLES)
    assert (iterations, lr) == (want_it, want_lr) == (10, pytest.approx(1e-3))
    assert sorted(state) == sorted(want) and len(state) == 20
    for key, value in want.items():
        np.testing.assert_array_equal(state[key], value)
        if key.startswith("v/"):
            assert (value >= 0).all()  # second moments


def test_a_resumed_step_is_keras_adam_step():
    state, iterations, lr = qkv.nn.keras_adam_state(SEED / "ckpt.index", VARIABLES)
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal(state[f"m/{n}"].shape).astype(np.float32) for _, n in VARIABLES}
    grads = {n: rng.standard_normal(p.shape).astype(np.float32) for n, p in params.items()}
    opt = qkv.nn.Adam(lr=lr, eps=1e-7, convention="keras")
    opt.load_state(state, iterations)
    stepped = opt.step(params, grads)
    assert opt.steps == iterations + 1
    t, b1, b2 = iterations + 1, 0.9, 0.999
    alpha = lr * np.sqrt(1 - b2**t) / (1 - b1**t)
    for n, p in params.items():
        g = grads[n].astype(np.float64)
        m = state[f"m/{n}"] + (g - state[f"m/{n}"]) * (1 - b1)
        v = state[f"v/{n}"] + (g * g - state[f"v/{n}"]) * (1 - b2)
        want = p - alpha * m / (np.sqrt(v) + 1e-7)
        np.testing.assert_allclose(stepped[n], want, rtol=0, atol=2e-6 * np.abs(want).max())
        # without the saved moments the step differs (the state is what matters)
    fresh = qkv.nn.Adam(lr=lr, eps=1e-7, convention="keras").step(params, grads)
    assert max(np.abs(fresh[n] - stepped[n]).max() for n in params) > 1e-5


def test_errors_name_the_file_and_the_slot():
    bad = [("mha/query/kernel", "q")] + VARIABLES[1:]
    with pytest.raises(ValueError, match=r"keras_adam_state: .*ckpt.index: no Adam slots mha_query_kernel_momentum"):
        qkv.nn.keras_adam_state(SEED / "ckpt.index", bad)
    with pytest.raises(ValueError, match=r"22 optimizer/vars entries for 9 variables"):
        qkv.nn.keras_adam_state(SEED / "model.keras", VARIABLES[:-1])
