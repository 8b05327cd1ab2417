"""Ctrl-C stops a long qkv call: KeyboardInterrupt in Python, exit 130 from the CLI.

Each case starts a child process that runs a call taking many seconds, sends it SIGINT
once the call is under way, and measures the latency from the signal to the
KeyboardInterrupt (time.monotonic is one clock for every process on Linux). The issue
asks for 0.5 s; the assertion allows 2 s so that a loaded CI machine does not flake, and
the measured latency is printed (pytest -s shows it; docs/python.md quotes it). The
child then checks that qkv still computes correctly (against NumPy) and that a later
call is not stopped by the old interrupt.
"""
import os
import pathlib
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

LATENCY_BOUND_S = 2.0

# The child: prints READY right before the long call, then INTERRUPTED <monotonic time>
# when KeyboardInterrupt arrives, then OK when qkv works again afterwards.
# A process started in the background by a non-interactive shell (`make fresh-check &`,
# some CI runners) inherits SIGINT ignored, and Python then installs no handler, so the
# child restores Python's own first: the test is of qkv, not of how it was launched.
CHILD = textwrap.dedent("""
    import signal, sys, time
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import numpy as np
    import qkv

    def after():  # qkv is usable afterwards, and the old interrupt does not stop new calls
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((64, 32)), rng.standard_normal((32, 16))
        assert np.allclose(qkv.einsum("ij,jk->ik", a, b), a @ b)
        q = rng.standard_normal((1, 2, 8, 4))
        s = np.einsum("bhid,bhjd->bhij", q, q) / 2.0
        w = np.exp(s - s.max(-1, keepdims=True))
        want = np.einsum("bhij,bhjd->bhid", w / w.sum(-1, keepdims=True), q)
        assert np.allclose(qkv.attention_reference(q, q, q), want)
        print("OK", flush=True)

    def long_call():
        {call}

    args = {setup}
    print("READY", flush=True)
    start = time.monotonic()
    try:
        long_call()
        print("FINISHED", time.monotonic() - start, flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", time.monotonic(), flush=True)
    after()
""")

CASES = {
    # The float64 reference: single-threaded, 15.9 s at this shape on an idle machine.
    "attention_reference": ("[np.random.default_rng(1).standard_normal((1, 8, 1024, 64))]",
                            "qkv.attention_reference(args[0], args[0], args[0])"),
    # float64 sdpa: the fused kernel in double (~10 s at this shape on an idle 2-core machine),
    # polling between work items.
    "sdpa_float64": ("[np.random.default_rng(1).standard_normal((1, 8, 16384, 64))]",
                     "qkv.scaled_dot_product_attention(args[0], args[0], args[0])"),
    # A batched float64 GEMM einsum (OpenBLAS per batch entry): ~34 GFLOP (0.6 s for half of
    # it on an idle 2-core machine, hence SIGINT 0.3 s in).
    "einsum_gemm": ("[np.random.default_rng(1).standard_normal((128, 512, 512)) for _ in range(2)]",
                    "qkv.einsum('bij,bjk->bik', args[0], args[1])"),
    # A DIRECT einsum (a reduction, no pair to multiply): parallel_for chunks polling per
    # output row. A zero-stride view reads 10**10 elements from 800 kB.
    "einsum_direct": ("[np.broadcast_to(np.ones(100000), (100000, 100000))]", "qkv.einsum('ij->i', args[0])"),
    # einops' reduce kernel on the same view.
    "einops_reduce": ("[np.broadcast_to(np.ones(100000), (100000, 100000))]",
                      "qkv.reduce(args[0], 'i j -> i', 'sum')"),
}


def interrupt_child(script, delay_s=0.3):
    """Runs `script`, sends SIGINT `delay_s` after READY; returns (stdout lines, latency, signal time)."""
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout.readline().strip() == "READY", proc.stderr.read()
        time.sleep(delay_s)
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    lines = out.split("\n")
    return lines, sent, err


@pytest.mark.parametrize("case", sorted(CASES))
def test_sigint_raises_keyboard_interrupt_promptly(case):
    setup, call = CASES[case]
    lines, sent, err = interrupt_child(CHILD.format(setup=setup, call=call))
    assert not any(l.startswith("FINISHED") for l in lines), f"{case} finished before the signal: {lines}"
    got = [l for l in lines if l.startswith("INTERRUPTED")]
    assert got, (lines, err)
    latency = float(got[0].split()[1]) - sent
    print(f"\n{case}: KeyboardInterrupt {latency * 1000:.0f} ms after SIGINT")
    assert 0 <= latency < LATENCY_BOUND_S
    assert "OK" in lines, (lines, err)


def test_a_python_sigint_handler_still_runs():
    """The C handler chains to Python's: a user handler set with signal.signal runs too."""
    script = CHILD.format(setup="[np.random.default_rng(1).standard_normal((1, 8, 1024, 64))]",
                          call="qkv.attention_reference(args[0], args[0], args[0])")
    script = script.replace("import qkv\n", textwrap.dedent("""
        import qkv, signal
        seen = []
        def handler(sig, frame):
            seen.append(sig)
            raise KeyboardInterrupt("from the user's handler")
        signal.signal(signal.SIGINT, handler)
        """), 1).replace("after()\n", "after()\nprint('SEEN', seen, flush=True)\n")
    lines, _, err = interrupt_child(script)
    assert any(l.startswith("INTERRUPTED") for l in lines), (lines, err)
    assert "SEEN [2]" in lines, (lines, err)


def test_sigint_with_ignored_handler_does_not_stop_the_call():
    """signal.SIG_IGN means Ctrl-C is ignored: qkv does not install its handler then."""
    script = CHILD.format(setup="[np.random.default_rng(1).standard_normal((1, 2, 256, 16))]",
                          call="qkv.attention_reference(args[0], args[0], args[0])")
    script = script.replace("import qkv\n", "import qkv, signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n", 1)
    lines, _, err = interrupt_child(script, delay_s=0.0)
    assert any(l.startswith("FINISHED") for l in lines) and "OK" in lines, (lines, err)


def test_cli_exits_130_on_sigint(qkv_cli, tmp_path):
    q = np.random.default_rng(2).standard_normal((1, 8, 16384, 64))  # float64, fused: ~10 s, 67 MB
    np.save(tmp_path / "q.npy", q)
    proc = subprocess.Popen([qkv_cli, "attention", "--q", tmp_path / "q.npy", "--k", tmp_path / "q.npy", "--v",
                             tmp_path / "q.npy", "-o", tmp_path / "out.npy"], stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(1.5)  # loading done, the attention running
        assert proc.poll() is None, proc.stderr.read()
        sent = time.monotonic()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
        latency = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"\nqkv attention: exit {proc.returncode} {latency * 1000:.0f} ms after SIGINT")
    assert proc.returncode == 130, err
    assert "interrupted" in err
    assert latency < LATENCY_BOUND_S
    assert not (tmp_path / "out.npy").exists()
