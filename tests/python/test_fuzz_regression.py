"""Inputs the atheris harness (fuzz/python/api_fuzzer.py) found to misbehave, one test
per finding; docs/testing.md lists the fuzz runs."""
import numpy as np

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
