"""qkv.nn against the frameworks' fixtures (tests/fixtures/mha_torch, mha_keras), a NumPy
oracle of torch.nn.MultiheadAttention's formula, and torch's own numbers from committed fixtures."""

import json
import pathlib

import numpy as np
import pytest
from fake_torch import FakeTensor
from fake_torch import install as install_fake_torch
from safetensors import safe_open
from safetensors.numpy import load_file

import qkv
import qkv.nn
from fixture_files import load, rel_err  # noqa: E402

FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"
TOL = 1e-5


TORCH_FILES = sorted((FIXTURES / "mha_torch").glob("*.safetensors"))
KERAS_FILES = sorted((FIXTURES / "mha_keras").glob("*.safetensors"))
AXES_FILES = sorted((FIXTURES / "mha_keras_axes").glob("*.safetensors"))


def test_fixture_counts():
    assert len(TORCH_FILES) >= 30 and len(KERAS_FILES) >= 30 and len(AXES_FILES) >= 19


@pytest.mark.parametrize("path", TORCH_FILES, ids=lambda p: p.stem)
def test_multihead_attention_matches_pytorch(path):
    t, o = load(path)
    sd = {k: v for k, v in t.items() if not k.startswith(("input.", "expected."))}
    mha = qkv.nn.MultiheadAttention.from_state_dict(sd, o["num_heads"], add_zero_attn=o["add_zero_attn"],
                                                    batch_first=o["batch_first"])
    q = t["input.query"]
    k = q if o["self_attention"] else t["input.key"]
    v = q if o["self_attention"] else (k if o["kv_shared"] else t["input.value"])
    out, w = mha(q, k, v, key_padding_mask=t.get("input.key_padding_mask"), need_weights=o["need_weights"],
                 attn_mask=t.get("input.attn_mask"), average_attn_weights=o["average_attn_weights"],
                 is_causal=o["is_causal"])
    assert rel_err(out, t["expected.output"]) <= TOL
    assert (w is None) == ("expected.weights" not in t)
    if w is not None:
        assert rel_err(w, t["expected.weights"]) <= TOL


@pytest.mark.parametrize("path", KERAS_FILES + AXES_FILES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_keras_multi_head_attention_matches_keras(path):
    t, o = load(path)
    weights = {k: v for k, v in t.items() if k.startswith("mha/")}
    layer = qkv.nn.KerasMultiHeadAttention.from_weights(
        weights, o["num_heads"], o["key_dim"], value_dim=o["value_dim"], use_bias=o["use_bias"],
        output_shape=o["output_shape"], attention_axes=o["attention_axes"],
        sliding_window=o.get("sliding_window"), use_gate=o.get("use_gate", False))  # Keras 3.15's two
    q = t["input.query"]
    r = layer(q, t.get("input.value", q), key=t.get("input.key"), query_mask=t.get("input.query_mask"),
              value_mask=t.get("input.value_mask"), key_mask=t.get("input.key_mask"),
              attention_mask=t.get("input.attention_mask"), return_attention_scores=o["return_attention_scores"],
              use_causal_mask=o["use_causal_mask"])
    out, scores = r if o["return_attention_scores"] else (r, None)
    assert rel_err(out, t["expected.output"]) <= TOL
    if scores is not None:
        assert rel_err(scores, t["expected.scores"]) <= TOL


def _axis_fault(rank, axes):
    """Why qkv refuses attention_axes on rank-`rank` inputs (Keras reads a < 0 as rank + a)."""
    seen = []
    for a in axes:
        n = a + rank if a < 0 else a
        if n == 0:
            return "batch axis"
        if n == rank - 1:
            return "feature axis"
        if not 0 < n < rank:
            return "out of range"
        if n in seen:
            return "twice"
        seen.append(n)
    raise AssertionError(f"{axes} are token axes of rank {rank}")


def test_keras_attention_axes_keras_refuses_or_reads_otherwise():
    """Every axis Keras 3 rejects, or reads as something other than token axes (the batch, the
    heads of the projection), is a qkv ValueError that says which (tests/fixtures/mha_keras_axes)."""
    cases = json.loads((FIXTURES / "mha_keras_axes" / "keras_axes_errors.json").read_text())["cases"]
    assert len(cases) >= 40
    for c in cases:
        rank, axes = c["rank"], c["attention_axes"]
        if c["keras"] == "accepts":  # Keras attends over a non-token axis: the batch, the heads or a wrapped one
            assert any(not 0 < a < rank - 1 for a in c["attends_over"]), c
        q = np.ones((2,) + (3,) * (rank - 2) + (4,), np.float32)
        layer = qkv.nn.KerasMultiHeadAttention(2, 2, attention_axes=axes)
        with pytest.raises(ValueError, match=f"attention axis .*{_axis_fault(rank, axes)}"):
            layer(q, q)


def seed(name):
    return load(FIXTURES / "mha_torch" / "seeds" / f"{name}.safetensors")


def params(t):
    return {k: v for k, v in t.items() if not k.startswith(("input.", "expected."))}


def test_seed_layers_match_the_articles_code():
    t, o = seed("mhsa_dim_head")
    m = qkv.nn.MultiHeadSelfAttention(o["dim"], o["heads"], o["dim_head"])
    m.load_state_dict(params(t))
    assert rel_err(m(t["input.x"], t["input.mask"]), t["expected.output"]) <= TOL
    t, o = seed("self_attention_mask")
    s = qkv.nn.SelfAttention(o["dim"])
    s.load_state_dict(params(t))
    assert rel_err(s(t["input.x"], t["input.mask"]), t["expected.output"]) <= TOL
    t, o = seed("seed003_causal_scale")
    a = qkv.nn.SeparateHeadsAttention(o["E"], o["H"], o["Dkq"], o["Dv"], scale=o["scale"], causal=True)
    a.load_state_dict(params(t))
    out, scores = a(t["input.q"], t["input.k"], t["input.v"])
    assert rel_err(out, t["expected.output"]) <= TOL and rel_err(scores, t["expected.scores"]) <= TOL
    t, o = seed("seed004_lazy")
    lazy = qkv.nn.LazyMultiHeadAttention(o["hidden"], o["heads"])
    assert not lazy.materialized
    lazy.load_state_dict(params(t))
    assert rel_err(lazy(t["input.q"], t["input.k"], t["input.v"]), t["expected.output"]) <= TOL
    with pytest.raises(ValueError, match="the first call fixed d_q = 7"):
        lazy(t["input.q"][..., :5], t["input.k"], t["input.v"])


def numpy_mha(x, sd, heads, kpm, attn_mask):
    """torch.nn.MultiheadAttention's formula in float64 NumPy: batch_first self-attention with a
    bool key_padding_mask (True = ignore), a float attn_mask and add_bias_kv."""
    n, l, e = x.shape
    d = e // heads
    w, b = sd["in_proj_weight"].astype(np.float64), sd["in_proj_bias"].astype(np.float64)
    q, k, v = (x @ w[i * e:(i + 1) * e].T + b[i * e:(i + 1) * e] for i in range(3))
    k = np.concatenate([k, np.broadcast_to(sd["bias_k"].reshape(1, 1, e), (n, 1, e))], 1)
    v = np.concatenate([v, np.broadcast_to(sd["bias_v"].reshape(1, 1, e), (n, 1, e))], 1)
    split = lambda t: t.reshape(n, -1, heads, d).transpose(0, 2, 1, 3)  # noqa: E731
    s = split(q) @ split(k).transpose(0, 1, 3, 2) / np.sqrt(d)
    mask = np.pad(attn_mask, ((0, 0), (0, 1)))[None, None] + np.where(np.pad(kpm, ((0, 0), (0, 1))), -np.inf, 0)[:, None, None]
    s = s + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = (p @ split(v)).transpose(0, 2, 1, 3).reshape(n, l, e)
    return o @ sd["out_proj.weight"].T + sd["out_proj.bias"], p.mean(1)


def test_multihead_attention_matches_a_numpy_oracle():
    rng = np.random.default_rng(5)
    e, heads = 12, 3
    mha = qkv.nn.MultiheadAttention(e, heads, add_bias_kv=True, batch_first=True)
    sd = {k: rng.standard_normal(v.shape).astype(np.float32) * 0.4 for k, v in mha.state_dict().items()}
    mha.load_state_dict(sd)
    x = rng.standard_normal((2, 6, e)).astype(np.float32)
    kpm = rng.random((2, 6)) < 0.3
    kpm[:, 0] = False
    attn = rng.standard_normal((6, 6)).astype(np.float32)
    out, w = mha(x, x, x, key_padding_mask=kpm, attn_mask=attn)
    want_out, want_w = numpy_mha(x.astype(np.float64), sd, heads, kpm, attn)
    assert rel_err(out, want_out) <= TOL and rel_err(w, want_w) <= TOL


def test_errors_are_python_exceptions():
    with pytest.raises(ValueError, match="divisible by num_heads"):
        qkv.nn.MultiheadAttention(10, 3)
    mha = qkv.nn.MultiheadAttention(8, 2)
    x = np.zeros((3, 2, 8), np.float32)
    with pytest.raises(ValueError, match="Need attn_mask"):
        mha(x, x, x, is_causal=True)
    with pytest.raises(ValueError, match="missing keys"):
        mha.load_state_dict({})
    layer = qkv.nn.MultiheadAttention(8, 2).from_state_dict(mha.state_dict())  # instance form
    assert isinstance(layer, qkv.nn.MultiheadAttention)
    keras = qkv.nn.KerasMultiHeadAttention(2, 4, output_shape=(3, 2))
    out = keras(np.ones((1, 5, 6), np.float32), np.ones((1, 4, 7), np.float32))  # builds at the first call
    assert out.shape == (1, 5, 3, 2) and keras.built and keras.get_weights()[6].shape == (2, 4, 3, 2)
    again = qkv.nn.KerasMultiHeadAttention(2, 4, output_shape=(3, 2)).from_weights(keras.get_weights())
    assert np.array_equal(again(np.ones((1, 5, 6), np.float32), np.ones((1, 4, 7), np.float32)), out)


def test_torch_tensors_in_torch_tensors_out_with_torch_parity(monkeypatch):
    """torch's numbers from the committed fixture (tests/python/make_torch_nn_fixtures.py, run by
    `make fixtures`), fed in as torch tensors (fake_torch: .venv has no torch) and back out as them."""
    f = load_file(str(FIXTURES / "torch_interop" / "mha_kdim_vdim.safetensors"))
    torch = install_fake_torch(monkeypatch)
    sd = {name[3:]: FakeTensor(t) for name, t in f.items() if name.startswith("sd.")}
    mha = qkv.nn.MultiheadAttention.from_state_dict(sd, 4, batch_first=True)
    assert (mha.embed_dim, mha.kdim, mha.vdim) == (16, 10, 6)
    q, k, v, kpm = (FakeTensor(f[n]) for n in ("q", "k", "v", "kpm"))
    out, w = mha(q, k, v, key_padding_mask=kpm, average_attn_weights=False)
    assert isinstance(out, torch.Tensor) and isinstance(w, torch.Tensor)
    assert rel_err(out.array, f["out"]) <= TOL and rel_err(w.array, f["w"]) <= TOL
    assert np.all(w.array[1, :, :, 4:] == 0)  # the padded keys take no weight


def test_quantize_dynamic_keeps_the_layer_within_two_percent():
    # qkv.nn.quantize_dynamic(mha): int8 projections (per-channel weights, per-token
    # activations); the float32 layer is the oracle of the error it costs (measured ~1.4%
    # on random weights, torch.ao's quantize_dynamic 3.7% on the same: docs/nn_quantization.md).
    layer = qkv.nn.MultiheadAttention(64, 4, batch_first=True)
    q = qkv.nn.quantize_dynamic(layer, weight_bits=8)
    assert q.quantized and not layer.quantized and q.weight_bits == 8
    x = np.random.default_rng(3).standard_normal((2, 40, 64)).astype(np.float32)
    want, _ = layer(x, x, x, need_weights=False)
    got, _ = q(x, x, x, need_weights=False)
    assert got.dtype == np.float32 and got.shape == want.shape
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert 0 < rel < 2e-2, rel
    assert q.state_dict().keys() == layer.state_dict().keys()  # the float32 parameters, as before
    np.testing.assert_array_equal(q.state_dict()["out_proj.weight"], layer.state_dict()["out_proj.weight"])
    with pytest.raises(TypeError, match="quantize_dynamic: expected a qkv.nn.MultiheadAttention or KerasMultiHeadAttention, got str"):
        qkv.nn.quantize_dynamic("layer")


def test_quantize_dynamic_weight_bits():
    # 7-bit weights (in [-63, 63]): what CPUs without VNNI choose (qkv.nn.int8_weight_bits()), so
    # that oneDNN's int8 kernel stays exact there; any CPU runs either when asked.
    assert qkv.nn.int8_weight_bits() in (7, 8)
    layer = qkv.nn.MultiheadAttention(64, 4, batch_first=True)
    assert layer.weight_bits == 0
    assert qkv.nn.quantize_dynamic(layer).weight_bits == qkv.nn.int8_weight_bits()
    x = np.random.default_rng(3).standard_normal((2, 40, 64)).astype(np.float32)
    want, _ = layer(x, x, x, need_weights=False)
    for bits, bound in ((7, 3e-2), (8, 2e-2)):
        q = layer.quantize_dynamic(weight_bits=bits)
        assert q.weight_bits == bits
        assert np.abs(q.quantized_state_dict()["in_proj_weight"]).max() == (63 if bits == 7 else 127)
        got, _ = q(x, x, x, need_weights=False)
        rel = np.linalg.norm(got - want) / np.linalg.norm(want)
        assert 0 < rel < bound, (bits, rel)
        assert layer.quantize_static([x], weight_bits=bits).weight_bits == bits
    keras = qkv.nn.KerasMultiHeadAttention(num_heads=4, key_dim=16)
    keras(x, x)
    assert qkv.nn.quantize_dynamic(keras, weight_bits=7).quantized
    with pytest.raises(ValueError, match="weight_bits must be 8, 7 or 0"):
        layer.quantize_dynamic(weight_bits=4)
    with pytest.raises(TypeError, match="weight_bits must be 8, 7 or None"):
        layer.quantize_dynamic(weight_bits="8")


@pytest.mark.parametrize("observer", ["minmax", "percentile"])
def test_quantize_static_calibrates_one_scale_per_projection(observer):
    layer = qkv.nn.MultiheadAttention(64, 4, batch_first=True)
    rng = np.random.default_rng(4)
    calib = [rng.standard_normal((2, 40, 64)).astype(np.float32) for _ in range(3)]
    kv = rng.standard_normal((2, 50, 64)).astype(np.float32)
    q = layer.quantize_static(calib + [(calib[0], kv, kv)], observer=observer)
    assert q.quantized
    x = rng.standard_normal((2, 40, 64)).astype(np.float32)
    want, _ = layer(x, x, x, need_weights=False)
    got, _ = q(x, x, x, need_weights=False)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert 0 < rel < 3e-2, rel
    with pytest.raises(ValueError, match="observer must be 'minmax' or 'percentile', got 'mean'"):
        layer.quantize_static(calib, observer="mean")
    with pytest.raises(ValueError, match="no calibration batches"):
        layer.quantize_static([])


MHA_GRAD = sorted((pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "mha_grad").glob("*.safetensors"))


def test_mha_grad_fixtures_are_there():
    assert len(MHA_GRAD) == 61, "tests/fixtures/mha_grad (make fixtures)"


@pytest.mark.parametrize("path", MHA_GRAD, ids=lambda p: p.stem)
def test_mha_backward_matches_torch_autograd(path):
    # torch.nn.MultiheadAttention's float64 autograd gradients of sum(out * grad_out)
    # (tests/nn/make_torch_mha_grad_fixtures.py), the float32 layer within 1e-5 of each scale;
    # add_bias_kv is read from the state_dict (bias_k, bias_v), add_zero_attn given.
    t = load_file(str(path))
    with safe_open(str(path), "np") as f:
        opts = json.loads(f.metadata()["options"])
    c = opts["ctor"]
    sd = {k[len("param/"):]: v for k, v in t.items() if k.startswith("param/")}
    layer = qkv.nn.MultiheadAttention.from_state_dict(sd, c["num_heads"], batch_first=c.get("batch_first", False),
                                                      add_zero_attn=c.get("add_zero_attn", False))
    fwd = opts["forward"]
    q = t["query"]
    k, v = (q, q) if opts["same_input"] else (t["key"], t["value"])
    dq, dk, dv, grads = layer.backward(q, k, v, t["grad_out"], key_padding_mask=t.get("key_padding_mask"),
                                       attn_mask=t.get("attn_mask"), need_weights=fwd.get("need_weights", True),
                                       is_causal=fwd.get("is_causal", False))

    # 1e-5 of each gradient's scale, floored at 1e-2 of the configuration's largest gradient
    # (with one key the softmax is constant: torch's dq and dk are exactly 0, qkv's f32 noise).
    floor = 1e-2 * max(np.abs(v).max() for k, v in t.items() if k.startswith("d") and v.size)

    def close(got, want, what):
        scale = max(np.abs(want).max() if want.size else 0.0, floor)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-5 * scale, err_msg=what)

    if opts["same_input"]:
        close(dq + dk + dv, t["d_query"], "d_query")
    else:
        close(dq, t["d_query"], "d_query")
        close(dk, t["d_key"], "d_key")
        close(dv, t["d_value"], "d_value")
    want = {k[len("dparam/"):]: v for k, v in t.items() if k.startswith("dparam/")}
    assert sorted(grads) == sorted(want)
    for name, g in want.items():
        close(grads[name], g, name)


OPTIM = pathlib.Path(__file__).resolve().parents[1] / "fixtures" / "optim"


@pytest.mark.parametrize("path", sorted(p for p in OPTIM.glob("*.safetensors") if p.stem != "losses"),
                         ids=lambda p: p.stem)
def test_optimizers_match_torch_and_keras(path):
    # torch.optim / keras.optimizers stepping the same parameters (make_optim_fixtures.py).
    t = load_file(str(path))
    with safe_open(str(path), "np") as f:
        o = json.loads(f.metadata()["options"])
    a, keras = o["args"], o["framework"] == "keras"
    if o["optimizer"] == "SGD":
        opt = qkv.nn.SGD(lr=a.get("learning_rate" if keras else "lr"), momentum=a.get("momentum", 0.0),
                         dampening=a.get("dampening", 0.0), weight_decay=a.get("weight_decay", 0.0),
                         nesterov=a.get("nesterov", False), convention=o["framework"])
    elif keras:
        opt = qkv.nn.Adam(lr=a["learning_rate"], betas=(a.get("beta_1", 0.9), a.get("beta_2", 0.999)),
                          eps=a.get("epsilon", 1e-7), weight_decay=a.get("weight_decay", 0.0), convention="keras")
    else:
        opt = qkv.nn.Adam(lr=a["lr"], betas=tuple(a.get("betas", (0.9, 0.999))), eps=a.get("eps", 1e-8),
                          weight_decay=a.get("weight_decay", 0.01 if o["optimizer"] == "AdamW" else 0.0),
                          decoupled_weight_decay=o["optimizer"] == "AdamW")
    params = {"w": t["w0"], "b": t["b0"]}
    for step in range(t["gw"].shape[0]):
        params = opt.step(params, {"w": t["gw"][step], "b": t["gb"][step]})
        np.testing.assert_allclose(params["w"], t["w"][step], rtol=0, atol=2e-6)
        np.testing.assert_allclose(params["b"], t["b"][step], rtol=0, atol=2e-6)
    np.testing.assert_array_equal(t["w0"], load_file(str(path))["w0"])  # the inputs are not touched


@pytest.mark.parametrize("dtype", ["int32", "int64", "int8", "bool"])
def test_mha_refuses_integer_inputs_as_torch_does(dtype):
    # torch.nn.MultiheadAttention(8, 2) on int32 inputs (torch 2.15): RuntimeError "mat1 and
    # mat2 must have the same dtype, but got Int and Float" from F.linear; qkv projected them
    # as float32 without a word. A float32 copy of the same values still runs.
    layer = qkv.nn.MultiheadAttention(8, 2)
    x = np.ones((3, 1, 8), dtype)
    with pytest.raises(TypeError, match=f"MultiheadAttention: query must be float32, float64, float16 or "
                                        f"bfloat16, got {dtype}"):
        layer(x, x, x)
    f = x.astype(np.float32)
    with pytest.raises(TypeError, match=f"MultiheadAttention: value must be .* got {dtype}"):
        layer(f, f, x)
    assert layer(f, f, f)[0].shape == (3, 1, 8)


def test_sgd_refuses_nesterov_without_momentum_or_with_dampening():
    # torch/optim/sgd.py (torch 2.15): `if nesterov and (momentum <= 0 or dampening != 0): raise
    # ValueError("Nesterov momentum requires a momentum and zero dampening")`; qkv took dampening.
    with pytest.raises(ValueError, match="SGD: nesterov needs a momentum and zero dampening"):
        qkv.nn.SGD(momentum=0.9, dampening=0.1, nesterov=True)
    with pytest.raises(ValueError, match="SGD: nesterov needs a momentum and zero dampening"):
        qkv.nn.SGD(nesterov=True)
    qkv.nn.SGD(momentum=0.9, dampening=0.1)  # dampening without nesterov is torch's too
    qkv.nn.SGD(momentum=0.9, nesterov=True)


def test_torch_flavour_dropout_seed_draws_the_training_mask():
    """The PyTorch flavour's dropout mask comes from dropout_seed (forward and backward alike), which
    only the Keras flavour exposed in Python: every training call reused seed 0's mask. The oracle:
    with dropout 0.5 a training call differs from the eval (dropout-free) result, one seed repeats
    bit for bit, another seed gives another mask, and backward follows the seed as the forward."""
    rng = np.random.default_rng(5)
    mha = qkv.nn.MultiheadAttention(8, 2, dropout=0.5)
    x = rng.standard_normal((4, 2, 8)).astype(np.float32)
    g = rng.standard_normal((4, 2, 8)).astype(np.float32)
    plain, _ = mha(x, x, x, need_weights=False)
    mha.train()
    assert mha.dropout_seed == 0
    mha.dropout_seed = 11
    a, _ = mha(x, x, x, need_weights=False)
    b, _ = mha(x, x, x, need_weights=False)
    da = mha.backward(x, x, x, g, need_weights=False)[0]
    np.testing.assert_array_equal(a, b)
    assert rel_err(a, plain) > 1e-2
    mha.dropout_seed = 12
    assert mha.dropout_seed == 12
    c, _ = mha(x, x, x, need_weights=False)
    assert rel_err(c, a) > 1e-2
    assert rel_err(mha.backward(x, x, x, g, need_weights=False)[0], da) > 1e-2


def test_losses_and_a_training_loop():
    t = load_file(str(OPTIM / "losses.safetensors"))
    loss, grad = qkv.nn.binary_cross_entropy_with_logits(t["bce_logits"], t["bce_targets"])
    assert abs(loss - t["bce_loss"][0]) <= 1e-6 * abs(t["bce_loss"][0])
    np.testing.assert_allclose(grad, t["bce_grad"], rtol=0, atol=1e-7)
    loss, grad = qkv.nn.cross_entropy(t["ce_logits"], t["ce_targets"])
    assert abs(loss - t["ce_loss"][0]) <= 1e-6 * abs(t["ce_loss"][0])
    np.testing.assert_allclose(grad, t["ce_grad"], rtol=0, atol=1e-7)
    # A layer trained with its backward and Adam fits a fixed target better step by step.
    rng = np.random.default_rng(0)
    layer = qkv.nn.MultiheadAttention(16, 2, batch_first=True)
    x = rng.standard_normal((2, 6, 16)).astype(np.float32)
    target = rng.standard_normal((2, 6, 16)).astype(np.float32)
    opt = qkv.nn.Adam(lr=1e-2)
    losses = []
    for _ in range(20):
        out, _ = layer(x, x, x, need_weights=False)
        loss, d_out = qkv.nn.mse_loss(out, target)
        losses.append(loss)
        _, _, _, grads = layer.backward(x, x, x, d_out, need_weights=False)
        layer.load_state_dict(opt.step(layer.state_dict(), grads))
    assert losses[-1] < 0.8 * losses[0], losses
    with pytest.raises(ValueError, match="convention must be 'torch' or 'keras', got 'jax'"):
        qkv.nn.Adam(convention="jax")


def test_quantized_layer_round_trips_through_safetensors(tmp_path):
    """qkv.nn: int8 weights with their scales saved and loaded give the same layer (issue 14)."""
    import qkv

    layer = qkv.nn.MultiheadAttention(16, 4, batch_first=True)
    x = np.random.default_rng(3).standard_normal((2, 5, 16)).astype(np.float32)
    for q in (layer.quantize_dynamic(), layer.quantize_static([x]), layer.quantize_dynamic(weight_bits=7),
              layer.quantize_dynamic(weight_bits=8)):
        sd = q.quantized_state_dict()
        assert sd["in_proj_weight"].dtype == np.int8 and sd["in_proj_weight.scale"].shape == (48,)
        qkv.save(tmp_path / "q.safetensors", sd)
        back = qkv.nn.MultiheadAttention.from_quantized_state_dict(qkv.load(tmp_path / "q.safetensors"), 4,
                                                                   batch_first=True)
        assert back.quantized and back.weight_bits == q.weight_bits
        np.testing.assert_array_equal(back(x, x, x, need_weights=False)[0], q(x, x, x, need_weights=False)[0])
    # a whole model's keys: a ValueError naming the missing key (was KeyError('out_proj.weight'))
    prefixed = {"enc." + k: v for k, v in layer.quantize_dynamic().quantized_state_dict().items()}
    with pytest.raises(ValueError, match=r"from_quantized_state_dict: no 'out_proj.weight' \(the layer's own keys"):
        qkv.nn.MultiheadAttention.from_quantized_state_dict(prefixed, 4)


def test_keras_layer_quantize_dynamic():
    layer = qkv.nn.KerasMultiHeadAttention(num_heads=4, key_dim=16)
    x = np.random.default_rng(4).standard_normal((2, 12, 64)).astype(np.float32)
    want = layer(x, x)  # builds the layer
    q = qkv.nn.quantize_dynamic(layer)
    assert q.quantized and not layer.quantized
    got = q(x, x)
    rel = np.linalg.norm(got - want) / np.linalg.norm(want)
    assert 0 < rel < 3e-2, rel
    with pytest.raises(ValueError, match="backward needs the float32 layer"):
        q.backward(x, x, np.ones_like(want))
