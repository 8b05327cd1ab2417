"""qkv.cuda and CUDA arrays through DLPack (docs/python.md, "CUDA tensors").

Without a GPU (CI, `make pytest`, which deselects `-m cuda`): qkv.cuda's answers, and the
DLPack conversion on fake CUDA producers (fake_cuda_dlpack.py: memory that faults on any
host access) -- zero-copy pointers, strides, byte_offset, dtypes, the read-only flag, the
stream qkv asks for, the producer released once qkv is done, CUDA results handed back as
DLPack arrays, and a clear error (not a crash) from every function that has no CUDA path.

With a GPU (`pytest -m cuda`, the device machine; docs/python.md gives the commands): torch
CUDA bf16/f16 tensors through qkv.scaled_dot_product_attention against torch's SDPA in
float64 on the same data. Those tests carry the `cuda` marker and fail (not skip) when
selected without qkv's CUDA backend, a GPU or torch.
"""
import gc
import os
import subprocess
import sys

import numpy as np
import pytest

import qkv
from cuda_oracles import assert_flash_grads, torch_cuda as _torch_cuda
from fake_cuda_dlpack import kDLCUDA, kDLROCM, FakeCudaArray

describe, roundtrip = qkv._qkv.cuda._describe, qkv._qkv.cuda._roundtrip
HERE = os.path.dirname(os.path.abspath(__file__))


# ---- qkv.cuda's runtime answers --------------------------------------------------------

def test_runtime_answers_and_is_available_follows_device_count():
    assert isinstance(qkv.cuda.is_built(), bool)
    count = qkv.cuda.device_count()
    assert isinstance(count, int) and count >= 0
    assert qkv.cuda.is_available() == (count > 0)
    if not qkv.cuda.is_built():
        assert count == 0  # no backend, no devices


def test_properties_of_a_missing_gpu_name_its_index():
    missing = qkv.cuda.device_count()
    with pytest.raises(RuntimeError, match=f"cuda:{missing}"):
        qkv.cuda.get_device_properties(missing)
    with pytest.raises(ValueError, match="cuda:N"):
        qkv.cuda.get_device_properties("gpu:0")
    with pytest.raises(TypeError, match="device must be"):
        qkv.cuda.get_device_properties(1.5)


def test_synchronize_without_a_gpu_is_an_error_not_a_hang():
    if qkv.cuda.is_available():
        qkv.cuda.synchronize()  # nothing queued: returns
    else:
        with pytest.raises(RuntimeError, match="(?i)cuda"):
            qkv.cuda.synchronize()


def test_memory_pool_functions_name_a_missing_gpu():
    missing = qkv.cuda.device_count()
    for fn in (qkv.cuda.empty_cache, qkv.cuda.memory_allocated, qkv.cuda.memory_reserved):
        with pytest.raises(RuntimeError, match=f"cuda:{missing}"):
            fn(missing)


# ---- CUDA DLPack inputs on fake producers ------------------------------------------------

def test_cuda_producer_is_wrapped_in_place_and_asked_for_the_legacy_default_stream():
    x = FakeCudaArray((2, 3, 4), "float32", byte_offset=256)
    info = describe(x)
    assert info["device"] == "cuda:0" and info["dtype"] == "float32"
    assert info["data_ptr"] == x.data_ptr  # zero-copy: the producer's pointer, byte_offset included
    assert info["shape"] == (2, 3, 4) and info["strides"] == (12, 4, 1)
    assert info["storage_bytes"] == 2 * 3 * 4 * 4 and info["read_only"] is False
    # DLPack: stream=1 is CUDA's legacy default stream, where qkv queues its work.
    assert x.calls == [{"stream": 1, "max_version": (1, 0)}]
    gc.collect()
    assert x.deleted == 1  # the capsule's deleter ran once qkv's tensor was gone


def test_device_id_strides_and_dtypes_come_through():
    x = FakeCudaArray((4, 3), "bfloat16", strides=(1, 4), device=(kDLCUDA, 3))  # a transposed [3, 4]
    info = describe(x)
    assert (info["device"], info["dtype"], info["strides"]) == ("cuda:3", "bfloat16", (1, 4))
    assert info["storage_bytes"] == 12 * 2
    assert describe(FakeCudaArray((5,), "float16"))["dtype"] == "float16"
    # Negative strides (CuPy's x[::-1]): the storage spans the elements reached, the pointer stays.
    x = FakeCudaArray((3, 4), "float32", strides=(-4, 1), first_element=8)
    info = describe(x)
    assert info["data_ptr"] == x.data_ptr and info["strides"] == (-4, 1) and info["storage_bytes"] == 12 * 4
    assert describe(FakeCudaArray((0, 7), "float32"))["shape"] == (0, 7)


def test_read_only_flag_and_producers_before_dlpack_1():
    assert describe(FakeCudaArray((2, 2), read_only=True))["read_only"] is True
    old = FakeCudaArray((2, 2), versioned=False)  # refuses max_version: asked again without it
    info = describe(old)
    assert info["device"] == "cuda:0" and info["read_only"] is False
    assert old.calls == [{"stream": 1, "max_version": (1, 0)}, {"stream": 1, "max_version": None}]


def test_a_capsule_itself_is_taken_too():
    x = FakeCudaArray((2, 3), "float32")
    assert describe(x.__dlpack__(stream=1))["data_ptr"] == x.data_ptr


def test_unsupported_devices_and_dtypes_are_named():
    with pytest.raises(RuntimeError, match=r"rocm \(type 10\):1 is not supported"):
        describe(FakeCudaArray((2,), device=(kDLROCM, 1)))
    with pytest.raises(TypeError, match="uint8"):
        describe(FakeCudaArray((2,), "uint8"))


def test_cuda_results_come_back_as_dlpack_arrays_that_keep_the_memory():
    x = FakeCudaArray((2, 3), "bfloat16", byte_offset=64)
    out = roundtrip(x)  # a non-torch producer in: nanobind's ndarray (with __dlpack__) out
    assert tuple(out.__dlpack_device__()) == (kDLCUDA, 0)
    again = describe(out)  # read back through its own __dlpack__: the same memory, no copy
    assert (again["device"], again["data_ptr"], again["dtype"]) == ("cuda:0", x.data_ptr, "bfloat16")
    gc.collect()
    assert x.deleted == 0  # `out` still holds qkv's storage, which holds the producer's capsule
    del out, again
    gc.collect()
    assert x.deleted == 1
    ro = roundtrip(FakeCudaArray((2,), read_only=True))
    assert describe(ro)["read_only"] is True  # a read-only view stays read-only


def test_attention_on_cuda_inputs_without_a_gpu_kernel_is_a_clear_error():
    # float32 has no CUDA kernel in any build: RuntimeError (no backend: no kernel for the
    # device) or TypeError (the backend's kernel takes bfloat16/float16), naming op and device.
    q = FakeCudaArray((1, 2, 8, 64), "float32")
    with pytest.raises((RuntimeError, TypeError), match=r"^scaled_dot_product_attention: .*cuda:0"):
        qkv.scaled_dot_product_attention(q, q, q)
    cpu = np.zeros((1, 2, 8, 64), np.float32)
    with pytest.raises(RuntimeError, match="cpu and cuda:0|cuda:0 and cpu"):
        qkv.scaled_dot_product_attention(cpu, FakeCudaArray((1, 2, 8, 64)), cpu)
    if not qkv.cuda.is_available():  # no GPU to run the bfloat16 kernel on: an error, not a launch
        for dtype in ("bfloat16", "float16"):
            q = FakeCudaArray((1, 2, 8, 64), dtype)
            with pytest.raises(RuntimeError, match="(?i)cuda"):
                qkv.scaled_dot_product_attention(q, q, q)


# Every function that reads its arrays on the host, on CUDA inputs (fake ones, or torch's on
# a GPU): each must raise a qkv error naming the device before touching the memory (a read
# of the fake memory faults, of device memory too: the child dies).
_HOST_ONLY = r'''
import sys
sys.path.insert(0, sys.argv[1])
import numpy as np, qkv
if sys.argv[3] == "fake":
    from fake_cuda_dlpack import FakeCudaArray as F
else:
    import torch
    F = lambda shape: torch.ones(shape, device="cuda")
x, w = F((1, 2, 8, 16)), F((16, 16))
calls = {
    "attention_reference": lambda: qkv.attention_reference(x, x, x),
    "sdpa_backward": lambda: qkv.scaled_dot_product_attention_backward(x, x, x, x, x, F((1, 2, 8))),
    "linear_attention": lambda: qkv.linear_attention(x, x, x),
    "additive_attention": lambda: qkv.additive_attention(x, x, x),
    "lsh_attention": lambda: qkv.lsh_attention(x, x),
    "apply_rotary": lambda: qkv.apply_rotary(x),
    "einsum": lambda: qkv.einsum("ij,jk->ik", w, w),
    "einsum (a view)": lambda: qkv.einsum("ij->ji", w),
    "rearrange (a view)": lambda: qkv.rearrange(x, "b h l d -> b l h d"),
    "rearrange (a copy)": lambda: qkv.rearrange(x, "b h l d -> b (l h) d"),
    "reduce": lambda: qkv.reduce(x, "b h l d -> b h d", "sum"),
    "repeat": lambda: qkv.repeat(w, "i j -> i j k", k=2),
    "save": lambda: qkv.save(sys.argv[2], {"x": x}),  # fake: refused; a real GPU array: written
    "attn_mask": lambda: qkv.scaled_dot_product_attention(np.zeros((1, 2, 8, 16), np.float32),
        np.zeros((1, 2, 8, 16), np.float32), np.zeros((1, 2, 8, 16), np.float32), attn_mask=F((8, 8))),
    "MultiheadAttention": lambda: qkv.nn.MultiheadAttention(16, 2)(F((1, 8, 16)), F((1, 8, 16)), F((1, 8, 16))),
    "lsh_buckets": lambda: qkv.lsh_buckets(x),
    "KVCache.append": lambda: qkv.KVCache(1, 2, 16, 32).append(x, x),
    "decode_attention": lambda: qkv.decode_attention(F((1, 2, 1, 16)), qkv.KVCache(1, 2, 16, 32)),
    "mse_loss": lambda: qkv.nn.mse_loss(w, w),
}
for name, call in calls.items():
    print(name, end=": ", flush=True)
    try:
        call()
        print("returned", flush=True)
    except Exception as e:
        print(type(e).__name__, str(e).replace("\n", " "), flush=True)
'''


def _host_only_sweep(tmp_path, kind):
    r = subprocess.run([sys.executable, "-c", _HOST_ONLY, HERE, str(tmp_path / "x.safetensors"), kind],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, f"crashed (exit {r.returncode}) after:\n{r.stdout}\n{r.stderr}"
    lines = r.stdout.strip().splitlines()
    assert len(lines) == 19, r.stdout
    for line in lines:
        if kind == "torch" and line.startswith("save:"):  # copied to the host, then written
            assert line == "save: returned", line
            np.testing.assert_array_equal(qkv.load(tmp_path / "x.safetensors")["x"], np.ones((1, 2, 8, 16)))
            continue
        if kind == "torch" and line.startswith("sdpa_backward:"):  # has a GPU kernel, which takes bf16/f16 only
            assert ": TypeError" in line and "cuda:0" in line, line
            continue
        assert ": RuntimeError" in line and "cuda:0" in line, line


def test_host_only_functions_refuse_cuda_arrays_without_reading_them(tmp_path):
    _host_only_sweep(tmp_path, "fake")


# ---- on a GPU: torch CUDA tensors in and out (pytest -m cuda) ----------------------------

def _qkv_close_to_torch_float64(torch, q, k, v, out, lse=None, **kw):
    """out (and lse) against torch's SDPA in float64 on the same values (the oracle), with the
    FlashAttention error criterion: at most 2x the error of torch's own kernel in the same
    dtype, plus a small floor for bf16/f16 rounding of the output."""
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), **kw)
    own = torch.nn.functional.scaled_dot_product_attention(q, k, v, **kw)
    err = (out.double() - ref).abs().max().item()
    torch_err = (own.double() - ref).abs().max().item()
    assert err <= 2 * torch_err + 1e-3, (err, torch_err)
    if lse is not None:
        scale = q.shape[-1] ** -0.5
        qf, kf = q.double(), k.double()
        if kf.shape[-3] != qf.shape[-3]:
            kf = kf.repeat_interleave(qf.shape[-3] // kf.shape[-3], dim=-3)
        s = qf @ kf.transpose(-1, -2) * scale
        if kw.get("is_causal"):
            lq, lk = s.shape[-2:]
            s = s.masked_fill(torch.ones(lq, lk, dtype=torch.bool, device=s.device).triu(1), float("-inf"))
        lse_err = (lse.double() - torch.logsumexp(s, dim=-1)).abs().max().item()
        assert lse_err < 1e-3, lse_err


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("d", [64, 128])
def test_torch_cuda_in_torch_cuda_out_zero_copy(dtype, d):
    torch = _torch_cuda()
    g = torch.Generator(device="cuda").manual_seed(d)
    dt = getattr(torch, dtype)
    q, k, v = (torch.randn(2, 4, 256, d, device="cuda", dtype=dt, generator=g) for _ in range(3))
    assert describe(q)["data_ptr"] == q.data_ptr() and describe(q)["device"] == "cuda:0"  # read in place
    out = qkv.scaled_dot_product_attention(q, k, v)
    assert isinstance(out, torch.Tensor) and out.device == q.device and out.dtype == q.dtype
    assert out.shape == (2, 4, 256, d)
    _qkv_close_to_torch_float64(torch, q, k, v, out)
    # The result owns qkv's device memory: it outlives every qkv object and is not a copy.
    ptr = out.data_ptr()
    gc.collect()
    torch.cuda.synchronize()
    assert out.data_ptr() == ptr and torch.isfinite(out).all().item()
    back = roundtrip(out)
    assert back.data_ptr() == ptr


@pytest.mark.cuda
def test_torch_cuda_causal_gqa_and_logsumexp():
    torch = _torch_cuda()
    g = torch.Generator(device="cuda").manual_seed(7)
    q = torch.randn(1, 8, 200, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, 2, 300, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    out, lse = qkv.scaled_dot_product_attention(q, k, v, enable_gqa=True, return_logsumexp=True)
    assert lse.device == q.device and lse.shape == (1, 8, 200)
    _qkv_close_to_torch_float64(torch, q, k, v, out, lse, enable_gqa=True)
    out, lse = qkv.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True, return_logsumexp=True)
    _qkv_close_to_torch_float64(torch, q, k, v, out, lse, is_causal=True, enable_gqa=True)


@pytest.mark.cuda
def test_torch_side_stream_sees_the_result_and_views_stay_in_place():
    torch = _torch_cuda()
    g = torch.Generator(device="cuda").manual_seed(3)
    base = torch.randn(1, 512, 4, 64, device="cuda", dtype=torch.bfloat16, generator=g)
    q = base.transpose(1, 2)  # [1, 4, 512, 64], not contiguous: read through its strides
    info = describe(q)
    assert info["data_ptr"] == q.data_ptr() and info["strides"] == tuple(q.stride())
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        k = torch.randn(1, 4, 512, 64, device="cuda", dtype=torch.bfloat16, generator=g)  # written on `side`
        out = qkv.scaled_dot_product_attention(q, k, k)
        total = out.double().sum()  # runs on `side`: must see qkv's finished result
    torch.cuda.synchronize()
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), k.double())
    assert abs(total.item() - ref.sum().item()) <= 1e-2 * ref.abs().sum().item()


@pytest.mark.cuda
def test_results_come_from_the_pool_and_go_back_to_it():
    torch = _torch_cuda()
    qkv.cuda.empty_cache()
    base = qkv.cuda.memory_allocated()
    q = torch.randn(2, 4, 1024, 128, device="cuda", dtype=torch.bfloat16)
    out = qkv.scaled_dot_product_attention(q, q, q)
    assert qkv.cuda.memory_allocated() == base + out.numel() * 2
    reserved = qkv.cuda.memory_reserved()
    del out
    gc.collect()
    assert qkv.cuda.memory_allocated() == base and qkv.cuda.memory_reserved() == reserved
    qkv.cuda.empty_cache()
    assert qkv.cuda.memory_reserved() < reserved


@pytest.mark.cuda
def test_host_only_functions_refuse_torch_cuda_tensors(tmp_path):
    _torch_cuda()
    _host_only_sweep(tmp_path, "torch")  # real device memory: a host read would be a segfault


@pytest.mark.cuda
def test_kernel_limits_on_a_torch_cuda_tensor_are_clear_errors():
    torch = _torch_cuda()
    x = torch.zeros(1, 2, 8, 16, device="cuda")
    with pytest.raises(TypeError, match="scaled_dot_product_attention: .*cuda:0.*float32"):
        qkv.scaled_dot_product_attention(x, x, x)  # float32: the CUDA kernel takes bfloat16/float16
    b = torch.zeros(1, 2, 64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="dropout_p > 0 has no kernel on cuda:0"):
        qkv.scaled_dot_product_attention(b, b, b, dropout_p=0.1)
    with pytest.raises(ValueError, match="mods.*cuda:0"):
        qkv.scaled_dot_product_attention(b, b, b, mods=qkv.AttentionMods.sliding_window(8, 0))


@pytest.mark.cuda
@pytest.mark.parametrize("causal", [False, True])
def test_torch_cuda_backward_against_torch_autograd(causal):
    """qkv's GPU backward from its GPU forward's out and logsumexp (torch CUDA tensors in and out),
    against torch's autograd in float64 on the same values (the oracle), by FlashAttention's
    criterion: at most 2x the error of torch's own bf16 backward, plus its floor (2x the bf16
    rounding at the reference's values + 0.3). GQA 2:1, Lq != Lk, tiles that end mid-way."""
    torch = _torch_cuda()
    g = torch.Generator(device="cuda").manual_seed(11)
    q = torch.randn(2, 4, 200, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(2, 2, 170, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(2, 2, 170, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    dout = torch.randn(2, 4, 200, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    kw = dict(is_causal=causal, enable_gqa=True)
    out, lse = qkv.scaled_dot_product_attention(q, k, v, return_logsumexp=True, **kw)
    got = qkv.scaled_dot_product_attention_backward(q, k, v, out, dout, lse, **kw)
    assert_flash_grads(torch, got, q, k, v, dout, **kw)
