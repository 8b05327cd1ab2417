"""Threads, the GIL, the version and the error translation table of the qkv package."""
import pathlib
import re
import threading
import time

import numpy as np
import pytest

import qkv

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_version_is_the_cmake_project_version():
    cmake = (ROOT / "CMakeLists.txt").read_text()
    assert qkv.__version__ == re.search(r"project\(qkv VERSION ([0-9.]+)", cmake).group(1)


def test_num_threads_round_trips_and_rejects_zero():
    before = qkv.get_num_threads()
    try:
        qkv.set_num_threads(3)
        assert qkv.get_num_threads() == 3
        with pytest.raises(ValueError, match="0"):
            qkv.set_num_threads(0)
        assert qkv.get_num_threads() == 3
    finally:
        qkv.set_num_threads(before)


def test_gil_is_released_during_compute():
    """While one thread computes attention, another keeps running Python code."""
    rng = np.random.default_rng(30)
    q = rng.standard_normal((1, 2, 128, 64))
    k, v = rng.standard_normal((1, 2, 512, 64)), rng.standard_normal((1, 2, 512, 64))
    durations = []

    def work():
        t0 = time.perf_counter()
        qkv.attention_reference(q, k, v)
        durations.append(time.perf_counter() - t0)

    worker = threading.Thread(target=work)
    last, max_gap = time.perf_counter(), 0.0
    worker.start()
    while worker.is_alive():
        now = time.perf_counter()
        max_gap, last = max(max_gap, now - last), now
    worker.join()
    assert durations[0] > 0.05, "the computation is too short to tell"
    # Holding the GIL would stall this loop for the whole computation.
    assert max_gap < durations[0] / 2, f"main thread stalled {max_gap:.3f}s of a {durations[0]:.3f}s call"


@pytest.mark.parametrize(
    "kind, exception",
    [
        ("ShapeError", ValueError),
        ("ValueError", ValueError),
        ("FormatError", ValueError),
        ("DTypeError", TypeError),
        ("IndexError", IndexError),
        ("IOError", OSError),
        ("Error", RuntimeError),
    ],
)
def test_cpp_errors_become_python_exceptions_with_their_message(kind, exception):
    message = f"op: a {kind} about shapes [2, 3] and [4]"
    with pytest.raises(exception) as info:
        qkv._qkv._throw(kind, message)
    assert type(info.value) is exception
    assert str(info.value) == message


def test_public_api():
    expected = {"attention_reference", "scaled_dot_product_attention", "load", "save", "inspect",
                "set_num_threads", "get_num_threads"}
    assert expected <= set(dir(qkv))
    for name in expected:
        assert getattr(qkv, name).__doc__, f"qkv.{name} has no docstring"


def test_type_stubs_cover_the_extension_and_its_nn_submodule():
    # Installed beside _qkv as a stub package (python/CMakeLists.txt, nanobind stubgen -r).
    stubs = pathlib.Path(qkv.__file__).parent / "_qkv"
    init, nn = (stubs / "__init__.pyi").read_text(), (stubs / "nn.pyi").read_text()
    assert re.search(r"^from qkv\._qkv import (.*, )?nn as nn\b", init, re.M), init[:600]
    # qkv.dist's bindings (MPI builds; a stub of `available` alone otherwise) are a submodule too.
    assert re.search(r"^from qkv\._qkv import (.*, )?dist as dist\b", init, re.M)
    assert (stubs / "dist.pyi").exists()
    # qkv.cuda's runtime (python/src/bind_cuda.cc) too, in every build.
    assert re.search(r"^from qkv\._qkv import (.*, )?cuda as cuda\b", init, re.M)
    assert re.search(r"^def device_count\(\) -> int:", (stubs / "cuda.pyi").read_text(), re.M)
    assert re.search(r"^def einsum\(", init, re.M) and re.search(r"^def rearrange\(", init, re.M)
    assert re.search(r"^class SelfAttention:", nn, re.M) and re.search(r"^class LazyMultiHeadAttention:", nn, re.M)
    assert (pathlib.Path(qkv.__file__).parent / "py.typed").exists()
    # Every public function of the extension has its stub, with today's signature.
    for name in dir(qkv._qkv):
        if not name.startswith("_") and callable(getattr(qkv._qkv, name)) and not isinstance(
                getattr(qkv._qkv, name), type):
            assert re.search(rf"^def {name}\(", init, re.M), f"no stub for qkv.{name}"
    sdpa = re.search(r"^def scaled_dot_product_attention\(.*?\) ->", init, re.M | re.S).group(0)
    assert "return_weights: bool = False" in sdpa and "return_logsumexp: bool = False" in sdpa
