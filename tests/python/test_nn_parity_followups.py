"""qkv.nn's training pieces against torch where a bug bash found them apart: cross_entropy's
ignore_index, float64 parameters in SGD / Adam, BCE with logits at infinite logits.
Oracle: torch 2.15's values in committed fixtures (tests/nn/make_optim_fixtures.py)."""

import json
import pathlib

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
