"""Read-only stays read-only: views qkv returns of read-only inputs (NumPy
writeable=False, np.load(mmap_mode='r'), read-only DLPack tensors) are NumPy arrays
with writeable=False, writes through them raise ValueError, and the source keeps
its values. Before, such views came back writable: a write into an mmap'ed file
opened read-only killed Python with SIGSEGV."""
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import qkv
from fake_torch import DLPackOnly


def read_only(a):
    a = np.array(a)
    a.flags.writeable = False
    return a


VIEWS = {
    "einsum_transpose": (lambda x: qkv.einsum("ij->ji", x), lambda a: a.T),
    "einsum_diagonal": (lambda x: qkv.einsum("ii->i", x), lambda a: np.diagonal(a)),
    "rearrange": (lambda x: qkv.rearrange(x, "a b -> b a"), lambda a: a.T),
    "rearrange_split": (lambda x: qkv.rearrange(x, "a (b c) -> a b c", c=1), lambda a: a[:, :, None]),
}


def assert_read_only_view(view, source, expected):
    assert np.shares_memory(view, source)  # a view, not a copy
    assert not view.flags.writeable
    with pytest.raises(ValueError, match="read-only"):
        view[(0,) * view.ndim] = 123.0
    with pytest.raises(ValueError, match="read-only"):
        view += 1
    np.testing.assert_array_equal(view, expected)


@pytest.mark.parametrize("op", VIEWS, ids=str)
def test_views_of_read_only_numpy_arrays_are_read_only(op):
    make, oracle = VIEWS[op]
    x = read_only(np.arange(9.0).reshape(3, 3))
    before = x.copy()
    assert_read_only_view(make(x), x, oracle(before))
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("op", VIEWS, ids=str)
def test_views_of_read_only_dlpack_producers_are_read_only(op):
    make, oracle = VIEWS[op]
    x = read_only(np.arange(9.0, dtype=np.float32).reshape(3, 3))
    before = x.copy()
    assert_read_only_view(make(DLPackOnly(x)), x, oracle(before))
    capsule = x.__dlpack__(max_version=(1, 0))  # a bare versioned capsule flagged read-only
    assert_read_only_view(make(capsule), x, oracle(before))
    np.testing.assert_array_equal(x, before)


@pytest.mark.parametrize("op", VIEWS, ids=str)
def test_views_of_writable_inputs_stay_writable(op):
    make, _ = VIEWS[op]
    x = np.arange(9.0).reshape(3, 3)
    for src in (x, DLPackOnly(x)):
        v = make(src)
        assert v.flags.writeable and np.shares_memory(v, x)
        v[(0,) * v.ndim] = 42.0
        assert x[0, 0] == 42.0


def test_computed_results_of_read_only_inputs_are_writable_copies():
    x = read_only(np.arange(6.0).reshape(2, 3))
    for r in (qkv.einsum("ij->i", x), qkv.rearrange(x, "a b -> (b a)"), qkv.reduce(x, "a b -> a", "sum")):
        assert r.flags.writeable and not np.shares_memory(r, x)
        r[0] = -1.0
    np.testing.assert_array_equal(x, np.arange(6.0).reshape(2, 3))


def test_broadcast_views_numpy_made_read_only_stay_read_only():
    x = np.broadcast_to(np.arange(3.0), (4, 3))  # writeable=False, zero strides
    v = qkv.rearrange(x, "a b -> b a")
    assert not v.flags.writeable and v.strides == (8, 0)


def test_writing_into_a_read_only_mmap_view_raises_instead_of_crashing(tmp_path):
    # In a child process: before the fix the write was a SIGSEGV, which would kill pytest.
    path = tmp_path / "x.npy"
    np.save(path, np.arange(6.0).reshape(2, 3))
    script = textwrap.dedent(
        f"""
        import numpy as np, qkv
        m = np.load({str(path)!r}, mmap_mode="r")
        for v in (qkv.rearrange(m, "a b -> b a"), qkv.einsum("ij->ji", m)):
            assert not v.flags.writeable
            try:
                v[0, 0] = 1
            except ValueError as e:
                print("ValueError:", e)
            else:
                raise SystemExit("write went through")
        print("values", np.load({str(path)!r}).ravel().tolist())
        """
    )
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr)
    assert r.stdout.count("ValueError: assignment destination is read-only") == 2, r.stdout
    assert "values [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]" in r.stdout
