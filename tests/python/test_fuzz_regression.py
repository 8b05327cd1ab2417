"""Inputs the atheris harness (fuzz/python/api_fuzzer.py) found to misbehave, one test
per finding; docs/testing.md lists the fuzz runs."""
import numpy as np
import pytest

import qkv


def misaligned(values, dtype):
    """A C-contiguous array whose data starts one byte into a buffer (np.frombuffer at an odd offset)."""
    dtype = np.dtype(dtype)
    raw = np.zeros(values.size * dtype.itemsize + 1, np.uint8)
    out = np.frombuffer(raw.data, dtype, count=values.size, offset=1).reshape(values.shape)
    out[...] = values
    return out


def test_misaligned_inputs_are_read_from_an_aligned_copy():
    # UBSan: "load of misaligned address ... for type 'const double'" in qkv's copy kernel:
    # the array was viewed in place. Now qkv views an aligned copy, so results (views
    # included) are aligned and never alias the misaligned buffer.
    for dtype in (np.float64, np.float32, np.int32):
        x = misaligned(np.arange(12).reshape(3, 4), dtype)
        assert not x.flags.aligned
        r = qkv.rearrange(x, "a b -> b a")  # a view of the input when it can be
        np.testing.assert_array_equal(r, x.T)
        assert r.flags.aligned and not np.shares_memory(r, x)
        np.testing.assert_array_equal(qkv.einsum("ij,jk->ik", x, x.T), x.astype(np.float64) @ x.T)


def test_results_numpy_cannot_hold_get_a_qkv_error():
    # UBSan: "signed integer overflow: 4 * 4611686018427387904" in nanobind's buffer export of
    # unpack's [2^62, 0] piece (fuzz input AE1Bko6WJpJAkjN93g==). NumPy refuses such an array
    # ("array is too big": itemsize times the non-zero dims passes 2^63 - 1, a 0 dim aside),
    # so qkv says so before nanobind multiplies.
    with pytest.raises(ValueError, match=r"to_numpy: a float32 result of shape \[4611686018427387904, 0\] is too big"):
        qkv.einops.unpack(np.ones(1, np.float32), [[1], [2**62, -1]], "*")
    with pytest.raises(ValueError, match=r"\[2, 0, 2305843009213693952\] is too big for NumPy"):
        qkv.repeat(np.ones((2, 0), np.float32), "h w -> h w c", c=2**61)  # 2^62 elements: within qkv's limit
    # Within NumPy's limit an empty result still comes back (4 * 2 * 2^59 = 2^62 bytes' worth of dims).
    assert qkv.repeat(np.ones((2, 0), np.float32), "h w -> h w c", c=2**59).shape == (2, 0, 2**59)


@pytest.mark.parametrize("call", [
    lambda x: qkv.rearrange(x, "a b\udcff -> a"),
    lambda x: qkv.rearrange(x, "a b -> a b", **{"c\udcff": 2}),
    lambda x: qkv.einsum("ij\udcff", x),
    lambda x: qkv.einsum("ij", x, optimize="gr\udcffeedy"),
    lambda x: qkv.save("/tmp/unused.safetensors", {"a\udcff": x}),
])
def test_lone_surrogates_are_a_value_error(call):
    # A str with a lone surrogate (what os.fsdecode makes of a non-UTF-8 byte) has no UTF-8
    # form: its conversion threw std::bad_cast, a RuntimeError without the argument's name.
    # Python's own encoder refuses it the same way.
    with pytest.raises(UnicodeEncodeError):
        "\udcff".encode("utf-8")
    with pytest.raises(ValueError, match="lone surrogate"):
        call(np.zeros((2, 3), np.float32))
