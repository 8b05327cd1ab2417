"""Zero-copy array exchange between Python and qkv, checked by pointer identity.

qkv._qkv._roundtrip(x) converts x to a qkv::Tensor and the Tensor back to a NumPy
array with the same code every binding uses (python/src/tensor_convert.cc): the
result has x's address exactly when neither direction copied.
"""
import ctypes
import gc
import pathlib
import weakref

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

import qkv
from fake_cuda_dlpack import DLManagedTensor, DLManagedTensorVersioned, FakeCudaArray, kDLCPU
from fake_torch import DLPackOnly, FakeTensor
from fake_torch import install as install_fake_torch
from oracles import data_ptr, sdpa_float64

roundtrip = qkv._qkv._roundtrip
FIXTURES = pathlib.Path(__file__).resolve().parents[1] / "fixtures"


def assert_same_memory(x, y):
    assert data_ptr(y) == data_ptr(x)
    assert y.shape == x.shape and y.strides == x.strides and y.dtype == x.dtype


VIEWS = {
    "contiguous": lambda a: a,
    "transposed": lambda a: a.T,
    "sliced_step": lambda a: a[1:, ::2],
    "column": lambda a: a[:, 3],
    "broadcast_zero_strides": lambda a: np.broadcast_to(a[:1], (5, 6)),  # read-only
    "scalar_0d": lambda a: a[2, 2, ...],
    "empty": lambda a: a[:0],
}


@pytest.mark.parametrize("view", VIEWS, ids=str)
def test_numpy_views_cross_without_copy(view):
    x = VIEWS[view](np.arange(30, dtype=np.float32).reshape(5, 6))
    y = roundtrip(x)
    assert_same_memory(x, y)
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int8", "int32", "int64", "bool"])
def test_every_numpy_dtype_qkv_has_crosses_without_copy(dtype):
    x = (np.arange(12) % 3).astype(dtype).reshape(3, 4)
    y = roundtrip(x)
    assert_same_memory(x, y)
    np.testing.assert_array_equal(y, x)


def test_bfloat16_arrays_of_ml_dtypes_cross_without_copy():
    x = np.linspace(-2, 2, 12).astype(ml_dtypes.bfloat16).reshape(3, 4)[:, 1:]
    y = roundtrip(x)
    assert_same_memory(x, y)
    np.testing.assert_array_equal(y.astype(np.float32), x.astype(np.float32))


def test_result_is_writable_and_writes_reach_the_source():
    x = np.zeros((3, 4))
    y = roundtrip(x)
    assert y.flags.writeable
    y[1, 2] = 7.0
    assert x[1, 2] == 7.0


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: np.arange(12.0).reshape(3, 4)[::-1, ::-2], id="negative_strides"),
        pytest.param(lambda: np.zeros(6, dtype=[("a", "<f4"), ("b", "u1")])["a"], id="stride_not_itemsize_multiple"),
        pytest.param(lambda: np.arange(6, dtype=">f8"), id="big_endian"),
    ],
)
def test_non_native_layouts_are_copied(make):
    x = make()
    x_before = x.copy()
    if x.dtype.names is None and x.size:
        x[...] = np.arange(x.size).reshape(x.shape)
        x_before = x.copy()
    y = roundtrip(x)
    assert data_ptr(y) != data_ptr(x)
    assert y.dtype.isnative and all(s > 0 for s in y.strides)
    np.testing.assert_array_equal(y, x_before)


def test_array_likes_go_through_numpy_asarray():
    y = roundtrip([[1.0, 2.0], [3.0, 4.0]])
    assert y.dtype == np.float64 and y.shape == (2, 2)
    np.testing.assert_array_equal(y, [[1.0, 2.0], [3.0, 4.0]])


def test_tensor_keeps_the_numpy_source_alive_and_then_releases_it():
    x = np.arange(1000.0)
    source = weakref.ref(x)
    y = roundtrip(x[10:20])
    del x
    gc.collect()
    assert source() is not None, "the view must keep its source alive"
    np.testing.assert_array_equal(y, np.arange(10.0, 20.0))
    del y
    gc.collect()
    assert source() is None, "the source leaked"


def test_any_dlpack_producer_crosses_without_copy():
    x = np.arange(24, dtype=np.float32).reshape(2, 3, 4).transpose(2, 0, 1)
    assert_same_memory(x, roundtrip(DLPackOnly(x)))
    assert_same_memory(x, roundtrip(x.__dlpack__()))  # a bare DLPack capsule


def test_attention_reads_dlpack_producers():
    rng = np.random.default_rng(20)
    q, k, v = (rng.standard_normal(s) for s in ((2, 4, 8), (2, 6, 8), (2, 6, 3)))
    out = qkv.attention_reference(DLPackOnly(q), DLPackOnly(k), DLPackOnly(v))
    np.testing.assert_array_equal(out, qkv.attention_reference(q, k, v))


def test_results_are_numpy_arrays_over_qkv_storage():
    rng = np.random.default_rng(21)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 4, 8), (2, 6, 8), (2, 6, 3)))
    out, w = qkv.attention_reference(q, k, v, return_weights=True)
    del q, k, v
    gc.collect()
    for r in (out, w):
        assert type(r) is np.ndarray and r.flags.writeable and not r.flags.owndata
        assert data_ptr(r) % 64 == 0  # qkv's 64-byte-aligned storage, not a NumPy copy
        assert_same_memory(r, roundtrip(r))  # and back into qkv without a copy
        assert_same_memory(r, roundtrip(r.__dlpack__()))  # results are DLPack producers too
    out_ptr = data_ptr(out)
    del w
    gc.collect()
    assert data_ptr(out) == out_ptr and np.isfinite(out).all()


def test_torch_tensors_cross_without_copy_and_match_torch(monkeypatch):
    """torch parity from the committed fixture (tests/python/make_torch_interop_fixtures.py,
    torch's SDPA on its strided [B, H, L, D] views); the inputs cross as torch-typed
    DLPack producers (fake_torch: torch is not in .venv) and come back as such."""
    install_fake_torch(monkeypatch)
    f = load_file(str(FIXTURES / "torch_interop" / "sdpa_strided.safetensors"))
    q, k, v = (np.swapaxes(f[n], 1, 2) for n in ("q", "k", "v"))  # the strided views torch used
    t = FakeTensor(q)
    assert_same_memory(q, roundtrip(t))  # a torch-typed producer crosses without a copy
    out = qkv.scaled_dot_product_attention(t, FakeTensor(k), FakeTensor(v), is_causal=True)
    assert isinstance(out, FakeTensor)
    np.testing.assert_allclose(out.array, f["out_causal"], rtol=0, atol=1e-12)
    out = qkv.scaled_dot_product_attention(t, k, v, attn_mask=f["mask"])
    assert isinstance(out, FakeTensor)
    np.testing.assert_allclose(out.array, f["out_mask"], rtol=0, atol=1e-12)


def _misaligned(dtype):
    """A writable array whose data start one byte past an itemsize boundary."""
    x = np.arange(1, 7, dtype=dtype)
    raw = bytearray(b"\0" + x.tobytes())
    return np.frombuffer(raw, dtype=dtype, offset=1)


def _negative_capsule():
    x = np.arange(12.0, dtype=np.float32).reshape(3, 4)[:, ::-1]
    return x.__dlpack__(), x


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda: DLPackOnly(np.arange(12.0).reshape(3, 4)[::-1, ::-2]), id="negative_strides_producer"),
        pytest.param(_negative_capsule, id="negative_strides_capsule"),
        pytest.param(lambda: DLPackOnly(_misaligned(np.float32)), id="misaligned_float32"),
        pytest.param(lambda: DLPackOnly(_misaligned(np.float64)[::2]), id="misaligned_float64_strided"),
        pytest.param(lambda: DLPackOnly(_misaligned(np.int32).reshape(2, 3)[:, ::-1]), id="misaligned_negative"),
    ],
)
def test_dlpack_layouts_numpy_never_passes_are_copied(make):
    """Negative strides and data off the itemsize's alignment, from a DLPack producer that is
    not a NumPy array (torch.frombuffer at an odd offset is one): qkv's kernels take neither,
    so they cross as an aligned C-order copy with the same values. Before, a negative stride
    was copied with np.array(producer), an object array ('got ndarray of dtype object'), and
    misaligned data crossed as they were."""
    made = make()
    src, source = made if isinstance(made, tuple) else (made, made.array)
    expected = source.copy()
    y = roundtrip(src)
    assert y.dtype == expected.dtype and y.shape == expected.shape
    assert y.flags.c_contiguous and y.flags.aligned and y.flags.writeable
    np.testing.assert_array_equal(y, expected)
    assert data_ptr(y) != data_ptr(source)
    y[...] = 0  # a copy: the producer's memory keeps its values
    np.testing.assert_array_equal(source, expected)


def test_a_dlpack_producers_refusal_is_quoted():
    """numpy's __dlpack__ refuses big-endian data; the TypeError says so instead of only
    'expected an array ... of a dtype qkv supports, got fake_torch.DLPackOnly'."""
    with pytest.raises(TypeError, match=r"_roundtrip: .*DLPackOnly \(its __dlpack__ refused: BufferError: .*byte order"):
        roundtrip(DLPackOnly(np.arange(3, dtype=">f4")))


class _FakeNegView(FakeTensor):
    """torch's lazy negation (x.conj().imag, x._neg_view()): the values are minus the memory's,
    and torch's __dlpack__ exports the memory without the negation (torch 2.x)."""

    __module__ = "torch"

    def is_neg(self):
        return True

    def resolve_neg(self):
        return FakeTensor(-self.array)


def test_torch_negative_bit_views_are_resolved(monkeypatch):
    install_fake_torch(monkeypatch)
    x = np.arange(1.0, 7.0).reshape(2, 3)
    out = qkv.einsum("ij->ji", _FakeNegView(x))
    np.testing.assert_array_equal(out.array, -x.T)


# ---- 16-bit floats through DLPack on the CPU ---------------------------------------------
# NumPy exports no bfloat16 through DLPack (ml_dtypes.bfloat16: "DLPack only supports ...")
# and torch is not in .venv, so a ctypes producer (fake_cuda_dlpack.FakeCudaArray.on_host)
# exports real host memory as kDLBfloat 16 / kDLFloat 16, as torch's CPU tensors do; real
# torch tensors: test_qkv_torch.py.

HALF_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
DL_CODES = {"bfloat16": (4, 16), "float16": (2, 16), "uint16": (1, 16)}  # dlpack.h (kDLBfloat, kDLFloat, kDLUInt)


class _TorchTypedHostArray(FakeCudaArray):
    __module__ = "torch"  # qkv answers torch-typed arguments with torch.from_dlpack (fake_torch here)


def _half(dtype, shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(HALF_DTYPES[dtype])


_capsule_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_capsule_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.py_object, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))


def _capsule_tensor(capsule):
    """(address of element [0, ..., 0], (type code, bits), device type) of a DLPack capsule, read with ctypes."""
    for name, managed in ((b"dltensor_versioned", DLManagedTensorVersioned), (b"dltensor", DLManagedTensor)):
        if _capsule_is_valid(capsule, name):
            t = managed.from_address(_capsule_pointer(capsule, name)).dl_tensor
            return t.data + t.byte_offset, (t.dtype.code, t.dtype.bits), t.device.device_type
    raise AssertionError(f"not a DLPack capsule: {capsule!r}")


@pytest.mark.parametrize("versioned", [True, False], ids=["dlpack1", "dlpack0"])
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_dlpack_producers_cross_in_without_copy(dtype, versioned):
    """A CPU kDLBfloat / kDLFloat 16-bit tensor (a strided view, as torch's transpose gives)
    becomes a qkv tensor at the producer's address, with its strides and dtype; the result
    is a NumPy array over that memory (writes go both ways); qkv releases the capsule after."""
    memory = _half(dtype, (4, 6))
    x = memory[:, 1:].T  # strides (1, 6) elements, not C order
    producer = FakeCudaArray.on_host(x, versioned=versioned)
    described = qkv._qkv.cuda._describe(producer)
    assert described["data_ptr"] == data_ptr(x) and described["dtype"] == dtype
    assert described["shape"] == x.shape and described["strides"] == (1, 6) and not described["read_only"]
    y = roundtrip(producer)
    assert y.dtype == HALF_DTYPES[dtype]
    assert_same_memory(x, y)
    np.testing.assert_array_equal(y.astype(np.float32), x.astype(np.float32))
    y[2, 1] = 7.0
    assert memory[1, 3] == 7.0
    memory[3, 1] = -5.0
    assert y[0, 3] == -5.0
    assert_same_memory(x, roundtrip(producer.__dlpack__()))  # a bare capsule: nanobind's own import
    deleted = producer.deleted
    del y
    gc.collect()
    assert producer.deleted == deleted + 1, "qkv must release the producer's capsule"


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_dlpack_byte_offset_and_read_only_flag_are_kept(dtype):
    memory = _half(dtype, (3, 5), seed=1)
    producer = FakeCudaArray((2, 5), dtype, device=(kDLCPU, 0), memory=memory, byte_offset=5 * memory.itemsize,
                             read_only=True)
    y = roundtrip(producer)
    assert data_ptr(y) == data_ptr(memory[1:]) and not y.flags.writeable
    np.testing.assert_array_equal(y.astype(np.float32), memory[1:].astype(np.float32))


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_half_results_go_out_through_dlpack_at_the_same_address(dtype):
    """Out: a 16-bit result over the producer's memory exports that address through DLPack.
    float16 NumPy results do so themselves; NumPy refuses ml_dtypes.bfloat16, so bfloat16 goes
    out as its uint16 bits (what qkv hands torch.from_dlpack, then viewed as torch.bfloat16)."""
    x = _half(dtype, (3, 4), seed=2)[:, ::2]
    producer = FakeCudaArray.on_host(x)
    y = roundtrip(producer)
    assert_same_memory(x, y)
    if dtype == "float16":
        assert _capsule_tensor(y.__dlpack__()) == (data_ptr(x), DL_CODES["float16"], kDLCPU)
        assert _capsule_tensor(y.__dlpack__(max_version=(1, 0))) == (data_ptr(x), DL_CODES["float16"], kDLCPU)
        back = np.from_dlpack(y)
    else:
        with pytest.raises(BufferError):
            y.__dlpack__()
        assert _capsule_tensor(y.view(np.uint16).__dlpack__()) == (data_ptr(x), DL_CODES["uint16"], kDLCPU)
        back = np.from_dlpack(y.view(np.uint16)).view(ml_dtypes.bfloat16)
    assert_same_memory(x, back)


@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_torch_typed_half_producers_come_back_as_torch_over_the_same_memory(dtype, monkeypatch):
    """A torch-typed 16-bit producer gives a torch-typed result made by torch.from_dlpack over
    qkv's view of the producer's memory (fake_torch's from_dlpack is NumPy's): no copy either way."""
    install_fake_torch(monkeypatch)
    x = _half(dtype, (5, 4), seed=3).T
    producer = _TorchTypedHostArray.on_host(x)
    out = qkv._qkv.cuda._roundtrip(producer)
    assert isinstance(out, FakeTensor) and out.array.dtype == HALF_DTYPES[dtype]
    assert_same_memory(x, out.array)
    out = qkv.rearrange(producer, "a b -> b a")  # a view through the public API, torch in, torch out
    assert isinstance(out, FakeTensor)
    assert_same_memory(x.T, out.array)


def _half_ulp(x, dtype):
    """Half an ulp of float16/bfloat16 at |x| (subnormals included), as test_py_attention.py."""
    fraction_bits, min_exponent = {"float16": (10, -14), "bfloat16": (7, -126)}[dtype]
    binade = np.floor(np.log2(np.maximum(np.abs(x), 2.0**min_exponent)))
    return 2.0 ** (binade - fraction_bits - 1)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_attention_on_half_dlpack_producers_matches_float64(dtype, causal):
    """scaled_dot_product_attention on kDLBfloat / kDLFloat producers ([B, L, H, D] memory seen
    as [B, H, L, D], torch's layout) against numpy float64 SDPA on the same 16-bit values, within
    docs/testing.md's bf16 / f16 bound: half an ulp at each expected value + 1e-6 x scale, plus
    the fused kernel's P rounding on native 16-bit tiles (half an ulp of 1 x max|v|, twice)."""
    q, k, v = (_half(dtype, s, seed=i).swapaxes(1, 2) for i, s in enumerate(((2, 24, 3, 16), (2, 40, 3, 16),
                                                                             (2, 40, 3, 8))))
    producers = [FakeCudaArray.on_host(a) for a in (q, k, v)]
    out = qkv.scaled_dot_product_attention(*producers, is_causal=causal)
    assert out.dtype == HALF_DTYPES[dtype] and out.shape == (2, 3, 24, 8)
    want = sdpa_float64(q, k, v, causal=causal)[0]
    v_max = np.abs(v.astype(np.float64)).max()
    tol = _half_ulp(want, dtype) + 1e-6 * np.abs(want).max() + 2 * _half_ulp(1.0, dtype) * v_max
    err = np.abs(out.astype(np.float64) - want)
    assert np.all(err <= tol), f"max error {err.max():.3g}, tolerance {tol.min():.3g}..{tol.max():.3g}"
    assert [p.deleted for p in producers] == [1, 1, 1]  # read in place, then released
