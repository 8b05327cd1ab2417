"""qkv.nn's training pieces against torch where a bug bash found them apart: cross_entropy's
ignore_index, float64, float16, bfloat16 and integer parameters in SGD / Adam, BCE with logits at
infinite logits. Oracle: torch 2.15's values in committed fixtures (tests/nn/make_optim_fixtures.py);
for float16 / bfloat16 parameters a float64 NumPy version of torch's update rule."""

import json
import pathlib

import ml_dtypes
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file

import qkv
import qkv.nn

OPTIM = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "optim"


def test_cross_entropy_ignores_minus_100_as_torch():
    """Hugging Face pads labels with -100, torch's default ignore_index: those rows count in neither
    the sum nor the mean and get gradient 0. qkv raised ValueError for the label."""
    t = load_file(str(OPTIM / "losses.safetensors"))
    x, y = t["ce_ignore_logits"], t["ce_ignore_targets"]
    assert (y == -100).sum() == 2
    loss, grad = qkv.nn.cross_entropy(x, y)
    np.testing.assert_allclose(loss, t["ce_ignore_loss"][0], rtol=1e-6)
    np.testing.assert_allclose(grad, t["ce_ignore_grad"], rtol=0, atol=1e-7)
    assert not grad[y == -100].any()
    loss, grad = qkv.nn.cross_entropy(x[:3], np.full(3, -100, np.int64))  # every row ignored
    assert np.isnan(t["ce_all_ignored_loss"][0]) and np.isnan(loss)
    np.testing.assert_array_equal(grad, t["ce_all_ignored_grad"])
    # another ignore_index: -1 ignored, -100 then a class out of range
    loss, _ = qkv.nn.cross_entropy(x, np.where(y == -100, -1, y), ignore_index=-1)
    np.testing.assert_allclose(loss, t["ce_ignore_loss"][0], rtol=1e-6)
    with pytest.raises(ValueError, match=r"cross_entropy: target -100 of row 1 is not in \[0, 4\) nor ignore_index -1"):
        qkv.nn.cross_entropy(x, y, ignore_index=-1)
    with pytest.raises(ValueError, match=r"target 4 of row 3 is not in \[0, 4\)"):
        qkv.nn.cross_entropy(x, np.array([2, -100, 0, 4, -100, 1]))


@pytest.mark.parametrize("name", ["torch_sgd_nesterov_f64", "torch_adam_wd_f64"])
def test_float64_parameters_step_in_float64_as_torch(name):
    """torch keeps a parameter's dtype; qkv's step returned float32 copies of float64 parameters
    (1.4e-7 / 1.7e-7 from torch's float64 steps by step 5, the float32 runs' distance)."""
    path = OPTIM / f"{name}.safetensors"
    t = load_file(str(path))
    with safe_open(str(path), "np") as f:
        o = json.loads(f.metadata()["options"])
    assert o["dtype"] == "float64" and t["w0"].dtype == np.float64
    a = o["args"]
    if o["optimizer"] == "SGD":
        opt = qkv.nn.SGD(lr=a["lr"], momentum=a["momentum"], weight_decay=a["weight_decay"], nesterov=a["nesterov"])
    else:
        opt = qkv.nn.Adam(lr=a["lr"], betas=tuple(a["betas"]), eps=a["eps"], weight_decay=a["weight_decay"])
    params = {"w": t["w0"], "b": t["b0"]}
    for step in range(t["gw"].shape[0]):
        params = opt.step(params, {"w": t["gw"][step], "b": t["gb"][step]})
        assert params["w"].dtype == params["b"].dtype == np.float64
        np.testing.assert_allclose(params["w"], t["w"][step], rtol=0, atol=1e-12)
        np.testing.assert_allclose(params["b"], t["b"][step], rtol=0, atol=1e-12)
    if isinstance(opt, qkv.nn.Adam):
        assert all(v.dtype == np.float64 for v in opt.state().values())
    # float32 parameters stay float32
    out = opt.step({"w": t["w0"].astype(np.float32)}, {"w": t["gw"][0].astype(np.float32)})
    assert out["w"].dtype == np.float32


def test_bce_with_logits_at_infinite_logits_as_torch():
    """x in {-inf, +inf, nan} x y in {0, 0.5, 1}, each a loss of its own: torch's (1 - y) x -
    log_sigmoid(x) gives NaN at x = -inf and at (+inf, 1), inf at (+inf, y < 1); qkv gave inf at
    (-inf, 0.5) and (-inf, 1) and NaN at (+inf, 0.5)."""
    t = load_file(str(OPTIM / "losses.safetensors"))
    for x, y, want, want_grad in zip(t["bce_inf_logits"], t["bce_inf_targets"], t["bce_inf_loss"], t["bce_inf_grad"]):
        loss, grad = qkv.nn.binary_cross_entropy_with_logits(np.array([x]), np.array([y]))
        np.testing.assert_equal(loss, want, err_msg=f"x {x} y {y}")  # NaN equals NaN here
        np.testing.assert_equal(grad[0], want_grad, err_msg=f"x {x} y {y}")


def _reference_step(kind, p, g, state, t):
    """One step of torch's rule in float64 (SGD nesterov with L2, Adam with L2, AdamW), `state`
    updated in place: the oracle for parameters stored in float16 / bfloat16."""
    if kind == "SGD":
        d = g + 0.01 * p
        state["buf"] = d if "buf" not in state else 0.9 * state["buf"] + d
        return p - 0.1 * (d + 0.9 * state["buf"])
    m, v = state.get("m", np.zeros_like(p)), state.get("v", np.zeros_like(p))
    if kind == "AdamW":
        p = p * (1 - 0.01 * 0.01)
    gi = g if kind == "AdamW" else g + 0.01 * p
    state["m"], state["v"] = 0.8 * m + 0.2 * gi, 0.95 * v + 0.05 * gi * gi
    bc1, bc2 = 1 - 0.8**t, 1 - 0.95**t
    return p - 0.01 / bc1 * state["m"] / (np.sqrt(state["v"]) / np.sqrt(bc2) + 1e-6)


@pytest.mark.parametrize("kind", ["SGD", "Adam", "AdamW"])
@pytest.mark.parametrize("dtype", [np.float16, ml_dtypes.bfloat16])
def test_half_parameters_step_in_their_dtype_as_torch(kind, dtype):
    """torch steps float16 / bfloat16 parameters in their own dtype; qkv's step returned float32
    copies. Now each step comes back in the parameter's dtype, computed in float32 and rounded to
    nearest: within half a unit in the last place of the float64 rule applied to the stored values."""
    if kind == "SGD":
        opt = qkv.nn.SGD(lr=0.1, momentum=0.9, weight_decay=0.01, nesterov=True)
    else:
        opt = qkv.nn.Adam(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.01,
                          decoupled_weight_decay=kind == "AdamW")
    rng = np.random.default_rng(3)
    params, state = {"w": rng.standard_normal(64).astype(dtype)}, {}
    mantissa = 10 if dtype == np.float16 else 7
    for t in range(1, 6):
        g = rng.standard_normal(64).astype(np.float32)
        want = _reference_step(kind, params["w"].astype(np.float64), g.astype(np.float64), state, t)
        params = opt.step(params, {"w": g})
        assert params["w"].dtype == dtype
        got = params["w"].astype(np.float64)
        half_ulp = np.ldexp(0.5, np.floor(np.log2(np.minimum(abs(got), abs(want)))).astype(int) - mantissa)
        assert (abs(got - want) <= half_ulp * 1.001).all(), f"step {t}: {got - want}"


@pytest.mark.parametrize("dtype", [np.int64, np.int32, np.bool_])
def test_integer_parameters_are_refused_as_torch(dtype):
    """torch trains only floating point tensors (an integer one cannot require gradients); qkv
    stepped integer parameters as float32 copies."""
    for opt in (qkv.nn.SGD(lr=0.1), qkv.nn.Adam()):
        with pytest.raises(TypeError, match="parameter 'w' is .*; only floating point parameters"):
            opt.step({"w": np.ones(3, dtype)}, {"w": np.ones(3, np.float32)})
