"""qkv.torch on CUDA tensors (pytest -m cuda, the device machine; docs/python.md): the SDPA custom
ops reach qkv's GPU forward and backward through torch's autograd, torch.library.opcheck and
torch.compile on CUDA inputs, a model trained on the GPU through qkv's kernels, and the MHA
layer's clear error for CUDA tensors. Every test carries the `cuda` marker (deselected by `make
pytest`) and fails rather than skips without a GPU, qkv's CUDA backend or torch."""
import pytest

from cuda_oracles import assert_flash_grads, torch_cuda

pytestmark = pytest.mark.cuda


def _qt():
    torch = torch_cuda()
    import qkv.torch as qt  # needs torch: imported only once torch_cuda() found it

    return torch, qt


def _inputs(torch, dtype, b, hq, hk, lq, lk, d, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    shapes = ((b, hq, lq, d), (b, hk, lk, d), (b, hk, lk, d), (b, hq, lq, d))
    return [torch.randn(*s, device="cuda", dtype=dtype, generator=g) for s in shapes]


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d,causal,hk", [(64, False, 4), (128, True, 2), (128, False, 1)])
def test_sdpa_forward_and_autograd_on_qkvs_gpu_kernels(dtype, d, causal, hk):
    """Forward and loss.backward() through qkv.torch on CUDA tensors, against torch's autograd in
    float64 on the same values by FlashAttention's criterion; GQA (4:4, 4:2, 4:1), Lq != Lk."""
    torch, qt = _qt()
    q, k, v, dout = _inputs(torch, getattr(torch, dtype), 2, 4, hk, 200, 170, d, seed=d + hk)
    kw = dict(is_causal=causal, enable_gqa=hk != 4)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = qt.scaled_dot_product_attention(*leaves, **kw)
    assert out.device == q.device and out.dtype == q.dtype and out.shape == q.shape
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)
    own = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
    err, torch_err = ((x.double() - ref).abs().max().item() for x in (out, own))
    assert err <= 2 * torch_err + 1e-3, (err, torch_err)
    (out * dout).sum().backward()  # dout as the upstream gradient, through autograd
    assert_flash_grads(torch, [t.grad for t in leaves], q, k, v, dout, **kw)


def test_opcheck_on_cuda_tensors():
    """torch.library.opcheck of both SDPA ops on CUDA inputs: schema, autograd registration, fake
    kernels and AOT dispatch (eager against traced, on qkv's GPU kernels)."""
    torch, _ = _qt()
    q, k, v, dout = _inputs(torch, torch.bfloat16, 1, 4, 2, 64, 96, 64, seed=5)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    torch.library.opcheck(torch.ops.qkv.scaled_dot_product_attention.default, (q, k, v, None, 0.0, True, None, True, 0))
    out, lse = torch.ops.qkv.scaled_dot_product_attention(q, k, v, None, 0.0, True, None, True, 0)
    torch.library.opcheck(torch.ops.qkv.scaled_dot_product_attention_backward.default,
                          (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), None, 0.0, True, None,
                           True, 0))


def test_torch_compile_traces_the_cuda_op():
    torch, qt = _qt()
    q, k, v, _ = _inputs(torch, torch.bfloat16, 1, 4, 4, 128, 128, 128, seed=6)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    def loss(q, k, v):
        return qt.scaled_dot_product_attention(q, k, v, is_causal=True).float().square().sum()

    eager = torch.autograd.grad(loss(q, k, v), (q, k, v))
    compiled = torch.autograd.grad(torch.compile(loss, backend="aot_eager", fullgraph=True)(q, k, v), (q, k, v))
    for a, b in zip(compiled, eager):  # the same kernels: equal up to the order of the backward's atomics
        torch.testing.assert_close(a, b)


class _Classifier:
    """Seed 001's shape of model (attention over a sequence, mean-pooled, one logit) with heads of
    64 in bfloat16 around float32 layers, as mixed-precision training runs attention."""

    def __init__(self, torch, sdpa):
        self.torch, self.sdpa = torch, sdpa
        self.embed, self.head = torch.nn.Linear(4, 256).cuda(), torch.nn.Linear(256, 1).cuda()

    def parameters(self):
        return list(self.embed.parameters()) + list(self.head.parameters())

    def __call__(self, x):
        h = self.embed(x)  # [N, T, 256]
        heads = h.unflatten(-1, (4, 64)).transpose(1, 2).to(self.torch.bfloat16)  # [N, 4, T, 64]
        h = h + self.sdpa(heads, heads, heads, is_causal=True).transpose(1, 2).flatten(-2).float()
        return self.head(h.mean(dim=1)).squeeze(-1)


def _train(torch, sdpa, steps=25):
    torch.manual_seed(0)  # the same initial weights for every run
    model = _Classifier(torch, sdpa)
    g = torch.Generator(device="cuda").manual_seed(11)
    x = torch.randn(32, 64, 4, device="cuda", generator=g)
    y = (x[:, :, 0].sum(dim=1) > 0).float()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.binary_cross_entropy_with_logits(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_training_on_the_gpu_follows_torchs_loss_curve():
    """A model trained on the GPU with qkv.torch's SDPA against the same model with torch's own
    bfloat16 SDPA; the oracle is torch's SDPA in float32 on the same bfloat16 inputs. Each step's
    loss is within 2x torch's own distance from it (plus 2e-3 of the loss), and the model learns."""
    torch, qt = _qt()
    F = torch.nn.functional

    def sdpa_f32(q, k, v, **kw):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), **kw).to(q.dtype)

    truth, theirs, ours = (_train(torch, f) for f in (sdpa_f32, F.scaled_dot_product_attention,
                                                     qt.scaled_dot_product_attention))
    assert ours[-1] < 0.7 * ours[0] and theirs[-1] < 0.7 * theirs[0]
    torch_gap = max(abs(a - b) for a, b in zip(theirs, truth))
    for step, (a, b) in enumerate(zip(ours, truth)):
        assert abs(a - b) <= 2 * torch_gap + 2e-3 * abs(b), (step, a, b, torch_gap)


def test_multihead_attention_says_it_runs_on_the_cpu():
    """qkv.torch.MultiheadAttention runs qkv::nn on the host: CUDA tensors get a clear error
    naming the layer and the device (not a host read of device memory)."""
    torch, qt = _qt()
    m = qt.MultiheadAttention(16, 4, batch_first=True)
    x = torch.randn(2, 5, 16, device="cuda")
    with pytest.raises(ValueError, match="MultiheadAttention: query on cuda:0; .* runs on the CPU"):
        m(x, x, x)
    with pytest.raises(ValueError, match="MultiheadAttention: in_proj/out_proj weights on cuda:0"):
        m.cuda()(x.cpu(), x.cpu(), x.cpu())
