"""Zero-copy array exchange between Python and qkv, checked by pointer identity.

qkv._qkv._roundtrip(x) converts x to a qkv::Tensor and the Tensor back to a NumPy
array with the same code every binding uses (python/src/tensor_convert.cc): the
result has x's address exactly when neither direction copied.
"""
import gc
import pathlib
import weakref

import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file

import qkv
from fake_torch import DLPackOnly, FakeTensor
from fake_torch import install as install_fake_torch
from oracles import data_ptr

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
