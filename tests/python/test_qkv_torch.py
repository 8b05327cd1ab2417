"""qkv.torch (qkv's kernels as torch.library custom ops with autograd) against torch itself:
F.scaled_dot_product_attention and nn.MultiheadAttention forward and gradients, gradcheck
(float64 central differences), torch.library.opcheck, torch.compile, and a small model trained
with each giving the same loss curve.

torch is optional for qkv and not in CI's .venv: these tests run with `make test-torch` (the
fixtures venv, which has torch, against this tree's build; docs/testing.md)."""

import pytest

torch = pytest.importorskip("torch", reason="torch is optional for qkv: `make test-torch` runs these tests")
qt = pytest.importorskip("qkv.torch")
import qkv  # noqa: E402  (after the optional torch)

F = torch.nn.functional


def test_the_documented_names_exist():
    import pathlib
    import re

    doc = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "python.md").read_text()
    names = set(re.findall(r"qkv\.torch\.(\w+)", doc)) | set(re.findall(r"`torch\.(\w+)`, `torch\.(\w+)`", doc)[0])
    assert names == {"MultiheadAttention", "scaled_dot_product_attention"}
    assert all(hasattr(qt, n) for n in names) and set(qt.__all__) == names


def _randn(*shape, dtype=torch.float32, gen=None):
    return torch.randn(*shape, dtype=dtype, generator=gen).requires_grad_()


def _grads(out, inputs, grad):
    return torch.autograd.grad(out, inputs, grad, allow_unused=True)


def _close(a, b, rtol, what):
    """max |a - b| <= rtol * max |b| (elementwise scale of the reference)."""
    scale = max(b.abs().max().item(), 1e-30)
    err = (a - b).abs().max().item()
    assert err <= rtol * scale, f"{what}: max error {err:.3g} > {rtol} * {scale:.3g}"


# (q shape, k shape, v shape, options); masks are made in the test from `mask`
SDPA_CASES = [
    ((2, 3, 5, 8), (2, 3, 7, 8), (2, 3, 7, 4), {}),
    ((1, 2, 64, 32), (1, 2, 64, 32), (1, 2, 64, 32), {"is_causal": True}),
    ((2, 4, 9, 16), (2, 2, 11, 16), (2, 2, 11, 16), {"enable_gqa": True}),
    ((3, 6, 8), (3, 6, 8), (3, 6, 8), {"scale": 0.3}),
    ((2, 2, 5, 8), (1, 2, 7, 8), (2, 1, 7, 8), {}),  # leading dims broadcast
    ((2, 2, 6, 8), (2, 2, 10, 8), (2, 2, 10, 8), {"mask": "bool"}),
    ((2, 2, 6, 8), (2, 2, 10, 8), (2, 2, 10, 8), {"mask": "float"}),
    ((1, 1, 130, 64), (1, 1, 300, 64), (1, 1, 300, 48), {"mask": "bool"}),  # several tiles
]


def _mask(kind, lq, lk, dtype, gen):
    if kind == "bool":
        m = torch.rand(lq, lk, generator=gen) > 0.3
        m[:, 0] = True  # every row keeps a key (torch gives NaN for a fully masked row)
        return m
    return torch.randn(lq, lk, dtype=dtype, generator=gen)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", range(len(SDPA_CASES)))
def test_sdpa_forward_and_gradients_match_torch(case, dtype):
    qs, ks, vs, opts = SDPA_CASES[case]
    gen = torch.Generator().manual_seed(case)
    q, k, v = _randn(*qs, dtype=dtype, gen=gen), _randn(*ks, dtype=dtype, gen=gen), _randn(*vs, dtype=dtype, gen=gen)
    opts = dict(opts)
    kind = opts.pop("mask", None)
    if kind:
        opts["attn_mask"] = _mask(kind, qs[-2], ks[-2], dtype, gen)
    ours, ref = qt.scaled_dot_product_attention(q, k, v, **opts), F.scaled_dot_product_attention(q, k, v, **opts)
    rtol = 1e-12 if dtype == torch.float64 else 2e-6
    _close(ours, ref, rtol, "output")
    g = torch.randn(ref.shape, dtype=dtype, generator=gen)
    for name, a, b in zip("qkv", _grads(ours, (q, k, v), g), _grads(ref, (q, k, v), g)):
        _close(a, b, rtol * 5, f"d{name}")


@pytest.mark.parametrize("opts", [{}, {"is_causal": True}, {"enable_gqa": True}, {"mask": "float"}])
def test_sdpa_gradcheck_float64(opts):
    """Central differences in float64 (torch.autograd.gradcheck) through the custom op."""
    gen = torch.Generator().manual_seed(7)
    hk = 1 if opts.get("enable_gqa") else 2
    q = _randn(1, 2, 5, 4, dtype=torch.float64, gen=gen)
    k, v = _randn(1, hk, 6, 4, dtype=torch.float64, gen=gen), _randn(1, hk, 6, 3, dtype=torch.float64, gen=gen)
    opts = dict(opts)
    if opts.pop("mask", None):
        opts["attn_mask"] = torch.randn(5, 6, dtype=torch.float64, generator=gen)
    assert torch.autograd.gradcheck(lambda *x: qt.scaled_dot_product_attention(*x, **opts), (q, k, v))


def test_sdpa_dropout_is_seeded_by_torch_and_differentiated_with_its_own_mask():
    q, k, v = (_randn(1, 2, 8, 4, dtype=torch.float64) for _ in range(3))
    torch.manual_seed(3)
    a = qt.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(3)
    b = qt.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert torch.equal(a, b)
    assert not torch.equal(a, qt.scaled_dot_product_attention(q, k, v, dropout_p=0.5))
    # a fixed seed makes the op a function: gradcheck holds with the mask regenerated in backward
    op = torch.ops.qkv.scaled_dot_product_attention
    assert torch.autograd.gradcheck(lambda *x: op(*x, None, 0.5, False, None, False, 1234)[0], (q, k, v))


def test_sdpa_half_dtypes_run_in_their_type():
    gen = torch.Generator().manual_seed(1)
    for dtype in (torch.bfloat16, torch.float16):
        q, k, v = (torch.randn(1, 2, 16, 8, generator=gen).to(dtype).requires_grad_() for _ in range(3))
        out = qt.scaled_dot_product_attention(q, k, v)
        ref = F.scaled_dot_product_attention(*(t.detach().double() for t in (q, k, v)))
        assert out.dtype == dtype
        _close(out.double(), ref, 2e-2, f"{dtype} output")
        dq, _, _ = torch.autograd.grad(out.sum(), (q, k, v))
        assert dq.dtype == dtype


def test_opcheck_of_every_op():
    """torch.library.opcheck: schema, autograd registration, fake kernels, AOT dispatch."""
    gen = torch.Generator().manual_seed(2)
    q, k, v = _randn(2, 2, 5, 8, gen=gen), _randn(2, 2, 7, 8, gen=gen), _randn(2, 2, 7, 4, gen=gen)
    torch.library.opcheck(torch.ops.qkv.scaled_dot_product_attention.default, (q, k, v, None, 0.0, True, None, False, 0))
    out, lse = torch.ops.qkv.scaled_dot_product_attention(q, k, v, None, 0.0, False, None, False, 0)
    g = torch.randn(out.shape, generator=gen)
    # no double backward: its inputs are constants here
    plain = [t.detach() for t in (q, k, v, out, lse)]
    torch.library.opcheck(torch.ops.qkv.scaled_dot_product_attention_backward.default,
                          (g, *plain, None, 0.0, False, None, False, 0))
    for kwargs in ({}, {"kdim": 6, "vdim": 5, "bias": False}):
        m = qt.MultiheadAttention(16, 4, **kwargs)
        x, kv = _randn(5, 2, 16, gen=gen), _randn(7, 2, kwargs.get("kdim", 16), gen=gen)
        val = _randn(7, 2, kwargs.get("vdim", 16), gen=gen)
        args = (x, kv, val, *_params(m), None, None, 4, False, 0.0, False, False, True, True, False, 0)
        torch.library.opcheck(torch.ops.qkv.multihead_attention.default, args)
        out, _ = torch.ops.qkv.multihead_attention(*args)
        plain = [t.detach() if t is not None else None for t in args[:12]]
        backward_args = (torch.randn(out.shape, generator=gen), *plain, None, None, 4, False, 0.0, False, False, True,
                         False, 0)
        torch.library.opcheck(torch.ops.qkv.multihead_attention_backward.default, backward_args)


def _params(m):
    return [getattr(m, n, None) for n in qt._PARAMS[:-2]] + [m.out_proj.weight, m.out_proj.bias]


def test_torch_compile_traces_the_ops():
    gen = torch.Generator().manual_seed(4)
    q, k, v = _randn(1, 2, 9, 8, gen=gen), _randn(1, 2, 9, 8, gen=gen), _randn(1, 2, 9, 8, gen=gen)

    def loss(q, k, v):
        return (qt.scaled_dot_product_attention(q, k, v, is_causal=True) ** 2).sum()

    compiled = torch.compile(loss, backend="aot_eager", fullgraph=True)
    eager_grads = torch.autograd.grad(loss(q, k, v), (q, k, v))
    compiled_grads = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    for a, b in zip(compiled_grads, eager_grads):
        torch.testing.assert_close(a, b)
    m = qt.MultiheadAttention(16, 2, batch_first=True)
    x = _randn(2, 5, 16, gen=gen)
    out, weights = torch.compile(m, backend="aot_eager", fullgraph=True)(x, x, x)
    ref_out, ref_weights = m(x, x, x)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(weights, ref_weights)


# nn.MultiheadAttention configurations: (constructor kwargs, call kwargs); shapes from them
MHA_CASES = [
    ({}, {}),
    ({"bias": False}, {"need_weights": False}),
    ({"kdim": 6, "vdim": 5}, {"average_attn_weights": False}),
    ({"batch_first": True}, {"key_padding_mask": "bool"}),
    ({}, {"key_padding_mask": "float", "attn_mask": "bool"}),
    ({"batch_first": True}, {"attn_mask": "float3d", "need_weights": False}),
    ({}, {"attn_mask": "causal", "is_causal": True, "need_weights": False}),
    ({}, {"unbatched": True, "attn_mask": "bool"}),
    ({"add_bias_kv": True, "batch_first": True}, {"key_padding_mask": "bool"}),
    ({"add_bias_kv": True, "add_zero_attn": True, "kdim": 6, "vdim": 5}, {"attn_mask": "bool"}),
]


def _mha_inputs(ctor, call, gen, e=16, heads=4, n=3, lq=5, s=7):
    bf = ctor.get("batch_first", False)
    lead = (lambda t: (t,)) if call.get("unbatched") else ((lambda t: (n, t)) if bf else (lambda t: (t, n)))
    q = _randn(*lead(lq), e, gen=gen)
    k, v = _randn(*lead(s), ctor.get("kdim", e), gen=gen), _randn(*lead(s), ctor.get("vdim", e), gen=gen)
    kw = {name: call[name] for name in ("need_weights", "average_attn_weights", "is_causal") if name in call}
    kpm = call.get("key_padding_mask")
    if kpm:
        keep = torch.rand(n, s, generator=gen) > 0.3
        keep[:, 0] = True
        kw["key_padding_mask"] = ~keep if kpm == "bool" else torch.randn(n, s, generator=gen)
    mask = call.get("attn_mask")
    if mask == "bool":
        m = torch.rand(lq, s, generator=gen) > 0.7
        m[:, 0] = False
        kw["attn_mask"] = m
    elif mask == "float3d":
        kw["attn_mask"] = torch.randn(n * heads, lq, s, generator=gen)
    elif mask == "causal":
        kw["attn_mask"] = torch.ones(lq, s, dtype=torch.bool).triu(1)
    return q, k, v, kw


@pytest.mark.parametrize("case", range(len(MHA_CASES)))
def test_multihead_attention_matches_torch_forward_and_gradients(case):
    ctor, call = MHA_CASES[case]
    gen = torch.Generator().manual_seed(100 + case)
    torch.manual_seed(case)
    ref = torch.nn.MultiheadAttention(16, 4, **ctor)
    ours = qt.MultiheadAttention(16, 4, **ctor)
    ours.load_state_dict(ref.state_dict())
    q, k, v, kw = _mha_inputs(ctor, call, gen)
    (out, w), (ref_out, ref_w) = ours(q, k, v, **kw), ref(q, k, v, **kw)
    _close(out, ref_out, 2e-6, "output")
    assert (w is None) == (ref_w is None)
    if w is not None:
        _close(w, ref_w, 2e-6, "weights")
    g = torch.randn(ref_out.shape, generator=gen)
    names = ["query", "key", "value"] + [n for n, _ in ref.named_parameters()]
    ours_g = _grads(out, [q, k, v, *ours.parameters()], g)
    ref_g = _grads(ref_out, [q, k, v, *ref.parameters()], g)
    for name, a, b in zip(names, ours_g, ref_g):
        _close(a, b, 1e-5, name)


def test_multihead_attention_self_attention_sums_the_three_gradients():
    gen = torch.Generator().manual_seed(5)
    ref = torch.nn.MultiheadAttention(16, 2)
    ours = qt.MultiheadAttention(16, 2)
    ours.load_state_dict(ref.state_dict())
    x = _randn(6, 2, 16, gen=gen)
    (dx,) = torch.autograd.grad(ours(x, x, x)[0].sum(), (x,))
    (ref_dx,) = torch.autograd.grad(ref(x, x, x)[0].sum(), (x,))
    _close(dx, ref_dx, 1e-5, "dx")


def test_multihead_attention_dropout_in_train_mode_only():
    m = qt.MultiheadAttention(8, 2, dropout=0.5)
    x = torch.randn(4, 1, 8)
    assert torch.equal(m.eval()(x, x, x)[0], m(x, x, x)[0])
    m.train()
    torch.manual_seed(0)
    a = m(x, x, x)[0]
    torch.manual_seed(0)
    assert torch.equal(a, m(x, x, x)[0])
    assert not torch.equal(a, m.eval()(x, x, x)[0])


def test_multihead_attention_refuses_other_dtypes_with_a_clear_error():
    m = qt.MultiheadAttention(8, 2).double()
    x = torch.randn(4, 1, 8, dtype=torch.float64)
    with pytest.raises(TypeError, match="qkv.torch.MultiheadAttention: in_proj_weight is torch.float64"):
        m(x, x, x)


class _Classifier(torch.nn.Module):
    """Seed 001's shape of model: attention over a sequence, mean-pooled, one logit."""

    def __init__(self, attention, sdpa=None):
        super().__init__()
        self.embed = torch.nn.Linear(4, 16)
        self.attention, self.sdpa = attention, sdpa
        self.head = torch.nn.Linear(16, 1)

    def forward(self, x):
        h = self.embed(x)  # [N, T, 16]
        if self.sdpa is not None:  # heads of 4 through the functional form
            qkv = h.unflatten(-1, (4, 4)).transpose(1, 2)  # [N, 4, T, 4]
            h = h + self.sdpa(qkv, qkv, qkv, is_causal=True).transpose(1, 2).flatten(-2)
        else:
            h = h + self.attention(h, h, h, need_weights=False)[0]
        return self.head(h.mean(dim=1)).squeeze(-1)


def _train(model, steps=25):
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(32, 10, 4, generator=gen)
    y = (x[:, :, 0].sum(dim=1) > 0).float()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("kind", ["multihead_attention", "sdpa"])
def test_training_with_qkv_gives_torchs_loss_curve(kind):
    torch.manual_seed(0)
    if kind == "sdpa":
        ref, ours = _Classifier(None, F.scaled_dot_product_attention), _Classifier(None, qt.scaled_dot_product_attention)
    else:
        ref = _Classifier(torch.nn.MultiheadAttention(16, 4, batch_first=True))
        ours = _Classifier(qt.MultiheadAttention(16, 4, batch_first=True))
    ours.load_state_dict(ref.state_dict())
    ref_losses, losses = _train(ref), _train(ours)
    assert ref_losses[-1] < 0.7 * ref_losses[0]  # the model learns
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= 1e-5 * abs(b), f"step {step}: qkv {a} vs torch {b}"


# Moved from test_py_interop.py (DLPack input from real torch tensors; make test-torch runs them).
def test_real_torch_negative_bit_views_are_resolved():
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    imag = z.conj().imag  # a view with torch's negative bit: [-2, 4]
    assert imag.is_neg()
    out = qkv.rearrange(imag, "n -> n")
    assert torch.equal(out, torch.tensor([-2.0, 4.0]))


def test_real_torch_float8_is_refused_by_its_name():
    """DLPack 1.1's float8 codes were printed as 'dtype code 108' (code 10, then the bits)."""
    with pytest.raises(TypeError, match=r"_roundtrip: dtype float8_e4m3fn is not supported"):
        qkv._qkv._roundtrip(torch.ones(3).to(torch.float8_e4m3fn))


# ---- bfloat16 / float16 CPU tensors through DLPack, by data_ptr (issue 14 item 6) ----------------------------
# CI's .venv has no torch: test_py_interop.py runs the same paths on a ctypes kDLBfloat / kDLFloat producer.

HALF = [torch.bfloat16, torch.float16]
_describe, _roundtrip = qkv._qkv.cuda._describe, qkv._qkv.cuda._roundtrip


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_cpu_tensors_cross_in_and_out_without_copy(dtype):
    """torch -> qkv at torch's data_ptr() with its strides (a [B, L, H, D] tensor seen as
    [B, H, L, D]), through torch's versioned __dlpack__ and a bare to_dlpack capsule; qkv ->
    torch (torch.from_dlpack in qkv's torch-in, torch-out rule) at the same data_ptr(), writes
    seen both ways; a computed result is read back by qkv in place and torch.from_dlpack of it
    (and of a float16 NumPy result) does not copy."""
    base = torch.randn(2, 24, 3, 16, generator=torch.Generator().manual_seed(5)).to(dtype)
    t = base.transpose(1, 2)
    info = _describe(t)
    assert info["data_ptr"] == t.data_ptr() and info["dtype"] == str(dtype).removeprefix("torch.")
    assert info["shape"] == tuple(t.shape) and info["strides"] == t.stride() and not info["read_only"]
    assert _describe(torch.utils.dlpack.to_dlpack(t))["data_ptr"] == t.data_ptr()
    out = _roundtrip(t)
    assert type(out) is torch.Tensor and out.dtype == dtype
    assert out.data_ptr() == t.data_ptr() and out.stride() == t.stride() and out.shape == t.shape
    out[1, 2, 3, 4] = 7.0
    assert base[1, 3, 2, 4] == 7.0
    base[0, 5, 1, 2] = -3.0
    assert out[0, 1, 5, 2] == -3.0
    view = qkv.rearrange(t, "b h l d -> b l h d")  # a view through the public API
    assert type(view) is torch.Tensor and view.data_ptr() == base.data_ptr() and view.stride() == base.stride()

    q = torch.randn(2, 3, 8, 16, dtype=torch.float64).to(dtype)
    res = qkv.scaled_dot_product_attention(q, q, q)
    assert type(res) is torch.Tensor and res.dtype == dtype
    assert _describe(res)["data_ptr"] == res.data_ptr()
    assert torch.from_dlpack(res).data_ptr() == res.data_ptr()
    if dtype == torch.float16:  # NumPy exports float16 (not ml_dtypes.bfloat16) through DLPack
        res_np = qkv.scaled_dot_product_attention(q.numpy(), q.numpy(), q.numpy())
        assert torch.from_dlpack(res_np).data_ptr() == res_np.__array_interface__["data"][0]


def _half_ulp(x, dtype):
    """Half an ulp of bfloat16 / float16 at |x| (subnormals included), as test_py_attention.py."""
    fraction_bits, min_exponent = {torch.float16: (10, -14), torch.bfloat16: (7, -126)}[dtype]
    binade = torch.floor(torch.log2(torch.clamp(x.abs(), min=2.0**min_exponent)))
    return 2.0 ** (binade - fraction_bits - 1)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_cpu_tensors_attention_matches_torchs_float64_sdpa(dtype, causal):
    """qkv.scaled_dot_product_attention on torch bfloat16 / float16 CPU views ([B, L, H, D] seen
    as [B, H, L, D]) against torch's own SDPA in float64 on the same 16-bit values, within
    docs/testing.md's bound (half an ulp at each value + 1e-6 x scale + the fused kernel's P
    rounding on native 16-bit tiles, half an ulp of 1 x max|v|, twice) and, as its C++ fixture
    tests, within 2x the error of torch's own SDPA in the 16-bit dtype (1.0-1.3x here); the
    inputs are read in place (their data_ptr() is what qkv wraps), the result is of the dtype."""
    gen = torch.Generator().manual_seed(11 + causal)
    q, k, v = (torch.randn(s, generator=gen).to(dtype).transpose(1, 2) for s in ((2, 24, 3, 16), (2, 40, 3, 16),
                                                                                 (2, 40, 3, 8)))
    assert [_describe(x)["data_ptr"] for x in (q, k, v)] == [x.data_ptr() for x in (q, k, v)]
    out = qkv.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert type(out) is torch.Tensor and out.dtype == dtype and out.shape == (2, 3, 24, 8)
    want = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    v_max = v.double().abs().max()
    tol = _half_ulp(want, dtype) + 1e-6 * want.abs().max() + 2 * _half_ulp(torch.tensor(1.0), dtype) * v_max
    err = (out.double() - want).abs()
    assert bool((err <= tol).all()), f"max error {err.max().item():.3g}, tolerance from {tol.min().item():.3g}"
    torch_err = (F.scaled_dot_product_attention(q, k, v, is_causal=causal).double() - want).abs().max().item()
    assert err.max().item() <= 2 * torch_err, f"max error {err.max().item():.3g}, torch's own {torch_err:.3g}"
