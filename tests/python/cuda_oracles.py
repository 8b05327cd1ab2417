"""Shared by the GPU tests (test_cuda.py, test_qkv_torch_cuda.py; `pytest -m cuda` on the
device machine): torch with a GPU, and FlashAttention's criterion for bf16/f16 gradients
against torch's autograd in float64 (the oracle)."""
import pytest

import qkv


def torch_cuda():
    """torch with a GPU and qkv's CUDA backend, or a failure saying what is missing."""
    if not qkv.cuda.is_available():
        pytest.fail(f"-m cuda needs qkv's CUDA backend and a GPU (is_built={qkv.cuda.is_built()}, "
                    f"device_count={qkv.cuda.device_count()})")
    try:
        import torch
    except ImportError:
        pytest.fail("-m cuda needs torch")
    if not torch.cuda.is_available():
        pytest.fail("-m cuda: torch sees no GPU")
    return torch


def assert_flash_grads(torch, got, q, k, v, dout, **kw):
    """got = (dq, dk, dv) against torch autograd in float64 on the same values: at most 2x the
    error of torch's own backward in the inputs' dtype, plus its floor (2x the rounding to that
    dtype at the reference's values + 0.3). kw: F.scaled_dot_product_attention's options."""

    def grads(dtype):
        x = [t.detach().to(dtype).requires_grad_() for t in (q, k, v)]
        o = torch.nn.functional.scaled_dot_product_attention(*x, **kw)
        return torch.autograd.grad(o, x, dout.to(dtype))

    for name, mine, want, theirs in zip("qkv", got, grads(torch.float64), grads(q.dtype)):
        assert mine.device == q.device and mine.dtype == q.dtype and mine.shape == want.shape, name
        err = (mine.double() - want).abs().max().item()
        torch_err = (theirs.double() - want).abs().max().item()
        floor = 2 * ((want + 0.3).to(q.dtype).double() - 0.3 - want).abs().max().item()
        assert err <= 2 * torch_err + floor, (f"d{name}", err, torch_err, floor)
